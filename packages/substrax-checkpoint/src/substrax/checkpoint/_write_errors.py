"""The errors of writing a store: refused and failed saves, the writer lock, retention, upgrades."""

from enum import StrEnum
from pathlib import Path
from typing import Literal, Self

from substrax.support import StructuredError


class NotWrittenReason(StrEnum):
    """Why a save was refused; each reason compares equal to its string (``"exists"``...).

    Example:
        >>> from substrax.checkpoint import NotWrittenReason
        >>> NotWrittenReason.BELOW_LATEST == "below_latest"
        True
        >>> NotWrittenReason("exists").advice
        'pass overwrite=True to replace it, or save under a new step'
    """

    __module__ = "substrax.checkpoint"

    EXISTS = "exists"
    """The step is stored already and ``overwrite`` was not set."""
    BELOW_LATEST = "below_latest"
    """The step is below the latest stored step."""
    REJECTED = "rejected"
    """Orbax's ``save`` returned False."""
    OCCUPIED = "occupied"
    """A folder named like the step holds no checkpoint of it; the store leaves it in place."""

    @property
    def advice(self) -> str:
        """What to do about it, in the error's message."""
        return _ADVICE[self]


_ADVICE: dict[NotWrittenReason, str] = {
    NotWrittenReason.EXISTS: "pass overwrite=True to replace it, or save under a new step",
    NotWrittenReason.BELOW_LATEST: "steps only move forward; save under a step above the latest",
    NotWrittenReason.REJECTED: "orbax refused the save; check the directory is writable",
    NotWrittenReason.OCCUPIED: (
        "a folder of that name that is not a checkpoint step is in the way (the store never "
        "deletes it, even with overwrite=True); move it out of the store, or save under another step"
    ),
}


def _also_unwritten(step: int, unwritten: tuple[int, ...]) -> str:
    """The end of a message naming the steps a save did not write besides ``step`` ("" if none)."""
    others = [s for s in unwritten if s != step]
    if not others:
        return ""
    named = ", ".join(map(str, unwritten[:-1])) + f" and {unwritten[-1]}"
    listed = ", ".join(map(str, others))
    return (
        f"; the save of step {listed} raised this error and wrote nothing either: "
        f"steps {named} are not in the store, save them again"
    )


class _WriteError(StructuredError, public_module="substrax.checkpoint"):
    """The base of the write errors: each shows as ``substrax.checkpoint``'s, where users import it."""


class CheckpointNotWrittenError(_WriteError, RuntimeError, kw_only=True):
    """A save was refused; ``reason`` says why (``exists``, ``below_latest``, ``rejected``, ``occupied``).

    Example:
        >>> from substrax.checkpoint import CheckpointNotWrittenError
        >>> CheckpointNotWrittenError(step=3, latest_step=5, reason="below_latest").reason
        <NotWrittenReason.BELOW_LATEST: 'below_latest'>
    """

    template = (
        "checkpoint step {step} was not written ({reason}; latest step is {latest_step}): "
        "{reason.advice}"
    )
    step: int
    latest_step: int | None
    reason: NotWrittenReason | Literal["exists", "below_latest", "rejected", "occupied"]
    unwritten: tuple[int, ...] = ()
    """Every step not in the store because of this error: ``(step,)``, or, when a ``save``
    raised it for the write before it, that step and the save's own."""

    def __post_init__(self) -> None:
        self.reason = NotWrittenReason(self.reason)
        self.unwritten = tuple(self.unwritten) or (self.step,)
        super().__post_init__()

    def _message(self) -> str:
        return super()._message() + _also_unwritten(self.step, self.unwritten)


