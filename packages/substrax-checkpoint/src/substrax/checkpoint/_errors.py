"""The errors of the checkpoint store, each carrying the values it complains about."""

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

from substrax.support import PicklableError, StructuredError


_CHECKSUM = re.compile(r"checksum|digest|crc", re.IGNORECASE)
"""Words of a report of bytes that fail their checksum (others: a missing or empty file...)."""


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

    @property
    def advice(self) -> str:
        """What to do about it, in the error's message."""
        return _ADVICE[self]


_ADVICE: dict[NotWrittenReason, str] = {
    NotWrittenReason.EXISTS: "pass overwrite=True to replace it, or save under a new step",
    NotWrittenReason.BELOW_LATEST: "steps only move forward; save under a step above the latest",
    NotWrittenReason.REJECTED: "orbax refused the save; check the directory is writable",
}


class CheckpointNotWrittenError(StructuredError, RuntimeError, kw_only=True):
    """A save was refused; ``reason`` says why (``exists``, ``below_latest`` or ``rejected``).

    Example:
        >>> from substrax.checkpoint import CheckpointNotWrittenError
        >>> error = CheckpointNotWrittenError(step=3, latest_step=5, reason="below_latest")
        >>> error.reason == "below_latest"
        True
    """

    __module__ = "substrax.checkpoint"

    template = (
        "checkpoint step {step} was not written ({reason}; latest step is {latest_step}): "
        "{reason.advice}"
    )
    step: int
    latest_step: int | None
    reason: NotWrittenReason | Literal["exists", "below_latest", "rejected"]
    unwritten: tuple[int, ...] = ()
    """Every step that is not in the store because of this error: ``(step,)``, or, when a
    ``save`` raised it for the write before it, that step and the save's own."""

    def __post_init__(self) -> None:
        self.reason = NotWrittenReason(self.reason)
        self.unwritten = tuple(self.unwritten) or (self.step,)
        super().__post_init__()

    def _message(self) -> str:
        text = self.template.format_map(self._fields())
        return text + _also_unwritten(self.step, self.unwritten)


class CheckpointNotFoundError(StructuredError, FileNotFoundError, kw_only=True):
    """The store holds no step ``step`` (None: the latest step was asked of an empty store).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointNotFoundError
        >>> CheckpointNotFoundError(step=7, directory=Path("/tmp/store")).step
        7
        >>> CheckpointNotFoundError(step=None, directory=Path("/tmp/store")).args[0]
        'the checkpoint store at /tmp/store is empty (no step saved yet): ...'
        >>> CheckpointNotFoundError(step=7, directory=Path("/tmp/store"), deleted=True).deleted
        True

    ``deleted`` is True when the step was deleted (by a writer's retention, or ``delete``)
    while it was being read: a reader following a live run skips it and reads a later step.
    """

    __module__ = "substrax.checkpoint"

    step: int | None
    directory: Path
    available: tuple[int, ...] = ()
    deleted: bool = False

    def _message(self) -> str:
        shown = ", ".join(map(str, self.available[-10:])) or "none"
        if self.deleted:
            return (
                f"checkpoint step {self.step} in {self.directory} was deleted while it was read "
                f"(a writer's retention or a delete removed it; steps held: {shown}); "
                "read a step that list_steps() still lists"
            )
        if self.step is None:
            return (
                f"the checkpoint store at {self.directory} is empty (no step saved yet): "
                "check the path, or start from scratch when latest_step() is None"
            )
        return (
            f"no checkpoint step {self.step} in {self.directory} (steps held: {shown}); "
            "call list_steps() to see what the store holds"
        )


class UnsupportedCheckpointError(PicklableError, ValueError):
    """The step is not a substrax checkpoint of a format this version can read.

    Example:
        >>> from substrax.checkpoint import UnsupportedCheckpointError
        >>> UnsupportedCheckpointError("format 'other' is not substrax-checkpoint").args[0]
        "format 'other' is not substrax-checkpoint"
    """

    __module__ = "substrax.checkpoint"


