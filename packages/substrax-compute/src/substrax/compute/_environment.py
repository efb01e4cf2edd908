"""What a task's process sees: the job's JAX settings, its output directory, mounts, secrets."""

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ._errors import SecretNotSetError


if TYPE_CHECKING:
    from substrax.runtime import JaxRuntime

    from ._spec import JobSpec


EVENT_PREFIX = "[substrax] "
"""How the worker's own progress lines (``task t started (1/2)``) begin in its output."""
OUTPUT_DIR_ENV = "AVITAI_OUTPUT_DIR"
NODE_RANK_ENV = "SUBSTRAX_NODE_RANK"
DISTRIBUTED_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
FAILED_AT_ENV = "SUBSTRAX_FAILED_AT_FILE"
"""Set by the multi-node supervisor: where a worker writes the time its first task failed."""


def mount_env_name(name: str) -> str:
    """The variable that tells a task where mount ``name`` is (``SUBSTRAX_MOUNT_<NAME>``).

    Example:
        >>> from substrax.compute._environment import mount_env_name
        >>> mount_env_name("data-sets")
        'SUBSTRAX_MOUNT_DATA_SETS'
    """
    return "SUBSTRAX_MOUNT_" + "".join(c if c.isalnum() else "_" for c in name).upper()


def node_outputs(outputs: Path, node: int) -> Path:
    """Where node ``node`` writes: ``outputs`` for node 0, ``outputs/nodes/<node>`` otherwise.

    Example:
        >>> from pathlib import Path
        >>> from substrax.compute._environment import node_outputs
        >>> node_outputs(Path("/o"), 2).as_posix()
        '/o/nodes/2'
    """
    return outputs if node == 0 else outputs / "nodes" / str(node)


_ONE_NODE = {"JAX_NUM_PROCESSES": 1, "JAX_PROCESS_ID": 0}
"""The distributed variables a 1-node job's env may give, and the value that agrees with it."""
_COUNTS = ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def _integer(text: str) -> int | None:
    """``text`` as jax reads a process count or id (spaces around it allowed); else None."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def _distributed_values(
    nodes: int, parent: Mapping[str, str] | None
) -> dict[str, tuple[str | None, str, str]]:
    """The distributed variables substrax sets for a node (``parent``: None before any runs)."""
    if nodes == 1:  # one node: no jax.distributed, whatever the submitting shell holds
        fix = (
            "set nodes = N for a multi-node job, and substrax wires every node (a 1-node job's "
            "env may only give JAX_NUM_PROCESSES=1 and JAX_PROCESS_ID=0)"
        )
        unset: tuple[str | None, str, str] = (
            None,
            "substrax, running a 1-node job without jax.distributed,",
            fix,
        )
        return dict.fromkeys(DISTRIBUTED_ENV, unset)
    fix = "substrax wires every node of the job: drop it from the job's env"
    if parent is None:  # before the run: only the count is known
        return {"JAX_NUM_PROCESSES": (str(nodes), f"the backend, for a {nodes}-node job,", fix)}
    setter = f"the backend, for node {parent.get(NODE_RANK_ENV, '?')} of {nodes},"
    return {name: (parent[name], setter, fix) for name in DISTRIBUTED_ENV if name in parent}


def _substrax_values(
    spec: "JobSpec", task_dir: Path | None, parent: Mapping[str, str]
) -> dict[str, tuple[str | None, str, str]]:
    """The variables substrax sets for a task: ``{name: (value or None for unset, by, fix)}``."""
    values = _distributed_values(spec.nodes, parent)
    if NODE_RANK_ENV in parent:
        values[NODE_RANK_ENV] = (parent[NODE_RANK_ENV], "the backend", "drop it from the job's env")
    for mount in spec.mounts:
        variable = mount_env_name(mount.name)
        values[variable] = (
            parent.get(variable, mount.path),
            f"mount {mount.name!r}",
            "set the mount's path in the job's mounts (a local mount in the backend's settings)",
        )
    if task_dir is not None:
        values[OUTPUT_DIR_ENV] = (
            str(task_dir),
            "the worker (each task's own output directory)",
            f"drop it from the job's env; a task finds its directory in {OUTPUT_DIR_ENV}",
        )
    return values


def _agrees(name: str, given: str, required: str | None, nodes: int) -> bool:
    """Whether the job env's ``given`` means what substrax sets ``name`` to (``None``: unset)."""
    if required is None:  # a 1-node job's count and rank, given as its topology has them
        return nodes == 1 and name in _ONE_NODE and _integer(given) == _ONE_NODE[name]
    if name in _COUNTS:
        return _integer(given) is not None and _integer(given) == _integer(required)
    if name == OUTPUT_DIR_ENV:
        return Path(given).resolve() == Path(required).resolve()
    return given == required