class CheckpointWriteError(_WriteError, RuntimeError, kw_only=True):
    """A background write failed; raised at the next ``save``, ``wait`` or ``close``.

    ``cause`` says why, as text (the exception the write raised, or what it left out).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointWriteError
        >>> CheckpointWriteError(
        ...     step=4, directory=Path("/tmp/store"), cause="disk full", unwritten=(4, 5)
        ... ).args[0]
        'checkpoint step 4 in /tmp/store was not committed: disk full; the save of step 5 raised this error and wrote nothing either: steps 4 and 5 are not in the store, save them again'
    """

    step: int
    directory: Path
    cause: str
    unwritten: tuple[int, ...] = ()
    """Every step not in the store because of this error (see ``CheckpointNotWrittenError``)."""

    def __post_init__(self) -> None:
        self.unwritten = tuple(self.unwritten) or (self.step,)
        super().__post_init__()

    @classmethod
    def of(cls, step: int, directory: Path, error: BaseException) -> Self:
        """The error of ``step``'s write that ``error`` failed, naming it as its cause."""
        return cls(step=step, directory=directory, cause=f"{type(error).__name__}: {error}")

    def _message(self) -> str:
        head = f"checkpoint step {self.step} in {self.directory} was not committed: {self.cause}"
        if len(self.unwritten) == 1:
            return f"{head}; the step is not in the store, save it again"
        return head + _also_unwritten(self.step, self.unwritten)


class CheckpointLeafNameCollisionError(_WriteError, ValueError, kw_only=True):
    """Two leaves of ``item`` would be stored under one name, and one restore as the other.

    Orbax names a stored leaf by its keys joined with ``.``, and the store records each leaf's
    dtype and shape under its keys joined with ``/`` (``stored_name``): ``{"a.b": x, "a": {"b":
    y}}`` holds two leaves of one stored name, at ``paths`` (``"a.b"`` and ``"a/b"``), and
    ``{"a/b": x, "a": {"b": y}}`` two of one recorded name (``paths`` as ``jax.tree_util.keystr``
    shows them: ``"['a/b']"`` and ``"['a']['b']"``). TensorStore, which writes the arrays, drops
    a stored name's trailing ``/``: ``{"a/": x, "a": y}`` holds two leaves stored as ``"a"``.

    Example:
        >>> from substrax.checkpoint import CheckpointLeafNameCollisionError
        >>> CheckpointLeafNameCollisionError(item="m", paths=("a.b", "a/b"), stored_name="a.b").paths
        ('a.b', 'a/b')
    """

    template = (
        "item {item!r} has two leaves, {paths[0]!r} and {paths[1]!r}, that would both be stored "
        "as {stored_name!r} (orbax joins a leaf's keys with '.', the store's records with '/', "
        "TensorStore drops a trailing '/'), "
        "and one would restore in place of the other; rename a key so that no two leaves' keys "
        "join to the same name"
    )
    item: str
    paths: tuple[str, str]
    stored_name: str


class CheckpointLockedError(_WriteError, RuntimeError, kw_only=True):
    """Another process writes the store: a store has one writing process (or one multi-host job).

    ``host``, ``pid`` and ``since`` describe the holder (None where the lock file is unreadable).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointLockedError
        >>> CheckpointLockedError(directory=Path("/s"), host="node1", pid=42, since=None).args[0]
        'the checkpoint store at /s is being written by another process (pid 42 on host node1 since ?); ...'
    """

    directory: Path
    host: str | None
    pid: int | None
    since: str | None

    def _message(self) -> str:
        pid = self.pid if self.pid is not None else "?"
        holder = f"pid {pid} on host {self.host or '?'} since {self.since or '?'}"
        return (
            f"the checkpoint store at {self.directory} is being written by another process "
            f"({holder}); open it with read_only=True to read while it writes, or stop the other "
            "writer (in a multi-host job, open the store after jax.distributed.initialize())"
        )


