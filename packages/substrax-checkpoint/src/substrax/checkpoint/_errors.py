"""The errors of the checkpoint store, each carrying the values it complains about."""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


type NotWrittenReason = Literal["exists", "below_latest", "rejected"]

_CHECKSUM = re.compile(r"checksum|digest", re.IGNORECASE)
"""Words of a report of bytes that fail their checksum (others: a missing or empty file...)."""

_REASON_ADVICE: dict[str, str] = {
    "exists": "pass overwrite=True to replace it, or save under a new step",
    "below_latest": "steps only move forward; save under a step above the latest",
    "rejected": "orbax refused the save; check the directory is writable",
}


class CheckpointNotWrittenError(RuntimeError):
    """A save was refused; ``reason`` says why (``exists``, ``below_latest`` or ``rejected``).

    Example:
        >>> error = CheckpointNotWrittenError(step=3, latest_step=5, reason="below_latest")
        >>> error.reason
        'below_latest'
    """

    def __init__(self, *, step: int, latest_step: int | None, reason: NotWrittenReason) -> None:
        self.step = step
        self.latest_step = latest_step
        self.reason: NotWrittenReason = reason
        super().__init__(
            f"checkpoint step {step} was not written ({reason}; latest step is {latest_step}): "
            f"{_REASON_ADVICE[reason]}"
        )


class CheckpointNotFoundError(FileNotFoundError):
    """The store holds no step ``step`` (None: the latest step was asked of an empty store).

    Example:
        >>> CheckpointNotFoundError(step=7, directory=Path("/tmp/store")).step
        7
        >>> CheckpointNotFoundError(step=None, directory=Path("/tmp/store")).args[0]
        'the checkpoint store at /tmp/store is empty (no step saved yet): ...'
        >>> CheckpointNotFoundError(step=7, directory=Path("/tmp/store"), deleted=True).deleted
        True

        >>> from substrax.checkpoint import CheckpointNotWrittenError
    ``deleted`` is True when the step was deleted (by a writer's retention, or ``delete``)
    while it was being read: a reader following a live run skips it and reads a later step.
    """

    def __init__(
        self,
        *,
        step: int | None,
        directory: Path,
        available: tuple[int, ...] = (),
        deleted: bool = False,
    ) -> None:
        self.step = step
        self.directory = directory
        self.available = available
        self.deleted = deleted
        if deleted:
            shown = ", ".join(map(str, available[-10:])) or "none"
            super().__init__(
                f"checkpoint step {step} in {directory} was deleted while it was read "
                f"(a writer's retention or a delete removed it; steps held: {shown}); "
                "read a step that list_steps() still lists"
            )
            return
        if step is None:
            super().__init__(
                f"the checkpoint store at {directory} is empty (no step saved yet): "
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointNotFoundError
                "check the path, or start from scratch when latest_step() is None"
            )
            return
        shown = ", ".join(map(str, available[-10:])) or "none"
        super().__init__(
            f"no checkpoint step {step} in {directory} (steps held: {shown}); "
            "call list_steps() to see what the store holds"
        )


class UnsupportedCheckpointError(ValueError):
    """The step is not a substrax checkpoint of a format this version can read.

    Example:
        >>> UnsupportedCheckpointError("format 'other' is not substrax-checkpoint").args[0]
        "format 'other' is not substrax-checkpoint"
    """


