"""``[tool.substrax.compute]``: a project's backends and jobs, read strictly from pyproject.toml.

Every refusal names the TOML path of the offending key::

    tool.substrax.compute.jobs.demo.resources.cpu: must be positive and finite, got -1

Example:
    >>> from substrax.compute._config import parse_compute_config
    >>> config = parse_compute_config(
    ...     {"jobs": {"demo": {"commands": {"hi": ["python", "-c", "print(1)"]}, "timeout_seconds": 60}}}
    ... )
    >>> config.jobs["demo"].timeout_seconds
    60.0
"""

import json
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Protocol, Self, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from ._backend import backend_state_dir
from ._environment import env_conflict
from ._errors import (
    ComputeConfigError,
    ComputeTableMissingError,
    ConfigFileError,
    JobNotFoundError,
    ProjectFileNotFoundError,
    SubstraxNotLockedError,
)
from ._registry import unknown_backend_tables
from ._spec import (
    STOP_GRACE_SECONDS,
    Accelerator,
    JobSpec,
    Mount,
    Record,
    Resources,
    Task,
    check_unique,
    example_tasks,
    jax_runtime,
)
from ._spec_checks import check_task_name, distinct_tasks
from ._spec_types import Argv, Component, EnvName, EnvValue, NodeCount, Positive, RelativeFile
from ._toml import ROOT_PATH, read_toml, reason, toml_kind, toml_path


def _inside(value: str) -> str:
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts:
        raise ValueError("must be a directory relative to the project, without '..'")
    return value


