"""upgrade_checkpoints: a store of any readable format copied, step by step, into the current one."""

import os
import shutil
from pathlib import Path

from ._extra import NONFINITE_METRICS_KEY
from ._manifest import MANIFEST_FILE
from ._read_errors import CheckpointStoreNotFoundError
from ._store import OrbaxCheckpointStore
from ._write_errors import UpgradeDestinationError


def upgrade_checkpoints(source: str | Path, destination: str | Path) -> list[int]:
    """Rewrite every step of ``source`` (only read) into ``destination``; return them, ascending.

    The steps are written into ``.<destination>.upgrading-<pid>`` beside it, renamed to
    ``destination`` once all are there: a killed upgrade leaves no store that looks whole. A
    step without a manifest (unverified: its files were not checked when written) stays
    unverified: the copy gets no manifest either. A destination equal to the source, not
    empty, or a file is ``UpgradeDestinationError``; a missing source is
    ``CheckpointStoreNotFoundError``; 64-bit data while x64 is off is
    ``CheckpointDtypeMismatchError`` rather than narrowing silently.

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
    staging = dst.with_name(f".{dst.name}.upgrading-{os.getpid()}")
    upgraded: list[int] = []
    step = None
    try:
        with (
            OrbaxCheckpointStore(src, max_to_keep=None, read_only=True) as reader,
            OrbaxCheckpointStore(staging, max_to_keep=None, async_save=False) as writer,
        ):
            for step in reader.list_steps():
                checkpoint = reader.restore(step)
                record = checkpoint.metadata
                extra = {k: v for k, v in record.extra.items() if k != NONFINITE_METRICS_KEY}
                written = writer.save(  # a NaN metric is given as one again: the save records it so
                    step,
                    checkpoint.items,
                    epoch=record.epoch,
                    metrics={**record.metrics, **record.nonfinite_metrics},
                    producer=record.producer,
                    extra=extra,
                )
                if not checkpoint.verified:  # no manifest after the fact: what it read, unchecked
                    (written / MANIFEST_FILE).unlink(missing_ok=True)
                upgraded.append(step)
        if dst.exists():
            dst.rmdir()  # empty, as checked
        staging.rename(dst)
    except BaseException as error:  # no half-written destination: what it copied goes
        error.add_note(f"upgrading step {step} of {src}; {dst} is left as it was")
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return upgraded