class CheckpointWriteError(RuntimeError):
    """A background write failed; raised at the next ``save``, ``wait`` or ``close``.

    Example:
        >>> CheckpointWriteError(step=4, directory=Path("/tmp/store"), cause="disk full").step
        4
    """

    def __init__(self, *, step: int, directory: Path, cause: str) -> None:
        self.step = step
        self.directory = directory
        super().__init__(
            f"checkpoint step {step} in {directory} was not committed: {cause}; "
            "the step is not in the store, save it again"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DtypeMismatch:
    """One leaf whose stored dtype differs from the dtype it would be restored as.

    Example:
        >>> DtypeMismatch(item="model", leaf="kernel/value", saved="float64", restored="float32")
        DtypeMismatch(item='model', leaf='kernel/value', saved='float64', restored='float32')
    """

    item: str
    leaf: str
    saved: str
    restored: str

        >>> from substrax.checkpoint import UnsupportedCheckpointError

class CheckpointDtypeMismatchError(ValueError):
    """Restoring would change the dtype of at least one leaf; pass ``cast_dtypes=True`` to allow it.

    Example:
        >>> mismatch = DtypeMismatch(item="model", leaf="w", saved="float64", restored="float32")
        >>> CheckpointDtypeMismatchError(step=1, mismatches=(mismatch,)).mismatches[0].leaf
        'w'
    """

    def __init__(self, *, step: int, mismatches: tuple[DtypeMismatch, ...]) -> None:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointWriteError
        self.step = step
        self.mismatches = mismatches
        shown = "; ".join(
            f"{m.item}:{m.leaf or '<root>'} {m.saved} -> {m.restored}" for m in mismatches[:5]
        )
        hint = ""
        if any(m.saved.endswith("64") and m.restored.endswith("32") for m in mismatches):
            hint = " (a 64-bit array narrows while x64 is off: set jax_enable_x64 to keep it)"
        super().__init__(
            f"restoring step {step} would change {len(mismatches)} dtype(s): {shown}{hint}; "
            "pass cast_dtypes=True to cast, or use a template with the stored dtypes"
        )


class CheckpointLockedError(RuntimeError):
    """Another process writes the store: a store has one writing process (or one multi-host job).

    ``host``, ``pid`` and ``since`` describe the holder as it recorded itself (None where the
    lock file could not be read).

        >>> from substrax.checkpoint import DtypeMismatch
    Example:
        >>> error = CheckpointLockedError(
        ...     directory=Path("/tmp/store"), host="node1", pid=4242, since="2026-01-01T00:00:00+00:00"
        ... )
        >>> error.pid
        4242
    """

    def __init__(
        self, *, directory: Path, host: str | None, pid: int | None, since: str | None
    ) -> None:
        self.directory = directory
        self.host = host
        self.pid = pid
        self.since = since
        holder = f"pid {pid if pid is not None else '?'} on host {host or '?'} since {since or '?'}"
        >>> from substrax.checkpoint import CheckpointDtypeMismatchError, DtypeMismatch
        super().__init__(
            f"the checkpoint store at {directory} is being written by another process ({holder}); "
            "open it with read_only=True to read while it writes, or stop the other writer "
            "(in a multi-host job, open the store after jax.distributed.initialize())"
        )


class CheckpointStoreNotFoundError(FileNotFoundError):
    """A store opened to be read does not exist.

    Example:
        >>> CheckpointStoreNotFoundError(directory=Path("/no/such/store")).directory
        PosixPath('/no/such/store')
    """

    def __init__(self, *, directory: Path) -> None:
        self.directory = directory
        super().__init__(
            f"no checkpoint store at {directory}: the directory does not exist; "
            "check the path (a writer creates it when it opens the store)"
        )


class CheckpointStoreNotADirectoryError(NotADirectoryError):
    """The path of a store is a file, not a directory.

    Example:
        >>> CheckpointStoreNotADirectoryError(directory=Path("/etc/hostname")).directory
        PosixPath('/etc/hostname')
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointLockedError
    """

    def __init__(self, *, directory: Path) -> None:
        self.directory = directory
        super().__init__(
            f"{directory} is not a directory: a file stands at that path or above it; "
            "pass the checkpoint store's directory"
        )


class CheckpointWaitTimeoutError(TimeoutError):
    """``wait_for_step`` saw no step newer than ``after`` committed within ``timeout`` seconds.

    Example:
        >>> CheckpointWaitTimeoutError(
        ...     directory=Path("/tmp/store"), after=3, timeout=1.0, latest_step=3
        ... ).after
        3
    """

    def __init__(
        self, *, directory: Path, after: int | None, timeout: float, latest_step: int | None
    ) -> None:
        self.directory = directory
        self.after = after
        self.timeout = timeout
        self.latest_step = latest_step
        wanted = "no step" if after is None else f"no step after {after}"
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreNotFoundError
        super().__init__(
            f"{wanted} was committed in {directory} within {timeout:g} s "
            f"(latest step: {latest_step}); check the writer is running, or pass a longer timeout="
        )


class CheckpointCorruptError(ValueError):
    """A stored array's bytes fail their checksum, or a file of the step is missing or damaged.

    The step cannot be restored as it was saved.

    Attributes:
        step: the step read (None when its directory is not named by a step number).
        item: the item holding the array (``model``, ``optimizer``...).
        leaf: the array's path in the item (``layer0/kernel``).
        directory: the checkpoint store's root.
        path: the file (or the array's directory) whose bytes are corrupted.
        detail: what TensorStore found.
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreNotADirectoryError

    Example:
        >>> error = CheckpointCorruptError(
        ...     step=7, item="model", leaf="w", directory=Path("/tmp/store"), path=Path("/tmp/store/7")
        ... )
        >>> (error.step, error.item, error.leaf)
        (7, 'model', 'w')
    """

    def __init__(
        self,
        *,
        step: int | None,
        item: str,
        leaf: str,
        directory: Path,
        path: Path,
        detail: str = "checksum mismatch",
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointWaitTimeoutError
    ) -> None:
        self.step = step
        self.item = item
        self.leaf = leaf
        self.directory = directory
        self.path = path
        self.detail = detail
        super().__init__(
            f"checkpoint step {step} in {directory} is corrupted: item {item!r} leaf {leaf!r} "
            f"{'fails its checksum' if _CHECKSUM.search(detail) else 'is damaged'} "
            f"({path}: {detail}); restore an earlier step (list_steps()), "
            "and check the others with `python -m substrax.checkpoint verify DIR`"
        )
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointCorruptError
