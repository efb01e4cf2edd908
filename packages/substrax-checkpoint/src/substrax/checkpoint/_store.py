"""``OrbaxCheckpointStore``: a step-addressed store of named PyTree items over orbax.

The store opens the directory and writes: saving, deleting and pruning steps. Its reads
(restore, describe, metadata, the best step, waiting for a step) are inherited from
:class:`._reads.StoreReads`, and listing steps, finishing the pending write and closing from
:class:`._lifecycle.StoreLifecycle`. The save path itself is :mod:`._save`, the index
bookkeeping :mod:`._index` and the orbax plumbing :mod:`._manager`.
"""

import logging
import os
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path

from substrax.typing import JsonValue

from ._errors import (
    BestMetricNotRecordedError,
    CheckpointNotFoundError,
    CheckpointNotWrittenError,
    CheckpointWriteError,
)
from ._index import IndexBook
from ._lock import take_writer_lock
from ._manager import Layout, empty_deleted, remove_partial_steps
from ._metadata import Producer
from ._multihost import is_primary
from ._paths import check_store_directory, make_store_directory
from ._protocol import PyTree
from ._reads import StoreReads
from ._retention import ModeLike, OrbaxPreservation, RetentionPolicy, recorded_metrics
from ._save import SaveRequest, Writer


_logger = logging.getLogger(__name__)
_writers: dict[Path, "weakref.ref[OrbaxCheckpointStore]"] = {}  # each directory's newest writer
_writers_guard = threading.Lock()
os.register_at_fork(after_in_child=_writers.clear)  # a child writes nothing of its parent's


def _forget_writer(store: "OrbaxCheckpointStore") -> None:
    """``store`` closed: it is no longer its directory's writer."""
    with _writers_guard:
        current = _writers.get(store.directory)
        if current is not None and current() in (store, None):
            del _writers[store.directory]