def _conflict(
    env: Mapping[str, str], values: Mapping[str, tuple[str | None, str, str]], nodes: int
) -> ValueError | None:
    """The first ``env`` entry that gives a variable of ``values`` another value, as an error."""
    from substrax.runtime import EnvironmentConflictError  # noqa: PLC0415

    for name, given in env.items():
        if name not in values:
            continue
        required, setter, fix = values[name]
        if not _agrees(name, given, required, nodes):
            return EnvironmentConflictError(
                variable=name, given=given, required=required, setter=setter, fix=fix
            )
    return None


def _job_runtime_error(job: str, error: Exception) -> ValueError | None:
    """A runtime/env conflict of job ``job`` as a ``ValueError`` naming the job's runtime table.

    A ``ValueError``, so that the worker fails the task with this reason instead of ending;
    ``None`` when ``error`` already is one, to raise as it is.
    """
    from substrax.runtime import EnvironmentConflictError, XlaFlagConflictError  # noqa: PLC0415

    table = f"the runtime table of job {job!r}"
    if isinstance(error, XlaFlagConflictError):
        flag = f"{error.flag}={error.existing}" if error.existing is not None else error.flag
        wanted = f"{error.flag}={error.requested}" if error.requested is not None else error.flag
        return EnvironmentConflictError(
            variable="XLA_FLAGS",
            given=flag,
            required=wanted,
            setter=f"{table} (xla_flags)",
            fix=f"set {error.flag} once: in the runtime's xla_flags, not in the job's env",
        )
    if isinstance(error, EnvironmentConflictError) and error.setter.startswith("JaxRuntime."):
        field = error.setter.removeprefix("JaxRuntime.")
        return EnvironmentConflictError(
            variable=error.variable,
            given=error.given,
            required=error.required,
            setter=f"{table} ({field})",
            fix=f"set it once: as {field} in the runtime table, not as {error.variable} in env",
        )
    if isinstance(error, ValueError):
        return None
    return ValueError(f"job {job!r}: its env and runtime table cannot both hold: {error}")


