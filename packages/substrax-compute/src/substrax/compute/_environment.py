"""What a task's process sees: the job's JAX settings, its output directory, mounts, secrets."""

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ._errors import SecretNotSetError


if TYPE_CHECKING:
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


def _substrax_values(
    spec: "JobSpec", task_dir: Path | None, parent: Mapping[str, str]
) -> dict[str, tuple[str | None, str, str]]:
    """The variables substrax sets for a task: ``{name: (value or None for unset, by, fix)}``."""
    values: dict[str, tuple[str | None, str, str]] = {}
    if spec.nodes == 1:  # one node: no jax.distributed, whatever the submitting shell holds
        for name in DISTRIBUTED_ENV:
            values[name] = (
                None,
                "substrax, running a 1-node job without jax.distributed,",
                "set nodes = N for a multi-node job, and substrax wires every node",
            )
    else:
        for name in DISTRIBUTED_ENV:
            if name in parent:
                values[name] = (
                    parent[name],
                    f"the backend, for node {parent.get(NODE_RANK_ENV, '?')} of {spec.nodes}",
                    "substrax wires every node of the job: drop it from the job's env",
                )
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


def _refuse_conflicts(spec: "JobSpec", values: Mapping[str, tuple[str | None, str, str]]) -> None:
    from substrax.runtime import EnvironmentConflictError  # noqa: PLC0415

    for name, given in spec.env.items():
        if name not in values:
            continue
        required, setter, fix = values[name]
        same = required is not None and (
            given == required
            or (name == OUTPUT_DIR_ENV and Path(given).resolve() == Path(required).resolve())
        )
        if not same:
            raise EnvironmentConflictError(
                variable=name,
                given=given,
                required=required,
                setter=setter,
                fix=fix,
            )


def _job_runtime_error(spec: "JobSpec", error: Exception) -> ValueError | None:
    """A runtime/env conflict of ``spec`` as a ``ValueError`` naming the job's runtime table.

    A ``ValueError``, so that the worker fails the task with this reason instead of ending;
    ``None`` when ``error`` already is one, to raise as it is.
    """
    from substrax.runtime import EnvironmentConflictError, XlaFlagConflictError  # noqa: PLC0415

    table = f"the runtime table of job {spec.name!r}"
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
    return ValueError(f"job {spec.name!r}: its env and runtime table cannot both hold: {error}")


def task_environment(
    spec: "JobSpec", task_dir: Path | None, *, parent: Mapping[str, str]
) -> dict[str, str]:
    """The complete environment a task (or the probe) starts with.

    ``child_environment`` drops the parent's ``JAX_*`` variables. The distributed launch
    variables are the ones the backend set for a job of several nodes (a 1-node job gets none,
    whatever the submitting shell holds); a ``JAX_COMPILATION_CACHE_DIR`` the parent sets is kept
    unless the job's runtime names its own directory; the job's secrets are read from ``parent``
    by name. A job ``env`` entry that gives a variable substrax sets (the runtime's, the output
    directory, a mount's, the distributed ones) another value is refused, never replaced.

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
    _refuse_conflicts(spec, values)
    env = dict(spec.env)
    missing = [name for name in spec.secrets if name not in parent]
    if missing:
        raise SecretNotSetError(missing, "the worker's environment")
    env.update({name: parent[name] for name in spec.secrets})
    env.update({name: value for name, (value, _, _) in values.items() if value is not None})
    cache = parent.get("JAX_COMPILATION_CACHE_DIR")
    if cache and runtime.compilation_cache and runtime.compilation_cache_dir is None:
        env.setdefault("JAX_COMPILATION_CACHE_DIR", cache)  # the user's, as runtime.md promises
    try:
        return child_environment(runtime, env, parent=parent)
    except RuntimeConfigurationError as error:
        reworded = _job_runtime_error(spec, error)
        if reworded is None:
            raise
        raise reworded from error
