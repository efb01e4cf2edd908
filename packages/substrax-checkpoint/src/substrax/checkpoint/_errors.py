"""The errors of the checkpoint store, each carrying the values it complains about."""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


type NotWrittenReason = Literal["exists", "below_latest", "rejected"]

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
    """The store holds no step ``step``.

    Example:
        >>> CheckpointNotFoundError(step=7, directory=Path("/tmp/store")).step
        7
    """

    def __init__(self, *, step: int, directory: Path, available: tuple[int, ...] = ()) -> None:
        self.step = step
        self.directory = directory
        self.available = available
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


class CheckpointDtypeMismatchError(ValueError):
    """Restoring would change the dtype of at least one leaf; pass ``cast_dtypes=True`` to allow it.

    Example:
        >>> mismatch = DtypeMismatch(item="model", leaf="w", saved="float64", restored="float32")
        >>> CheckpointDtypeMismatchError(step=1, mismatches=(mismatch,)).mismatches[0].leaf
        'w'
    """

    def __init__(self, *, step: int, mismatches: tuple[DtypeMismatch, ...]) -> None:
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
