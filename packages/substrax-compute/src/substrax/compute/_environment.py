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


def task_environment(
    spec: "JobSpec", task_dir: Path | None, *, parent: Mapping[str, str]
) -> dict[str, str]:
    """The complete environment a task (or the probe) starts with.

    ``child_environment`` drops the parent's ``JAX_*`` variables; the distributed launch
    variables are carried over, and the job's secrets are read from ``parent`` by name.

    Raises:
        SecretNotSetError: A secret the job names is not set in ``parent``.
    """
    from substrax.runtime import child_environment  # noqa: PLC0415

    from ._spec import jax_runtime  # noqa: PLC0415 - pydantic, only where a task starts

    env = dict(spec.env)
    missing = [name for name in spec.secrets if name not in parent]
    if missing:
        raise SecretNotSetError(missing, "the worker's environment")
    env.update({name: parent[name] for name in spec.secrets})
    env.update({name: parent[name] for name in DISTRIBUTED_ENV if name in parent})
    for mount in spec.mounts:
        variable = mount_env_name(mount.name)
        env[variable] = parent.get(variable, mount.path)
    if task_dir is not None:
        env[OUTPUT_DIR_ENV] = str(task_dir)
    return child_environment(jax_runtime(spec.runtime), env, parent=parent)