class CheckpointStoreRemovedError(_WriteError, RuntimeError, kw_only=True):
    """The writer's directory was removed (or its lock file replaced) while the store was open.

    Its writer lock went with it: the store saves nothing more there (nor creates it again).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreRemovedError
        >>> CheckpointStoreRemovedError(directory=Path("/tmp/store")).args[0]
        'the checkpoint store at /tmp/store was removed (or its writer lock file replaced) ...'
    """

    template = (
        "the checkpoint store at {directory} was removed (or its writer lock file replaced) "
        "while this store had it open, and its writer lock with it: nothing more is saved there; "
        "close this store and open a new OrbaxCheckpointStore on the directory to write again"
    )
    directory: Path


class CheckpointStoreSupersededError(_WriteError, RuntimeError, kw_only=True):
    """A writer store was asked to write after a newer store of its process opened its directory.

    The newer store (a notebook cell run again) took over: the first one finished its write and
    refuses ``save``, ``delete`` and ``prune`` (``operation``).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreSupersededError
        >>> CheckpointStoreSupersededError(directory=Path("/tmp/store"), operation="save").args[0]
        'cannot save: another OrbaxCheckpointStore of this process opened /tmp/store ...'
    """

    template = (
        "cannot {operation}: another OrbaxCheckpointStore of this process opened {directory} "
        "to write after this one (a notebook cell run again?) and took over its writing; this "
        "store finished its last write and now only reads: save with the newer store (or close "
        "both and open one)"
    )
    directory: Path
    operation: str


class CheckpointStoreReadOnlyError(_WriteError, PermissionError, kw_only=True):
    """A store opened with ``read_only=True`` was asked to write (``save``, ``delete``, ``prune``).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreReadOnlyError
        >>> CheckpointStoreReadOnlyError(directory=Path("/tmp/store"), operation="save").operation
        'save'
    """

    template = (
        "cannot {operation}: the checkpoint store at {directory} was opened read_only=True; "
        "open it without read_only to save or delete"
    )
    directory: Path
    operation: str


class DistributedNotInitializedError(_WriteError, RuntimeError, kw_only=True):
    """Several jax processes run but ``jax.distributed`` has no client to agree through.

    Example:
        >>> from substrax.checkpoint import DistributedNotInitializedError
        >>> DistributedNotInitializedError(process_count=2, needed_by="the checkpoint store").args[0]
        'there are 2 jax processes but no jax.distributed client; call ...'
    """

    template = (
        "there are {process_count} jax processes but no jax.distributed client; call "
        "jax.distributed.initialize() before using {needed_by}"
    )
    process_count: int
    needed_by: str


class BestMetricNotRecordedError(_WriteError, ValueError, kw_only=True):
    """``prune`` was asked to keep the best steps by a metric that no step of the store records.

    A misspelled ``best_metric`` would protect nothing; ``recorded`` lists the names recorded.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import BestMetricNotRecordedError
        >>> BestMetricNotRecordedError(metric="lsos", directory=Path("/s"), recorded=("loss",)).args[0]
        "no step in /s records the metric 'lsos' that keep_best ranks by (the steps record: loss); pass one of those as best_metric, or drop keep_best"
    """

    metric: str
    directory: Path
    recorded: tuple[str, ...]

    def _message(self) -> str:
        shown = ", ".join(self.recorded) or "no metrics"
        return (
            f"no step in {self.directory} records the metric {self.metric!r} that keep_best "
            f"ranks by (the steps record: {shown}); pass one of those as best_metric, "
            "or drop keep_best"
        )


class UpgradeDestinationError(_WriteError, ValueError, kw_only=True):
    """``upgrade_checkpoints`` was given a destination it must not write into.

    ``reason`` is ``"is the source"``, ``"is not empty"`` or ``"is not a directory"``.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import UpgradeDestinationError
        >>> UpgradeDestinationError(destination=Path("/tmp/a"), reason="is not empty").args[0]
        'destination /tmp/a is not empty; upgrade into a new, empty directory'
    """

    template = "destination {destination} {reason}; upgrade into a new, empty directory"
    destination: Path
    reason: Literal["is the source", "is not empty", "is not a directory"]
