"""The job spec: the one record a backend hands to the worker, strict and versioned.

The field validators (the types of ``_spec_types``, the checks of ``_spec_checks``) raise plain
``ValueError``, as pydantic asks: pydantic gathers them into one ``ValidationError``, which the
config reader turns into ``ComputeConfigError`` with paths.

Example:
    >>> from substrax.compute import JobSpec, Task, read_job_spec
    >>> spec = JobSpec(
    ...     name="demo",
    ...     tasks=(Task(name="hello", argv=("python", "-c", "print(1)"), timeout_seconds=60),),
    ...     timeout_seconds=120,
    ... )
    >>> read_job_spec(spec.model_dump(mode="json")) == spec
    True
"""

import json
from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    field_validator,
    model_validator,
)

from ._environment import env_conflict
from ._errors import AcceleratorFormatError, RuntimeFieldError, UnknownPlatformError
from ._run_errors import RecordVersionError
from ._spec_checks import check_unique
from ._spec_types import (
    MAX_ACCELERATORS,
    AcceleratorCount,
    Argv,
    Component,
    EnvName,
    EnvValue,
    MemoryMiB,
    MountPath,
    NodeCount,
    Positive,
    RelativeFile,
)


if TYPE_CHECKING:
    from substrax.runtime import JaxRuntime


JOB_SPEC_VERSION = 4
STOP_GRACE_SECONDS = 30.0
"""A stopped task's default time between its SIGTERM and its SIGKILL (``stop_grace_seconds``).

Long enough for a node whose peer died to notice it through jax's heartbeats (10 s by default),
run its ``on_peer_failure`` hook (at most 10 s) and flush its logs.
"""
"""The version of the job spec this release writes and reads (4 added ``include_files``)."""

KNOWN_PLATFORMS: tuple[str, ...] = ("cpu", "cuda", "rocm", "tpu", "gpu", "oneapi", "proxy", "METAL")
"""The ``JAX_PLATFORMS`` names jax 0.12 knows (``jax._src.xla_bridge.known_platforms()`` before
any plugin loads) and jax-metal's ``METAL``; kept here so that compute never imports jax."""


class MountAccess(StrEnum):
    """How a job mount is attached: read-only (the default) or read-write.

    Each member equals its string, so a ``Mount`` (and pyproject.toml) takes either form. Only
    Modal enforces read-only (the volume's ``read_only()`` view: a write fails). SkyPilot mounts
    a read-only bucket in its ``MOUNT`` mode, which takes writes (they reach the bucket), and a
    read-write one ``MOUNT_CACHED``; the local backend gives the task the directory itself.

    Example:
        >>> from substrax.compute import Mount, MountAccess
        >>> Mount(name="out", path="/scratch", access="read-write").access is MountAccess.READ_WRITE
        True
        >>> MountAccess.READ_ONLY == "read-only"
        True
    """

    READ_ONLY = "read-only"
    READ_WRITE = "read-write"


