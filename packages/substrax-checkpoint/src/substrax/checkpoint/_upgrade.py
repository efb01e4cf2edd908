"""upgrade_checkpoints: a store of any readable format copied, step by step, into the current one."""

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType

import jax

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
    ``CheckpointDtypeMismatchError`` rather than narrowing silently. The copy runs on a thread
    of its own (under the caller's x64 setting), so Ctrl-C never cuts orbax's write short: the
    step being written is finished, what was copied removed, then ``KeyboardInterrupt`` raised
    (a further Ctrl-C does not shorten that wait of one step).

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
    stop = threading.Event()
    x64 = bool(jax.config.jax_enable_x64)  # the caller's, which may be its thread's alone
    # the copy runs on a thread of its own: Ctrl-C reaches this one, never orbax's write
    with ThreadPoolExecutor(1, thread_name_prefix="substrax-checkpoint-upgrade") as pool:
        copying = pool.submit(_copy_steps, src, dst, staging, stop, x64=x64)
        with _stopped_by_ctrl_c(stop):
            try:
                upgraded = copying.result()
            except KeyboardInterrupt:  # the step in flight is written, then the copy removed
                stop.set()
                upgraded = _wait_out(copying)
                if upgraded is None:  # stopped before its last step: what it copied is gone
                    raise
    if upgraded is None:  # a Ctrl-C whose KeyboardInterrupt Python dropped (in a gc callback)
        signal.default_int_handler(signal.SIGINT, None)  # raises it
    return upgraded or []


@contextlib.contextmanager
def _stopped_by_ctrl_c(stop: threading.Event) -> Generator[None]:
    """Have Ctrl-C set ``stop`` before the handler in place runs (on the main thread).

    Python drops an exception raised while a gc callback runs (jax has one), so a Ctrl-C's
    ``KeyboardInterrupt`` alone could be lost, and the upgrade go on to its end.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield  # SIG_IGN: Ctrl-C is ignored; SIG_DFL: it ends the process
        return

    def on_ctrl_c(signum: int, frame: FrameType | None) -> None:
        stop.set()
        previous(signum, frame)

    signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _wait_out(copying: "Future[list[int] | None]") -> list[int] | None:
    """The copy's result once it ends; a further Ctrl-C cuts no write short (nor this wait)."""
    while True:
        try:
            return copying.result()
        except KeyboardInterrupt:
            continue


def _copy_steps(
    src: Path, dst: Path, staging: Path, stop: threading.Event, *, x64: bool
) -> list[int] | None:
    """Copy every step of ``src`` into ``staging``, then rename it ``dst``; return the steps.

    Once ``stop`` is set no further step starts: ``staging`` is removed and None returned.
    """
    upgraded: list[int] = []
    step = None
    try:
        with (
            jax.enable_x64(x64),
            OrbaxCheckpointStore(src, max_to_keep=None, read_only=True) as reader,
            OrbaxCheckpointStore(staging, max_to_keep=None, async_save=False) as writer,
        ):
            for step in reader.list_steps():
                if stop.is_set():
                    break
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
        if stop.is_set():  # interrupted: the stores are closed, their writes done
            shutil.rmtree(staging, ignore_errors=True)
            return None
        if dst.exists():
            dst.rmdir()  # empty, as checked
        staging.rename(dst)
    except BaseException as error:  # no half-written destination: what it copied goes
        error.add_note(f"upgrading step {step} of {src}; {dst} is left as it was")
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return upgraded
