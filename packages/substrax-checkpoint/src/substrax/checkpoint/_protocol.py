"""The ``CheckpointStore`` protocol and the ``Checkpoint`` a restore returns."""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from substrax.typing import JsonValue, PyTree

from ._metadata import CheckpointMetadata, Producer
from ._retention import ModeLike


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One restored step: its number, its items by name, and its metadata record.

    Example:
        >>> from substrax.checkpoint import CheckpointMetadata, Checkpoint
        >>> record = CheckpointMetadata(step=1, items=("model",))
        >>> Checkpoint(1, {"model": {"w": 1.0}}, record).items["model"]
        {'w': 1.0}
    """

    step: int
    items: dict[str, PyTree]
    metadata: CheckpointMetadata
    verified: bool = False
    """Whether the files read matched the step's manifest (False: no manifest, or checks off)."""


@runtime_checkable
class CheckpointStore(Protocol):
    """A step-addressed store of named PyTree items, each step with one metadata record.

    Example:
        >>> import tempfile
        >>> from substrax.checkpoint import OrbaxCheckpointStore, CheckpointStore
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     with OrbaxCheckpointStore(directory) as store:
        ...         isinstance(store, CheckpointStore)
        True
    """

    def save(
        self,
        step: int,
        items: Mapping[str, PyTree],
        *,
        epoch: int | None = None,
        metrics: Mapping[str, float] | None = None,
        producer: Producer | None = None,
        extra: Mapping[str, JsonValue] | None = None,
        overwrite: bool = False,
    ) -> Path:
        """Write ``items`` as step ``step``; a NaN or infinite metric is recorded aside, never fails it."""
        ...

    def restore(
        self,
        step: int,
        *,
        templates: Mapping[str, PyTree] | None = None,
        cast_dtypes: bool = False,
    ) -> Checkpoint:
        """Read step ``step``, placing arrays as their templates say."""
        ...

    def read_metadata(self, step: int) -> CheckpointMetadata:
        """The metadata record of step ``step``."""
        ...

    def list_steps(self) -> list[int]:
        """Every stored step, ascending."""
        ...

    def latest_step(self) -> int | None:
        """The highest stored step, or None."""
        ...

    def best_step(self, metric: str, *, mode: ModeLike = "min") -> int | None:
        """The step with the best ``metric``, or None."""
        ...

    def delete(self, step: int) -> None:
        """Remove step ``step``."""
        ...

    def close(self) -> None:
        """Finish pending writes and release the store."""
        ...