class Record(BaseModel):
    """Base of every compute record: strict, frozen, unknown fields refused."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    def replace(self, **changes: Any) -> Self:  # noqa: ANN401 - any field's value
        """A copy with ``changes``, validated again (where 0.1.22 took ``dataclasses.replace``).

        Raises:
            ValueError: A change is refused (pydantic's ``ValidationError`` names the field).

        Example:
            >>> from substrax.compute import Task
            >>> Task(name="t", argv=("python",), timeout_seconds=5).replace(name="u").name
            'u'
        """
        return self.model_validate({**dict(self), **changes})


class Accelerator(Record):
    """An accelerator request: a kind as the provider names it and how many.

    Example:
        >>> from substrax.compute import Accelerator
        >>> Accelerator(kind="H100", count=8).label
        'H100:8'
    """

    kind: Component
    count: AcceleratorCount = 1

    @property
    def label(self) -> str:
        """``KIND:N``, the form Modal and SkyPilot read."""
        return f"{self.kind}:{self.count}"


def parse_accelerator(text: str) -> Accelerator:
    """Read ``KIND`` or ``KIND:N`` (the ``--accelerator`` option).

    Raises:
        AcceleratorFormatError: The text is not ``KIND[:N]`` with ``N`` a positive integer.

    Example:
        >>> from substrax.compute import parse_accelerator
        >>> parse_accelerator("H100:8")
        Accelerator(kind='H100', count=8)
    """
    kind, sep, count = text.partition(":")
    digits = count.isascii() and count.isdigit() and len(count) <= len(str(MAX_ACCELERATORS))
    if sep and not (digits and 1 <= int(count) <= MAX_ACCELERATORS):
        raise AcceleratorFormatError(text)
    try:
        return Accelerator(kind=kind, count=int(count) if sep else 1)
    except ValueError:  # pydantic's, about the kind
        raise AcceleratorFormatError(text) from None


class Mount(Record):
    """A named volume or bucket seen by every task at ``path``.

    Example:
        >>> from substrax.compute import Mount
        >>> Mount(name="datasets", path="/data").access
        <MountAccess.READ_ONLY: 'read-only'>
    """

    name: Component
    path: MountPath
    access: Annotated[MountAccess, Strict(False)] = MountAccess.READ_ONLY


class Task(Record):
    """One command the worker runs from the project root (a leading ``python`` is the project's).

    Example:
        >>> from substrax.compute import Task
        >>> Task(name="t", argv=("python", "x.py"), timeout_seconds=10).argv
        ('python', 'x.py')
    """

    name: Component
    argv: Argv
    timeout_seconds: Positive


class Resources(Record):
    """Minimum resources a job asks for.

    Example:
        >>> from substrax.compute import Resources
        >>> Resources(cpu=4, memory_mib=8192).cpu
        4.0
    """

    accelerator: Accelerator | None = None
    cpu: Positive | None = None
    memory_mib: MemoryMiB | None = None


class JobSpec(Record):
    """Everything the worker needs to run a job; written as ``spec.json`` at submission.

    ``runtime`` holds ``substrax.runtime.JaxRuntime`` fields as JSON (a ``JaxRuntime`` given
    here, as in 0.1.22, is stored as its fields); ``secrets`` holds only the
    *names* of variables passed through from the submitting environment, never their values;
    ``include_files`` names project files a remote backend uploads even though the upload rules
    leave them out (a ``.env``, a key, a git-ignored file); ``stop_grace_seconds`` is how long a
    node's task has between its SIGTERM and its SIGKILL when the local backend stops a
    multi-node job (another node failed, or the job timed out).

    Example:
        >>> from substrax.compute import JobSpec, Task
        >>> spec = JobSpec(
        ...     name="j",
        ...     tasks=(Task(name="a", argv=("python", "a.py"), timeout_seconds=5),),
        ...     timeout_seconds=5,
        ...     nodes=2,
        ... )
        >>> spec.schema_version, spec.nodes
        (4, 2)
    """

    schema_version: Literal[4] = JOB_SPEC_VERSION
    name: Component
    tasks: tuple[Task, ...]
    timeout_seconds: Positive
    resources: Resources = Resources()
    extras: tuple[Component, ...] = ()
    runtime: dict[str, JsonValue] = Field(default_factory=dict)
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    secrets: tuple[EnvName, ...] = ()
    mounts: tuple[Mount, ...] = ()
    nodes: NodeCount = 1
    probe_devices: bool = True
    include_files: tuple[RelativeFile, ...] = ()
    stop_grace_seconds: Positive = STOP_GRACE_SECONDS

    @field_validator("runtime", mode="before")
    @classmethod
    def _runtime_fields(cls, value: object) -> object:
        return value if isinstance(value, Mapping) else runtime_fields(value)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.tasks:
            raise ValueError("a job needs at least one task")
        check_unique(
            tasks=[t.name for t in self.tasks],
            mounts=self.mounts,
            secrets=self.secrets,
            env=self.env,
        )
        conflict = env_conflict(
            self.name, self.env, runtime=jax_runtime(self.runtime), nodes=self.nodes
        )
        if conflict is not None:
            raise conflict
        return self

    def to_jax_runtime(self) -> "JaxRuntime":
        """``runtime`` as the ``substrax.runtime.JaxRuntime`` it holds (0.1.22's ``spec.runtime``).

        Example:
            >>> from substrax.compute import JobSpec, Task
            >>> task = Task(name="t", argv=("true",), timeout_seconds=60)
            >>> spec = JobSpec(name="j", tasks=(task,), timeout_seconds=60, runtime={"platforms": ["cpu"]})
            >>> spec.to_jax_runtime().platforms
            ('cpu',)
        """
        return jax_runtime(self.runtime)


def runtime_fields(runtime: object) -> object:
    """A ``JaxRuntime``'s settings as ``JobSpec.runtime`` holds them (JSON); anything else as is.

    Example:
        >>> from substrax.compute._spec import runtime_fields
        >>> from substrax.runtime import JaxRuntime
        >>> runtime_fields(JaxRuntime(platforms=("cuda",), preallocate=False))
        {'platforms': ['cuda'], 'preallocate': False}
    """
    import dataclasses  # noqa: PLC0415

    from substrax.runtime import JaxRuntime  # noqa: PLC0415

    if not isinstance(runtime, JaxRuntime):
        return runtime
    fields: dict[str, JsonValue] = {}
    for field in dataclasses.fields(JaxRuntime):
        value: Any = getattr(runtime, field.name)
        if value != field.default:
            fields[field.name] = (
                list(value)
                if isinstance(value, tuple)
                else str(value)
                if isinstance(value, Path)
                else value
            )
    return fields


def jax_runtime(fields: Mapping[str, Any]) -> "JaxRuntime":
    """Build ``substrax.runtime.JaxRuntime`` from its JSON fields (lists become tuples).

    Raises:
        UnknownPlatformError: A ``platforms`` entry is not in ``KNOWN_PLATFORMS``.
        RuntimeFieldError: A key is not a ``JaxRuntime`` field, or ``JaxRuntime`` refused a value
            (an XLA flag given twice with two values among them).

    Example:
        >>> from substrax.compute._spec import jax_runtime
        >>> jax_runtime({"platforms": ["cpu"]}).platforms
        ('cpu',)
        >>> jax_runtime({"platforms": ["cdua"]})
        Traceback (most recent call last):
        ...
        substrax.compute.UnknownPlatformError: JaxRuntime.platforms entry 'cdua' is not a platform jax knows (use one of: cpu, cuda, gpu, METAL, oneapi, proxy, rocm, tpu)
    """
    import dataclasses  # noqa: PLC0415

    from substrax.runtime import JaxRuntime, RuntimeConfigurationError  # noqa: PLC0415

    known = {f.name for f in dataclasses.fields(JaxRuntime)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise RuntimeFieldError(
            f"unknown JaxRuntime field {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(known))}",
            tuple(unknown),
        )
    kwargs: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, list):
            kwargs[key] = tuple(value)
        elif key == "compilation_cache_dir" and isinstance(value, str):
            kwargs[key] = Path(value)
        else:
            kwargs[key] = value
    try:
        runtime = JaxRuntime(**kwargs)
    except (TypeError, ValueError, RuntimeConfigurationError) as error:
        raise RuntimeFieldError(str(error)) from error
    for platform in runtime.platforms or ():
        if platform not in KNOWN_PLATFORMS:
            raise UnknownPlatformError(platform, KNOWN_PLATFORMS)
    return runtime


def read_job_spec(data: Mapping[str, Any]) -> JobSpec:
    """Read a spec written by ``JobSpec.model_dump(mode="json")``, strictly.

    Raises:
        RecordVersionError: The version is not this release's.
        ValueError: The record is malformed (pydantic's ``ValidationError``).

    Example:
        >>> from substrax.compute import read_job_spec
        >>> read_job_spec({"schema_version": 2})
        Traceback (most recent call last):
        ...
        substrax.compute.RecordVersionError: job spec version 2 is not 4: submit and run with the same substrax release
    """
    if not isinstance(data, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance] - user input
        raise TypeError(f"a job spec is a mapping (the spec's JSON, parsed), not {data!r:.80}")
    version = data.get("schema_version")
    if version != JOB_SPEC_VERSION:
        raise RecordVersionError(
            "job spec", version, JOB_SPEC_VERSION, "submit and run with the same substrax release"
        )
    return JobSpec.model_validate_json(json.dumps(dict(data)), strict=True)


def example_tasks(paths: Iterable[Path], *, project: Path, timeout_seconds: float) -> list[Task]:
    """One task per example script, named after its path with dots for separators.

    Example:
        >>> from pathlib import Path
        >>> from substrax.compute import example_tasks
        >>> [t.name for t in example_tasks([Path("/p/examples/a/b.py")], project=Path("/p"), timeout_seconds=9)]
        ['examples.a.b']
    """
    tasks: list[Task] = []
    for path in map(Path, paths):
        if not path.is_relative_to(project):
            raise ValueError(f"example {path} is not under the project {project}; pass its path")
        relative = path.relative_to(project)
        name = ".".join(relative.with_suffix("").parts)
        try:
            tasks.append(
                Task(
                    name=name, argv=("python", relative.as_posix()), timeout_seconds=timeout_seconds
                )
            )
        except ValueError:  # pydantic's, about the name
            msg = f"example {relative} makes the task name {name!r}, which must be letters, digits, '.', '_' or '-': rename the file"
            raise ValueError(msg) from None
    return tasks