class CheckpointWriteError(StructuredError, RuntimeError, kw_only=True):
    """A background write failed; raised at the next ``save``, ``wait`` or ``close``.

    ``cause`` says why, as text (the exception the write raised, or what it left out).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointWriteError
        >>> CheckpointWriteError(step=4, directory=Path("/tmp/store"), cause="disk full").step
        4
    """

    __module__ = "substrax.checkpoint"

    step: int
    directory: Path
    cause: str
    unwritten: tuple[int, ...] = ()
    """Every step that is not in the store because of this error: ``(step,)``, or, when a
    ``save`` raised it for the write before it, that step and the save's own (which was not
    written either)."""

    def __post_init__(self) -> None:
        self.unwritten = tuple(self.unwritten) or (self.step,)
        super().__post_init__()

    def _message(self) -> str:
        head = f"checkpoint step {self.step} in {self.directory} was not committed: {self.cause}"
        if len(self.unwritten) == 1:
            return f"{head}; the step is not in the store, save it again"
        return head + _also_unwritten(self.step, self.unwritten)


def _also_unwritten(step: int, unwritten: tuple[int, ...]) -> str:
    """The end of a message naming the steps a save did not write besides ``step`` ("" if none).

    Example:
        >>> from substrax.checkpoint._errors import _also_unwritten
        >>> _also_unwritten(4, (4, 5))
        '; the save of step 5 raised this error and wrote nothing either: steps 4 and 5 are not in the store, save them again'
    """
    others = [s for s in unwritten if s != step]
    if not others:
        return ""
    named = ", ".join(map(str, unwritten[:-1])) + f" and {unwritten[-1]}"
    listed = ", ".join(map(str, others))
    return (
        f"; the save of step {listed} raised this error and wrote nothing either: "
        f"steps {named} are not in the store, save them again"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DtypeMismatch:
    """One leaf whose stored dtype differs from the dtype it would be restored as.

    Example:
        >>> from substrax.checkpoint import DtypeMismatch
        >>> DtypeMismatch(item="model", leaf="kernel/value", saved="float64", restored="float32")
        DtypeMismatch(item='model', leaf='kernel/value', saved='float64', restored='float32')
    """

    __module__ = "substrax.checkpoint"

    item: str
    leaf: str
    saved: str
    restored: str


class CheckpointDtypeMismatchError(StructuredError, ValueError, kw_only=True):
    """Restoring would change the dtype of at least one leaf; pass ``cast_dtypes=True`` to allow it.

    Example:
        >>> from substrax.checkpoint import CheckpointDtypeMismatchError, DtypeMismatch
        >>> mismatch = DtypeMismatch(item="model", leaf="w", saved="float64", restored="float32")
        >>> CheckpointDtypeMismatchError(step=1, mismatches=(mismatch,)).mismatches[0].leaf
        'w'
    """

    __module__ = "substrax.checkpoint"

    step: int
    mismatches: tuple[DtypeMismatch, ...]

    def _message(self) -> str:
        mismatches = self.mismatches
        shown = "; ".join(
            f"{m.item}:{m.leaf or '<root>'} {m.saved} -> {m.restored}" for m in mismatches[:5]
        )
        hint = ""
        if any(m.saved.endswith("64") and m.restored.endswith("32") for m in mismatches):
            hint = " (a 64-bit array narrows while x64 is off: set jax_enable_x64 to keep it)"
        return (
            f"restoring step {self.step} would change {len(mismatches)} dtype(s): "
            f"{shown}{hint}; pass cast_dtypes=True to cast, or use a template with the stored dtypes"
        )


class CheckpointLockedError(StructuredError, RuntimeError, kw_only=True):
    """Another process writes the store: a store has one writing process (or one multi-host job).

    ``host``, ``pid`` and ``since`` describe the holder as it recorded itself (None where the
    lock file could not be read).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointLockedError
        >>> error = CheckpointLockedError(
        ...     directory=Path("/tmp/store"), host="node1", pid=4242, since="2026-01-01T00:00:00+00:00"
        ... )
        >>> error.pid
        4242
    """

    __module__ = "substrax.checkpoint"

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


class CheckpointStoreRemovedError(StructuredError, RuntimeError, kw_only=True):
    """The writer's directory was removed (or its lock file replaced) while the store was open.

    Its writer lock went with the directory, so another process may now write there: the store
    saves nothing more (and never creates the directory again); close it and open a new one.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreRemovedError
        >>> CheckpointStoreRemovedError(directory=Path("/tmp/store")).args[0]
        'the checkpoint store at /tmp/store was removed (or its writer lock file replaced) ...'
    """

    __module__ = "substrax.checkpoint"

    template = (
        "the checkpoint store at {directory} was removed (or its writer lock file replaced) "
        "while this store had it open, and its writer lock with it: nothing more is saved there; "
        "close this store and open a new OrbaxCheckpointStore on the directory to write again"
    )
    directory: Path


class CheckpointStoreSupersededError(StructuredError, RuntimeError, kw_only=True):
    """A writer store was asked to write after a newer store of its process opened its directory.

    Opening a second writer ``OrbaxCheckpointStore`` on a directory in the same process (a
    notebook cell run again while the first store is still open) makes the new store the
    directory's writer: the first one finishes its pending write, then refuses ``save``,
    ``delete`` and ``prune`` with this error, and its reads follow the directory as a reader's.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreSupersededError
        >>> CheckpointStoreSupersededError(directory=Path("/tmp/store"), operation="save").args[0]
        'cannot save: another OrbaxCheckpointStore of this process opened /tmp/store ...'
    """

    __module__ = "substrax.checkpoint"

    template = (
        "cannot {operation}: another OrbaxCheckpointStore of this process opened {directory} "
        "to write after this one (a notebook cell run again?) and took over its writing; this "
        "store finished its last write and now only reads: save with the newer store (or close "
        "both and open one)"
    )
    directory: Path
    operation: str


class CheckpointLeafNameCollisionError(StructuredError, ValueError, kw_only=True):
    """Two leaves of an item would be stored under one name, and one restore as the other.

    Orbax names a stored leaf by its keys joined with ``.``: ``{"a.b": x, "a": {"b": y}}`` or
    ``{"x": [v], "x.0": w}`` hold two leaves of one stored name. ``save`` refuses such a tree
    before anything is written.

    Attributes:
        item: the item holding both leaves.
        paths: the two leaves' paths in the item (keys joined with ``/``).
        stored_name: the name both would be stored under.

    Example:
        >>> from substrax.checkpoint import CheckpointLeafNameCollisionError
        >>> error = CheckpointLeafNameCollisionError(
        ...     item="model", paths=("a.b", "a/b"), stored_name="a.b"
        ... )
        >>> error.paths
        ('a.b', 'a/b')
    """

    __module__ = "substrax.checkpoint"

    template = (
        "item {item!r} has two leaves, {paths[0]!r} and {paths[1]!r}, that would both be stored "
        "as {stored_name!r} (orbax joins a leaf's keys with '.'), and one would restore in place "
        "of the other; rename a key so that no two leaves' keys join to the same name"
    )
    item: str
    paths: tuple[str, str]
    stored_name: str


class CheckpointStoreNotFoundError(StructuredError, FileNotFoundError, kw_only=True):
    """A store opened to be read does not exist.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreNotFoundError
        >>> CheckpointStoreNotFoundError(directory=Path("/no/such/store")).directory
        PosixPath('/no/such/store')
    """

    __module__ = "substrax.checkpoint"

    template = (
        "no checkpoint store at {directory}: the directory does not exist; "
        "check the path (a writer creates it when it opens the store)"
    )
    directory: Path


class CheckpointStoreNotADirectoryError(StructuredError, NotADirectoryError, kw_only=True):
    """The path of a store is a file, not a directory.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreNotADirectoryError
        >>> CheckpointStoreNotADirectoryError(directory=Path("/etc/hostname")).directory
        PosixPath('/etc/hostname')
    """

    __module__ = "substrax.checkpoint"

    template = (
        "{directory} is not a directory: a file stands at that path or above it; "
        "pass the checkpoint store's directory"
    )
    directory: Path


class CheckpointWaitTimeoutError(StructuredError, TimeoutError, kw_only=True):
    """``wait_for_step`` saw no step newer than ``after`` committed within ``timeout`` seconds.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointWaitTimeoutError
        >>> CheckpointWaitTimeoutError(
        ...     directory=Path("/tmp/store"), after=3, timeout=1.0, latest_step=3
        ... ).after
        3
    """

    __module__ = "substrax.checkpoint"

    directory: Path
    after: int | None
    timeout: float
    latest_step: int | None

    def _message(self) -> str:
        wanted = "no step" if self.after is None else f"no step after {self.after}"
        return (
            f"{wanted} was committed in {self.directory} within {self.timeout:g} s "
            f"(latest step: {self.latest_step}); check the writer is running, "
            "or pass a longer timeout="
        )


class CheckpointCorruptError(StructuredError, ValueError, kw_only=True):
    """A stored array's bytes fail their checksum, or a file of the step is missing or damaged.

    The step cannot be restored as it was saved.

    Attributes:
        step: the step read (None when its directory is not named by a step number).
        item: the item holding the array (``model``, ``optimizer``...).
        leaf: the array's path in the item (``layer0/kernel``).
        directory: the checkpoint store's root.
        path: the file (or the array's directory) whose bytes are corrupted.
        detail: what was found: the manifest's size or CRC-32C against the file's, or what
            orbax raised reading a step without a manifest.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointCorruptError
        >>> error = CheckpointCorruptError(
        ...     step=7, item="model", leaf="w", directory=Path("/tmp/store"), path=Path("/tmp/store/7")
        ... )
        >>> (error.step, error.item, error.leaf)
        (7, 'model', 'w')
    """

    __module__ = "substrax.checkpoint"

    step: int | None
    item: str
    leaf: str
    directory: Path
    path: Path
    detail: str = "checksum mismatch"

    def _message(self) -> str:
        damage = "fails its checksum" if _CHECKSUM.search(self.detail) else "is damaged"
        return (
            f"checkpoint step {self.step} in {self.directory} is corrupted: item {self.item!r} "
            f"leaf {self.leaf!r} {damage} ({self.path}: {self.detail}); restore an earlier step "
            "(list_steps()), and check the others with `python -m substrax.checkpoint verify DIR`"
        )


class CheckpointStoreClosedError(StructuredError, RuntimeError, kw_only=True):
    """The store was used after ``close()``.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreClosedError
        >>> CheckpointStoreClosedError(directory=Path("/tmp/store")).directory
        PosixPath('/tmp/store')
    """

    __module__ = "substrax.checkpoint"

    template = (
        "the checkpoint store at {directory} is closed; "
        "open a new OrbaxCheckpointStore on the directory to use it again"
    )
    directory: Path


class CheckpointStoreReadOnlyError(StructuredError, PermissionError, kw_only=True):
    """A store opened with ``read_only=True`` was asked to write (``save``, ``delete``, ``prune``).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreReadOnlyError
        >>> CheckpointStoreReadOnlyError(directory=Path("/tmp/store"), operation="save").operation
        'save'
    """

    __module__ = "substrax.checkpoint"

    template = (
        "cannot {operation}: the checkpoint store at {directory} was opened read_only=True; "
        "open it without read_only to save or delete"
    )
    directory: Path
    operation: str


class DistributedNotInitializedError(StructuredError, RuntimeError, kw_only=True):
    """Several jax processes run but ``jax.distributed`` has no client to agree through.

    Example:
        >>> from substrax.checkpoint import DistributedNotInitializedError
        >>> DistributedNotInitializedError(process_count=2, needed_by="the checkpoint store").args[0]
        'there are 2 jax processes but no jax.distributed client; call ...'
    """

    __module__ = "substrax.checkpoint"

    template = (
        "there are {process_count} jax processes but no jax.distributed client; call "
        "jax.distributed.initialize() before using {needed_by}"
    )
    process_count: int
    needed_by: str


class UpgradeDestinationError(StructuredError, ValueError, kw_only=True):
    """``upgrade_checkpoints`` was given a destination it must not write into.

    ``reason`` is ``"is the source"``, ``"is not empty"`` or ``"is not a directory"`` (a file
    stands at the destination or at one of its parents).

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import UpgradeDestinationError
        >>> UpgradeDestinationError(destination=Path("/tmp/a"), reason="is not empty").args[0]
        'destination /tmp/a is not empty; upgrade into a new, empty directory'
    """

    __module__ = "substrax.checkpoint"

    template = "destination {destination} {reason}; upgrade into a new, empty directory"
    destination: Path
    reason: Literal["is the source", "is not empty", "is not a directory"]


class BestMetricNotRecordedError(StructuredError, ValueError, kw_only=True):
    """``prune`` was asked to keep the best steps by a metric that no step of the store records.

    A misspelled ``best_metric`` would otherwise protect nothing and let the other rules delete
    the best step. ``recorded`` lists the metric names the store's steps do record.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import BestMetricNotRecordedError
        >>> error = BestMetricNotRecordedError(
        ...     metric="lsos", directory=Path("/tmp/store"), recorded=("loss",)
        ... )
        >>> error.args[0]
        "no step in /tmp/store records the metric 'lsos' that keep_best ranks by (the steps record: loss); pass one of those as best_metric, or drop keep_best"
    """

    __module__ = "substrax.checkpoint"

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