class JobConfig(Record):
    """One ``[tool.substrax.compute.jobs.<name>]`` table, as written."""

    examples: tuple[Annotated[str, AfterValidator(_inside)], ...] = ()
    commands: dict[Component, Argv] = Field(default_factory=dict)
    timeout_seconds: Positive
    task_timeout_seconds: Positive | None = None
    extras: tuple[Component, ...] = ()
    resources: Resources = Resources()
    accelerator: Accelerator | None = None
    runtime: dict[str, JsonValue] = Field(default_factory=dict)
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    secrets: tuple[EnvName, ...] = ()
    mounts: tuple[Mount, ...] = ()
    nodes: NodeCount = 1
    probe_devices: bool = True
    include_files: tuple[RelativeFile, ...] = ()
    stop_grace_seconds: Positive = STOP_GRACE_SECONDS

    @field_validator("commands")
    @classmethod
    def _command_names(cls, commands: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for name in commands:
            check_task_name(name)
        return commands

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.examples and not self.commands:
            raise ValueError("a job needs `examples` directories or `commands` to run")
        if self.accelerator is not None and self.resources.accelerator is not None:
            raise ValueError("set `accelerator` or `resources.accelerator`, not both")
        if (
            self.task_timeout_seconds is not None
            and self.task_timeout_seconds > self.timeout_seconds
        ):
            raise ValueError("`task_timeout_seconds` must not exceed the job's `timeout_seconds`")
        check_unique(
            tasks=list(self.commands), mounts=self.mounts, secrets=self.secrets, env=self.env
        )
        return self

    @property
    def requested_resources(self) -> Resources:
        """The resources with a job-level ``accelerator`` folded in."""
        if self.accelerator is None:
            return self.resources
        return self.resources.model_copy(update={"accelerator": self.accelerator})


class ComputeConfig(Record):
    """The whole ``[tool.substrax.compute]`` table."""

    backend: Component | None = None
    backends: dict[Component, dict[str, JsonValue]] = Field(default_factory=dict)
    jobs: dict[Component, JobConfig] = Field(default_factory=dict)


def parse_compute_config(table: Mapping[str, Any]) -> ComputeConfig:
    """Validate a ``[tool.substrax.compute]`` table already read from TOML.

    Raises:
        ComputeConfigError: Every unknown key and bad value, each with its TOML path.

    Example:
        >>> from substrax.compute._config import parse_compute_config
        >>> parse_compute_config({"backend": "local", "colour": "red"})
        Traceback (most recent call last):
        ...
        substrax.compute.ComputeConfigError: tool.substrax.compute.colour: unknown key; allowed keys: backend, backends, jobs
    """
    try:
        config = ComputeConfig.model_validate_json(json.dumps(table, default=str), strict=True)
    except ValidationError as error:
        problems = [(toml_path(e["loc"]), reason(e, ComputeConfig)) for e in error.errors()]
        raise ComputeConfigError(problems) from None
    problems = unknown_backend_tables(config.backends)
    for name, job in config.jobs.items():
        path = toml_path(("jobs", name, "runtime"))
        try:
            runtime = jax_runtime(job.runtime)
        except ValueError as error:
            text = str(error)
            field = next(
                (k for k in job.runtime if any(n in text for n in (f".{k} ", f".{k}=", f"{k!r}"))),
                None,
            )
            if field is None and "XLA flag" in text and "xla_flags" in job.runtime:
                field = "xla_flags"
            problems.append((f"{path}.{field}" if field else path, text))
            continue
        conflict = env_conflict(name, job.env, runtime=runtime, nodes=job.nodes, configured=True)
        if conflict is not None:  # refused here, not once a cluster runs its first task
            variable = getattr(conflict, "variable", None)  # an EnvironmentConflictError's
            where = ("jobs", name, "env", *([variable] if variable in job.env else []))
            problems.append((toml_path(where), str(conflict)))
    if problems:
        raise ComputeConfigError(problems)
    return config


def parse_backend_settings[M: BaseModel](
    model: type[M], name: str, settings: Mapping[str, Any]
) -> M:
    """Validate a backend's settings table with ``model``; refusals name their TOML path.

    Raises:
        ComputeConfigError: A key is unknown or a value is bad.

    Example:
        >>> from substrax.compute._config import Record, parse_backend_settings
        >>> class S(Record):
        ...     region: str
        >>> parse_backend_settings(S, "mine", {})
        Traceback (most recent call last):
        ...
        substrax.compute.ComputeConfigError: tool.substrax.compute.backends.mine.region: is required
    """
    try:
        return model.model_validate_json(json.dumps(dict(settings), default=str), strict=True)
    except ValidationError as error:
        prefix = f"{ROOT_PATH}.backends.{name}"
        problems = [(toml_path(e["loc"], prefix), reason(e, model)) for e in error.errors()]
        raise ComputeConfigError(problems) from None


class _BackendSettings(Protocol):
    state_dir: str | None


def read_backend_settings[M: BaseModel](
    model: type[M], name: str, settings: Mapping[str, JsonValue] | None
) -> tuple[dict[str, JsonValue], M, Path]:
    """A backend's settings table as given, validated with ``model``, and its state directory.

    ``model`` has a ``state_dir`` setting; without one, the directory is
    ``<state>/compute/<name>``.

    Raises:
        ComputeConfigError: A key is unknown or a value is bad (:func:`parse_backend_settings`).

    Example:
        >>> from substrax.compute._config import Record, read_backend_settings
        >>> class S(Record):
        ...     state_dir: str | None = None
        >>> raw, parsed, state_dir = read_backend_settings(S, "mine", {"state_dir": "/tmp/s"})
        >>> raw, state_dir.as_posix()
        ({'state_dir': '/tmp/s'}, '/tmp/s')
    """
    raw = dict(settings or {})
    parsed = parse_backend_settings(model, name, raw)
    return raw, parsed, backend_state_dir(cast("_BackendSettings", parsed).state_dir, name)


def read_compute_config(project: Path | str) -> ComputeConfig:
    """Read ``[tool.substrax.compute]`` from ``project/pyproject.toml``.

    Raises:
        ProjectFileNotFoundError: The project has no pyproject.toml.
        ConfigFileError: pyproject.toml is not valid TOML (the message names file, line, column).
        ComputeTableMissingError: It has no ``[tool.substrax.compute]`` table.
        ComputeConfigError: A key is unknown or a value is bad (the message names its path).

    Example:
        >>> from pathlib import Path
        >>> from substrax.compute import read_compute_config
        >>> read_compute_config(Path("/nonexistent"))
        Traceback (most recent call last):
        ...
        substrax.compute.ProjectFileNotFoundError: no pyproject.toml in /nonexistent: run from the project root or pass --project
    """
    pyproject = Path(project) / "pyproject.toml"
    if not pyproject.is_file():
        raise ProjectFileNotFoundError(
            pyproject,
            f"no pyproject.toml in {project}: run from the project root or pass --project",
        )
    table: Any = read_toml(pyproject)
    for depth, key in enumerate(ROOT_PATH.split(".")):
        if not isinstance(table, dict):
            where = ".".join(ROOT_PATH.split(".")[:depth])
            msg = f"`{where}` must be a table, not {toml_kind(table)}; make it a [{where}] table"
            raise ConfigFileError(pyproject, msg, malformed=True)
        table = cast("dict[str, Any]", table).get(key)
        if table is None:
            raise ComputeTableMissingError(pyproject, ROOT_PATH)
    try:
        return parse_compute_config(table)
    except ComputeConfigError as error:
        raise ComputeConfigError(error.problems, source=pyproject) from None


def resolve_job(
    config: ComputeConfig,
    name: str,
    *,
    project: Path,
    accelerator: Accelerator | None = None,
) -> JobSpec:
    """Turn a configured job into the spec the worker runs (examples first, then commands).

    Raises:
        JobNotFoundError: No job of that name; the message lists the configured ones.
        ProjectFileNotFoundError: An examples directory does not exist or holds no script, or a name in
            ``include_files`` is not a file in the project.

    Example:
        >>> from pathlib import Path
        >>> from substrax.compute import resolve_job
        >>> from substrax.compute._config import parse_compute_config
        >>> config = parse_compute_config(
        ...     {"jobs": {"j": {"commands": {"hi": ["python", "-V"]}, "timeout_seconds": 9}}}
        ... )
        >>> [t.name for t in resolve_job(config, "j", project=Path(".")).tasks]
        ['hi']
    """
    job = config.jobs.get(name)
    if job is None:
        raise JobNotFoundError(name, sorted(config.jobs), ROOT_PATH)
    where = toml_path(("jobs", name))
    task_timeout = job.task_timeout_seconds or job.timeout_seconds
    tasks: list[tuple[Task, str, str]] = []  # each task, the TOML path that made it, and what
    if job.examples:
        from substrax.examples import discover_examples  # noqa: PLC0415

        for index, directory in enumerate(job.examples):
            root = project / directory
            if not root.is_dir():
                raise ProjectFileNotFoundError(
                    root, f"{where}.examples: directory {directory!r} is not in {project}"
                )
            scripts = discover_examples(root)
            if not scripts:
                raise ProjectFileNotFoundError(
                    root, f"{root} holds no example script (*.py); add one or fix `examples`"
                )
            try:
                made = example_tasks(scripts, project=project, timeout_seconds=task_timeout)
            except ValueError as error:
                raise ComputeConfigError([(f"{where}.examples[{index}]", str(error))]) from None
            tasks += [(t, f"{where}.examples[{index}]", f"example {t.argv[1]}") for t in made]
    for included in job.include_files:
        if not (project / included).is_file():
            raise ProjectFileNotFoundError(
                project / included,
                f"{where}.include_files: {included!r} is not a file in {project}",
            )
    tasks += [
        (
            Task(name=task, argv=argv, timeout_seconds=task_timeout),
            toml_path(("jobs", name, "commands", task)),
            f"command {task!r}",
        )
        for task, argv in job.commands.items()
    ]
    resources = job.requested_resources
    if accelerator is not None:
        resources = resources.model_copy(update={"accelerator": accelerator})
    return JobSpec(
        name=name,
        tasks=distinct_tasks(tasks),
        timeout_seconds=job.timeout_seconds,
        resources=resources,
        extras=job.extras,
        runtime=job.runtime,
        env=job.env,
        secrets=job.secrets,
        mounts=job.mounts,
        nodes=job.nodes,
        probe_devices=job.probe_devices,
        include_files=job.include_files,
        stop_grace_seconds=job.stop_grace_seconds,
    )


def _lock_packages(lock: Path) -> list[dict[str, Any]]:
    """The ``[[package]]`` tables of ``lock``, refused unless each is a table.

    Raises:
        ConfigFileError: ``lock`` is not valid TOML, or ``package`` is not an array of tables.
    """
    packages: object = read_toml(lock).get("package", [])
    if not isinstance(packages, list):
        what, shown = "`package` must be an array of tables ([[package]])", packages
    else:
        entries = cast("list[object]", packages)
        index = next((i for i, p in enumerate(entries) if not isinstance(p, dict)), None)
        if index is None:
            return cast("list[dict[str, Any]]", entries)
        what, shown = f"`package[{index}]` must be a table", entries[index]
    msg = f"{what}, not {toml_kind(shown)}; run `uv lock` to rewrite the file"
    raise ConfigFileError(lock, msg, malformed=True)


def require_locked_substrax(project: Path) -> str:
    """The substrax-compute version the project's ``uv.lock`` pins (``"editable"`` for a path).

    Raises:
        ProjectFileNotFoundError: The project has no uv.lock (run ``uv lock``).
        ConfigFileError: uv.lock is not valid TOML, or not the shape uv writes (a ``package``
            that is no array of tables, a ``source`` that is no table).
        SubstraxNotLockedError: substrax-compute is not in the lock (``uv add substrax-compute``).

    Example:
        >>> from pathlib import Path
        >>> from substrax.compute._config import require_locked_substrax
        >>> require_locked_substrax(Path("/nonexistent"))
        Traceback (most recent call last):
        ...
        substrax.compute.ProjectFileNotFoundError: no uv.lock in /nonexistent: run `uv lock` so the job runs what you tested
    """
    lock = project / "uv.lock"
    if not lock.is_file():
        raise ProjectFileNotFoundError(
            lock, f"no uv.lock in {project}: run `uv lock` so the job runs what you tested"
        )
    packages = _lock_packages(lock)
    for wanted in ("substrax-compute", "substrax"):
        for index, package in enumerate(packages):
            if package.get("name") == wanted:
                source: object = package.get("source", {})
                if not isinstance(source, dict):
                    msg = (
                        f"`package[{index}].source` ({wanted}) must be a table, not "
                        f"{toml_kind(source)}; run `uv lock` to rewrite the file"
                    )
                    raise ConfigFileError(lock, msg, malformed=True)
                if {"editable", "path", "directory", "virtual"} & set(
                    cast("dict[str, Any]", source)
                ):
                    return "editable"
                return str(package.get("version", "unknown"))
    raise SubstraxNotLockedError(lock)