def env_conflict(
    job: str, env: Mapping[str, str], *, runtime: "JaxRuntime", nodes: int, configured: bool = False
) -> ValueError | None:
    """What job ``job``'s ``env`` contradicts that is known before it runs, as an error; or None.

    Its runtime table (``JAX_ENABLE_X64 = "0"`` with ``enable_x64 = true``) and its topology: a
    1-node job's env may give only ``JAX_NUM_PROCESSES=1`` and ``JAX_PROCESS_ID=0`` of the
    distributed variables, a job of N nodes only ``JAX_NUM_PROCESSES=N``. The job table of a
    ``configured`` job may not give ``AVITAI_OUTPUT_DIR`` at all: its tasks' directories are
    made per run, so no value agrees. What depends on where a task runs (its output directory,
    a mount's path, a node's rank) is checked as it starts.

    Example:
        >>> from substrax.compute._environment import env_conflict
        >>> from substrax.runtime import JaxRuntime
        >>> print(env_conflict("j", {"JAX_ENABLE_X64": "0"}, runtime=JaxRuntime(enable_x64=True), nodes=1))
        env sets JAX_ENABLE_X64='0', but the runtime table of job 'j' (enable_x64) sets it to 'true'; set it once: as enable_x64 in the runtime table, not as JAX_ENABLE_X64 in env
    """
    from substrax.runtime import (  # noqa: PLC0415
        EnvironmentConflictError,
        RuntimeConfigurationError,
        child_environment,
    )

    conflict = _conflict(env, _distributed_values(nodes, None), nodes)
    if conflict is not None:
        return conflict
    if configured and OUTPUT_DIR_ENV in env:
        return EnvironmentConflictError(
            variable=OUTPUT_DIR_ENV,
            given=env[OUTPUT_DIR_ENV],
            required="<outputs>/<task>",
            setter="the worker (each task's own output directory)",
            fix=f"drop it from the job's env; a task finds its directory in {OUTPUT_DIR_ENV}",
        )
    try:
        child_environment(runtime, dict(env), parent={})
    except RuntimeConfigurationError as error:
        reworded = _job_runtime_error(job, error)
        return reworded if reworded is not None else cast("ValueError", error)
    return None


def task_environment(
    spec: "JobSpec", task_dir: Path | None, *, parent: Mapping[str, str]
) -> dict[str, str]:
    """The complete environment a task (or the probe) starts with.

    ``child_environment`` drops the parent's ``JAX_*`` variables. The distributed launch
    variables are the ones the backend set for a job of several nodes (a 1-node job gets none,
    whatever the submitting shell holds); a ``JAX_COMPILATION_CACHE_DIR`` the parent sets is kept
    unless the job's runtime names its own directory; the job's secrets are read from ``parent``
    by name. A job ``env`` entry that gives a variable substrax sets (the runtime's, the output
    directory, a mount's, the distributed ones) another value is refused, never replaced; one
    that agrees (``JAX_NUM_PROCESSES=1`` for a 1-node job) is kept.

    Raises:
        SecretNotSetError: A secret the job names is not set in ``parent``.
        EnvironmentConflictError: A job ``env`` entry conflicts with a value substrax sets;
            the message names the variable, both values and where to set it instead.
        ValueError: The job's env and runtime cannot be rendered together otherwise (see
            ``substrax.runtime.child_environment``), e.g. two CPU device counts.
    """
    from substrax.runtime import RuntimeConfigurationError, child_environment  # noqa: PLC0415

    from ._spec import jax_runtime  # noqa: PLC0415 - pydantic, only where a task starts

    runtime = jax_runtime(spec.runtime)
    values = _substrax_values(spec, task_dir, parent)
    conflict = _conflict(spec.env, values, spec.nodes)
    if conflict is not None:
        raise conflict
    env = dict(spec.env)
    missing = [name for name in spec.secrets if name not in parent]
    if missing:
        raise SecretNotSetError(missing, "the worker's environment")
    env.update({name: parent[name] for name in spec.secrets})
    env.update({name: value for name, (value, _, _) in values.items() if value is not None})
    cache = parent.get("JAX_COMPILATION_CACHE_DIR")
    if cache and runtime.compilation_cache and runtime.compilation_cache_dir is None:
        env.setdefault("JAX_COMPILATION_CACHE_DIR", cache)  # the user's, as runtime.md promises
    # the job decides the cache: a shell's JAX_ENABLE_COMPILATION_CACHE is not inherited, as
    # child_environment would (for a test session's children)
    job_parent = {k: v for k, v in parent.items() if k != "JAX_ENABLE_COMPILATION_CACHE"}
    try:
        return child_environment(runtime, env, parent=job_parent)
    except RuntimeConfigurationError as error:
        reworded = _job_runtime_error(spec.name, error)
        if reworded is None:
            raise
        raise reworded from error
