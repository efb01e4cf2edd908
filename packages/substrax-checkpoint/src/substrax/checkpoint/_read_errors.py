"""The errors of opening and reading a store, each carrying the values it complains about."""

from dataclasses import dataclass
from pathlib import Path

from substrax.support import PicklableError, StructuredError


class _ReadError(StructuredError, public_module="substrax.checkpoint"):
    """The base of the read errors: each shows as ``substrax.checkpoint``'s, where users import it."""


class CheckpointNotFoundError(_ReadError, FileNotFoundError, kw_only=True):
    """The store holds no step ``step`` (None: the latest step was asked of an empty store).

    ``available`` lists the steps held; ``deleted`` is True when the step was deleted (by a
    writer's retention, or ``delete``) while it was read.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointNotFoundError
        >>> CheckpointNotFoundError(step=None, directory=Path("/tmp/store")).args[0]
        'the checkpoint store at /tmp/store is empty (no step saved yet): ...'
    """

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


class CheckpointDtypeMismatchError(_ReadError, ValueError, kw_only=True):
    """Restoring would change the dtype of at least one leaf; pass ``cast_dtypes=True`` to allow it.

    Example:
        >>> from substrax.checkpoint import CheckpointDtypeMismatchError, DtypeMismatch
        >>> mismatch = DtypeMismatch(item="model", leaf="w", saved="float64", restored="float32")
        >>> CheckpointDtypeMismatchError(step=1, mismatches=(mismatch,)).mismatches[0].leaf
        'w'
    """

    step: int
    mismatches: tuple[DtypeMismatch, ...]

    def _message(self) -> str:
        mismatches = self.mismatches
        shown = "; ".join(
            f"{m.item}:{m.leaf or '<root>'} {m.saved} -> {m.restored}" for m in mismatches[:5]
        )
        hint = ""
        if any(m.saved.endswith("64") and m.restored.endswith("32") for m in mismatches):
            hint = (
                " (a 64-bit value narrows while x64 is off: set jax_enable_x64 to keep it; a cast"
                " wraps an integer past the 32-bit range)"
            )
        return (
            f"restoring step {self.step} would change {len(mismatches)} dtype(s): "
            f"{shown}{hint}; pass cast_dtypes=True to cast, or use a template with the stored dtypes"
        )


class CheckpointCorruptError(_ReadError, ValueError, kw_only=True):
    """A file of the step fails its checksum, or is missing or damaged: it cannot be restored.

    ``item`` and ``leaf`` name the array (``model``, ``layer0/kernel``), ``path`` the damaged
    file, ``detail`` what was found (the manifest's size or CRC-32C against the file's, or what
    orbax raised); ``step`` is None when its directory is not named by a step number.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointCorruptError
        >>> CheckpointCorruptError(
        ...     step=7, item="model", leaf="w", directory=Path("/s"), path=Path("/s/7")
        ... ).args[0]
        "checkpoint step 7 in /s is corrupted: item 'model' leaf 'w' is damaged (/s/7: checksum ..."
    """

    step: int | None
    item: str
    leaf: str
    directory: Path
    path: Path
    detail: str = "checksum mismatch"

    def _message(self) -> str:
        return (
            f"checkpoint step {self.step} in {self.directory} is corrupted: item {self.item!r} "
            f"leaf {self.leaf!r} is damaged ({self.path}: {self.detail}); restore an earlier step "
            "(list_steps()), and check the others with `python -m substrax.checkpoint verify DIR`"
        )


def unreadable_record(path: Path, step: int, error: Exception) -> CheckpointCorruptError:
    """``CheckpointCorruptError`` for the metadata record at ``path`` that does not read as one."""
    lines = [line.strip() for line in str(error).splitlines()]
    text = " ".join(line for line in lines[:3] if not line.startswith("For further information"))
    text = text.encode("utf-8", "backslashreplace").decode()  # printable, whatever it quotes
    return CheckpointCorruptError(
        step=step,
        item="metadata",
        leaf="<root>",
        directory=path.parent.parent.parent,
        path=path,
        detail=f"the step's metadata record does not read back ({text[:300]})",
    )


class CheckpointStoreNotFoundError(_ReadError, FileNotFoundError, kw_only=True):
    """A store opened to be read does not exist.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreNotFoundError
        >>> CheckpointStoreNotFoundError(directory=Path("/no/such/store")).directory
        PosixPath('/no/such/store')
    """

    template = (
        "no checkpoint store at {directory}: the directory does not exist; "
        "check the path (a writer creates it when it opens the store)"
    )
    directory: Path


class CheckpointStoreNotADirectoryError(_ReadError, NotADirectoryError, kw_only=True):
    """The path of a store is a file, not a directory.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreNotADirectoryError
        >>> CheckpointStoreNotADirectoryError(directory=Path("/etc/hostname")).directory
        PosixPath('/etc/hostname')
    """

    template = (
        "{directory} is not a directory: a file stands at that path or above it; "
        "pass the checkpoint store's directory"
    )
    directory: Path


class CheckpointStoreClosedError(_ReadError, RuntimeError, kw_only=True):
    """The store was used after ``close()``.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointStoreClosedError
        >>> CheckpointStoreClosedError(directory=Path("/tmp/store")).directory
        PosixPath('/tmp/store')
    """

    template = (
        "the checkpoint store at {directory} is closed; "
        "open a new OrbaxCheckpointStore on the directory to use it again"
    )
    directory: Path


class CheckpointWaitTimeoutError(_ReadError, TimeoutError, kw_only=True):
    """``wait_for_step`` saw no step newer than ``after`` committed within ``timeout`` seconds.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import CheckpointWaitTimeoutError
        >>> CheckpointWaitTimeoutError(directory=Path("/s"), after=3, timeout=1, latest_step=3).args[0]
        'no step after 3 was committed in /s within 1 s (latest step: 3); ...'
    """

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
