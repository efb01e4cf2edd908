"""Copy a store of any format this release reads into the current format, leaving the source as is."""

from pathlib import Path

from ._errors import CheckpointStoreNotFoundError, UpgradeDestinationError
from ._store import OrbaxCheckpointStore


def upgrade_checkpoints(source: str | Path, destination: str | Path) -> list[int]:
    """Rewrite every step of ``source`` into ``destination`` in the current format.

    The source is only read. A destination equal to the source, one that already holds
    anything, or a file (at the destination or one of its parents) is refused with ``UpgradeDestinationError`` (a ValueError); a missing source is
    ``CheckpointStoreNotFoundError``. Dtype changes (64-bit data while x64 is off) raise
    ``CheckpointDtypeMismatchError`` rather than narrowing silently.

    Returns:
        The upgraded steps, ascending.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.checkpoint import upgrade_checkpoints
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     upgrade_checkpoints(Path(directory), Path(directory) / "upgraded")
        []
    """
    src = Path(source).expanduser().resolve()
    dst = Path(destination).expanduser().resolve()
    if src == dst:
        raise UpgradeDestinationError(destination=dst, reason="is the source")
    if any(path.exists() and not path.is_dir() for path in (dst, *dst.parents)):
        raise UpgradeDestinationError(destination=dst, reason="is not a directory")
    if dst.exists() and any(dst.iterdir()):
        raise UpgradeDestinationError(destination=dst, reason="is not empty")
    if not src.is_dir():
        raise CheckpointStoreNotFoundError(directory=src)
    upgraded: list[int] = []
    with (
        OrbaxCheckpointStore(src, max_to_keep=None, read_only=True) as reader,
        OrbaxCheckpointStore(dst, max_to_keep=None, async_save=False) as writer,
    ):
        for step in reader.list_steps():
            checkpoint = reader.restore(step)
            record = checkpoint.metadata
            writer.save(
                step,
                checkpoint.items,
                epoch=record.epoch,
                metrics=record.metrics,
                producer=record.producer,
                extra=record.extra,
            )
            upgraded.append(step)
    return upgraded
