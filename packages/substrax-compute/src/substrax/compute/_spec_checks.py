"""The checks a job spec (and a configured job) makes across its fields: names that would collide.

Each refusal of a spec's fields is a plain ``ValueError``, as pydantic asks; those of a
configured job's tasks are ``ComputeConfigError``. Each names the values that collide and what to
do.

Example:
    >>> from substrax.compute._spec_checks import check_task_name
    >>> check_task_name("manifest.json")
    Traceback (most recent call last):
    ...
    ValueError: task 'manifest.json' is named like a file the run directory holds (manifest.json, devices.log, nodes, worker.log, worker-N.log); rename it
"""

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ._environment import mount_env_name
from ._errors import ComputeConfigError
from ._manifest import DEVICES_LOG, MANIFEST_NAME


if TYPE_CHECKING:
    from ._spec import Mount, Task


RESERVED_TASK_NAMES: tuple[str, ...] = (MANIFEST_NAME, DEVICES_LOG, "nodes", "worker.log")
"""Names a task's directory can't take: each node's output root holds the manifest, the failed
device probe's log and the other nodes' outputs (``nodes/<rank>``, ``_environment.node_outputs``),
and a fetched local run adds the workers' logs (``worker.log``, ``worker-<rank>.log``)."""
_WORKER_LOG = re.compile(r"worker-\d+\.log", re.IGNORECASE)


def check_task_name(name: str) -> str:
    """``name`` when no file of the run directory has it (compared without case, as macOS does).

    Raises:
        ValueError: ``name`` is one of ``RESERVED_TASK_NAMES`` or a ``worker-<rank>.log``.
    """
    if name.casefold() in {n.casefold() for n in RESERVED_TASK_NAMES} or _WORKER_LOG.fullmatch(
        name
    ):
        reserved = ", ".join((*RESERVED_TASK_NAMES, "worker-N.log"))
        raise ValueError(
            f"task {name!r} is named like a file the run directory holds ({reserved}); rename it"
        )
    return name


def check_unique(
    *,
    tasks: list[str],
    mounts: "tuple[Mount, ...]",
    secrets: tuple[str, ...],
    env: Mapping[str, str],
) -> None:
    """Refuse repeated or reserved task names, mounts, their paths or variables, and secrets.

    A variable named both in ``env`` and ``secrets`` is refused as well.

    Raises:
        ValueError: Something is repeated, or a task's name is reserved; the message names it.
    """
    for what, values in (
        ("task name", tasks),
        ("mount name", [m.name for m in mounts]),
        ("mount path", [m.path for m in mounts]),
        ("secret", list(secrets)),
    ):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(f"{what}s must be unique; repeated: {', '.join(repeated)}")
    for task in tasks:
        check_task_name(task)
    clash = sorted(set(secrets) & set(env))
    if clash:
        raise ValueError(f"{', '.join(clash)} named both in env and in secrets; keep one")
    variables: dict[str, str] = {}
    for mount in mounts:
        variable = mount_env_name(mount.name)
        first = variables.setdefault(variable, mount.name)
        if first != mount.name:
            raise ValueError(
                f"mounts {first!r} and {mount.name!r} would both set {variable}; rename one"
            )


def distinct_tasks(tasks: list[tuple["Task", str, str]]) -> tuple["Task", ...]:
    """A configured job's tasks, checked: no two share a name and none takes a reserved one.

    Each comes with the TOML path and the entry (``example a.py``) that made it, for refusals.

    Raises:
        ComputeConfigError: Two entries make one task name (naming both), or an example makes a
            name the run directory reserves.
    """
    seen: dict[str, tuple[str, str]] = {}
    for task, path, what in tasks:
        try:
            check_task_name(task.name)
        except ValueError as error:
            raise ComputeConfigError([(path, f"{what}: {error}")]) from None
        if task.name in seen:
            first_path, first = seen[task.name]
            reason = f"{what} and {first} ({first_path}) both make the task {task.name!r}"
            raise ComputeConfigError([(path, f"{reason}; rename one")])
        seen[task.name] = (path, what)
    return tuple(task for task, _, _ in tasks)