class OrbaxCheckpointStore(StoreReads):
    """A step-addressed store: each step holds named items beside one ``CheckpointMetadata``.

    Saves are asynchronous by default: in a single process ``save`` holds the state still (a
    copy on each accelerator, dispatched without waiting; CPU buffers held in place) and
    returns, and orbax's whole save, its copy to host memory included, runs on a writer thread;
    with several processes, ``save`` returns once orbax copied the arrays to host memory. A
    failed background write raises ``CheckpointWriteError`` at the next ``save``, ``wait`` or
    ``close``. The accelerator copy holds as much device memory as the state until orbax has it
    in host memory (where there is no room, the save makes orbax's blocking copy instead). Every step is
    written by orbax's ``CheckpointManager`` (its public API only; plain orbax restores any step
    the store wrote). A step appears on disk only once complete (orbax's final rename), and a
    reader lists only such steps; its array files are fsynced as orbax does by default. Once orbax
    commits a step, the store writes its manifest beside it (every file's size and CRC-32C,
    written atomically), which ``restore`` and ``verify`` check.

    One writer, many readers: a store opened without ``read_only`` takes the directory's writer
    lock (``.substrax-writer.lock``, an OS lock the kernel frees when the process dies, even by
    ``kill -9``). A second writer is refused at open with ``CheckpointLockedError`` naming the
    holder (host, pid, since when): it never waits and never costs the writer a save. Within one
    process the newest writer store of a directory is its writer (a notebook cell run again
    opens a second store while the first is still open): opening it finishes the earlier
    store's pending write, and the earlier store then refuses ``save``, ``delete`` and ``prune``
    with ``CheckpointStoreSupersededError`` while its reads follow the directory as a reader's,
    so two stores never apply two retention decisions to one directory. In a multi-host job the
    job's processes together are the writer.
    Only the lock's new holder removes the leftovers of an interrupted save, when it opens.
    ``read_only=True`` opens take no lock and never write, delete or rename anything; an
    evaluator follows a live run with ``wait_for_step``.

    Args:
        directory: the store's root (a writer creates it at open; a reader needs it to exist).
        max_to_keep: keep the latest this many steps (None keeps all).
        keep_best: also keep the best this many steps by ``best_metric``.
        best_metric: the metric that ``keep_best`` ranks by.
        best_mode: ``Mode.MIN``/``"min"`` or ``Mode.MAX``/``"max"``.
        keep_every: also keep every step divisible by this.
        async_save: False makes ``save`` return only once the step is committed.
        use_ocdbt: store each item's arrays in one OCDBT database (the default, as orbax's:
            a few files per item, so saves cost less per array) rather than one directory per
            array (whose damaged files a restore names by array); every layout reads back
            whatever the options.
        use_zarr3: write arrays as zarr v3 (the default) rather than v2.
        use_compression: zstd-compress array chunks (smaller files for compressible data, but
            slower saves and restores of typical float weights).
        use_checksums: write each committed step's manifest (every file's size and CRC-32C)
            and check the files a restore reads against it: bytes changed on disk raise
            ``CheckpointCorruptError`` instead of coming back. Every layout has one.
        read_only: open to read only: no lock, no cleanup, no index written, saves refused; a
            missing directory raises ``CheckpointStoreNotFoundError`` (a ``FileNotFoundError``).

    Raises:
        CheckpointLockedError: another process holds the writer lock (writers only).
        CheckpointStoreNotFoundError: ``read_only`` and the directory does not exist.
        CheckpointStoreNotADirectoryError: the path is a file.

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> from substrax.checkpoint import OrbaxCheckpointStore
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     with OrbaxCheckpointStore(directory, max_to_keep=2) as store:
        ...         _ = store.save(1, {"model": {"w": np.ones(3, np.float32)}}, metrics={"loss": 0.5})
        ...         store.restore(1).items["model"]["w"].tolist()
        [1.0, 1.0, 1.0]
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_to_keep: int | None = 5,
        keep_best: int = 0,
        best_metric: str | None = None,
        best_mode: ModeLike = "min",
        keep_every: int | None = None,
        async_save: bool = True,
        use_ocdbt: bool = True,
        use_zarr3: bool = True,
        use_compression: bool = False,
        use_checksums: bool = True,
        read_only: bool = False,
    ) -> None:
        if not str(directory).strip():
            raise ValueError("directory is empty; pass the path of the checkpoint store")
        self._directory = Path(directory).expanduser().resolve()
        self._retention = RetentionPolicy(
            max_to_keep=max_to_keep,
            keep_best=keep_best,
            best_metric=best_metric,
            best_mode=best_mode,
            keep_every=keep_every,
        )
        self._async = async_save
        self._layout = Layout(ocdbt=use_ocdbt, zarr3=use_zarr3, compression=use_compression)
        self._checksums = use_checksums
        self._read_only = read_only
        self._superseded = False
        self._manager_ = None
        self._closed = False
        if read_only:
            check_store_directory(self._directory)
        else:
            make_store_directory(self._directory)
        lease = None if read_only else take_writer_lock(self._directory, clean=remove_partial_steps)
        self._writer = Writer(self._directory, lease, manifests=use_checksums)
        self._release = weakref.finalize(self, self._writer.release)
        self._book = IndexBook(
            self._directory,
            read_only=read_only,
            steps=self._held_steps,
            run=self._writer.chore,
            intact=self._writer.intact,
        )
        self._preservation = OrbaxPreservation(
            self._retention, self._book.metrics, self._book.evict
        )
        if not read_only:
            self._take_over()

    # -- one writer store per directory and process ------------------------------------------

    def _take_over(self) -> None:
        """Become the directory's writer in this process; the earlier writer store hands over."""
        with _writers_guard:
            earlier = _writers.get(self._directory)
            _writers[self._directory] = weakref.ref(self)
        previous = earlier() if earlier is not None else None
        if previous is not None and previous is not self:
            previous._hand_over()

    def _hand_over(self) -> None:
        """A newer writer store of this process opened the directory: finish, then only read.

        The pending write is finished (its error logged: the newer store lists what it left),
        the index written, the orbax manager closed and this store's share of the writer lock
        given back; from then on writes raise ``CheckpointStoreSupersededError`` and reads follow
        the directory as a ``read_only`` store's. A store whose directory was removed under it
        keeps failing its saves with ``CheckpointStoreRemovedError`` instead.
        """
        if self._closed or self._superseded or not self._writer.intact():
            return
        try:
            self.wait()
        except Exception:
            _logger.warning(
                "a newer OrbaxCheckpointStore of this process opened %s; the pending write of "
                "the store it takes over from failed",
                self._directory,
                exc_info=True,
            )
        self._superseded = True
        manager, self._manager_ = self._manager_, None
        if manager is not None:
            manager.close()
        self._book = IndexBook(self._directory, read_only=True, steps=self._held_steps)
        self._release()  # the writer thread and this store's share of the lock

    def close(self) -> None:
        """Finish the pending write (raising its error, if any) and release orbax's resources.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory:
            ...     OrbaxCheckpointStore(directory).close()
        """
        try:
            super().close()
        finally:
            _forget_writer(self)

    # -- writing -----------------------------------------------------------------------------

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
        """Write ``items`` as step ``step`` and return the step's directory.

        Refused with ``CheckpointNotWrittenError`` when the step exists (unless ``overwrite``),
        when it is below the latest step, or when orbax rejects it. When the previous
        (background) write failed, its ``CheckpointWriteError`` is raised here and this step is
        not written either: the error's ``unwritten`` names both steps. A NaN or infinite metric
        is recorded aside (``CheckpointMetadata.nonfinite_metrics``), never ranked by
        ``best_step`` or ``keep_best``; two leaves that orbax would store under one name are
        refused with ``CheckpointLeafNameCollisionError``. When the directory was
        removed (or its writer lock file replaced) since the store opened, the writer lock went
        with it: the save raises ``CheckpointStoreRemovedError`` and creates nothing. With several
        processes the refusal is decided by process 0 and raised on every process, and a host-local
        ``jax.Array`` (a PRNG key or nnx state never placed on the global mesh) is saved as
        process 0's value: it must be equal on every process.

        Example:
            >>> import tempfile
            >>> import numpy as np
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory:
            ...     store = OrbaxCheckpointStore(directory, async_save=False)
            ...     store.save(5, {"model": {"w": np.zeros(2)}}).name
            ...     store.close()
            '5'
        """
        self._check_writable("save")
        self._writer.check_lock()  # never recreate a removed store: its lock went with it
        request = SaveRequest.build(
            step, items, epoch=epoch, metrics=metrics, producer=producer, extra=extra
        )
        self._check_open()
        try:
            self._finish_write()  # the index write it leaves running is ordered before the next
        except CheckpointWriteError as error:  # the write before failed: this one is not made
            raise CheckpointWriteError(
                step=error.step,
                directory=error.directory,
                cause=error.cause,
                unwritten=(*error.unwritten, step),
            ) from error.__cause__
        except CheckpointNotWrittenError as error:
            raise CheckpointNotWrittenError(
                step=error.step,
                latest_step=error.latest_step,
                reason=error.reason,
                unwritten=(*error.unwritten, step),
            ) from error.__cause__
        self._writer.write(
            self._writable_manager,
            request,
            steps=self.list_steps(),
            overwrite=overwrite,
            async_save=self._async,
            book=self._book,
            empty_deleted=self._empty_deleted,
        )
        if not self._async:
            self.wait()
        return self._step_dir(step)

    def delete(self, step: int) -> None:
        """Remove ``step``; a step the store does not hold is ``CheckpointNotFoundError``.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.delete(1)
            Traceback (most recent call last):
            ...
            substrax.checkpoint.CheckpointNotFoundError: no checkpoint step 1 ...
        """
        self._check_writable("delete")
        self.wait()
        manager = self._manager()
        if manager is None or step not in manager.all_steps():
            raise CheckpointNotFoundError(
                step=step, directory=self._directory, available=tuple(self.list_steps())
            )
        manager.delete(step)
        self._empty_deleted()
        self._book.deleted(step)

    def _empty_deleted(self) -> None:
        if is_primary():  # orbax renames a deleted step on process 0 only
            empty_deleted(self._directory)

    def prune(self) -> list[int]:
        """Apply the retention rules to every stored step now; return the deleted steps.

        A ``keep_best`` rule by a metric that no stored step records is refused with
        ``BestMetricNotRecordedError`` (a ValueError) and nothing is deleted.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.prune()
            []
        """
        self._check_current("prune")
        self.wait()
        steps = self.list_steps()
        metrics = self._book.metrics()
        missing = self._retention.unrecorded_metric(steps, metrics)
        if missing is not None:
            raise BestMetricNotRecordedError(
                metric=missing,
                directory=self._directory,
                recorded=tuple(recorded_metrics({s: metrics.get(s, {}) for s in steps})),
            )
        keep = self._retention.steps_to_keep(steps, metrics)
        doomed = [step for step in steps if step not in keep]
        for step in doomed:
            self.delete(step)
        return doomed

    def __repr__(self) -> str:
        return f"OrbaxCheckpointStore({str(self._directory)!r}, retention={self._retention})"
