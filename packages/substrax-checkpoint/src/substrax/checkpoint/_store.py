"""``OrbaxCheckpointStore``, the step-addressed store (its reads are ``StoreReads``), and upgrades."""

import contextlib
import dataclasses
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, cast

import jax
import numpy as np

from substrax.typing import JsonValue

from . import _trees
from ._index import IndexBook
from ._lock import agreed_record, all_call, is_primary, take_writer_lock
from ._manager import Layout, empty_deleted, remove_partial_steps
from ._metadata import Producer
from ._names import check_file_names
from ._paths import check_store_directory, make_store_directory
from ._protocol import PyTree
from ._reads import StoreReads
from ._retention import ModeLike, RetentionPolicy, prunable
from ._save import SaveRequest, Writer
from ._write_errors import CheckpointNotWrittenError, CheckpointWriteError


_logger = logging.getLogger(__name__)
_writers: dict[Path, "weakref.ref[OrbaxCheckpointStore]"] = {}  # each directory's newest writer
_writers_guard = threading.Lock()
os.register_at_fork(after_in_child=_writers.clear)  # a child writes nothing of its parent's
AT_EXIT_TIMEOUT: Final = 10.0  # the most seconds the interpreter's exit waits for unclosed saves


def _finish_at_exit() -> None:
    """At interpreter exit, finish the pending write of every writer store nobody closed.

    Registered with ``threading``'s exit hooks: they run before ``concurrent.futures`` joins
    its threads and refuses work, and before ``atexit`` (where ``weakref.finalize`` would have
    released the writer lock). No thread starts there, so only a write orbax committed is kept.
    """
    with _writers_guard:
        stores = [store for ref in _writers.values() if (store := ref()) is not None]
    deadline = time.monotonic() + AT_EXIT_TIMEOUT
    for store in stores:
        store.finish_at_exit(deadline - time.monotonic())


with contextlib.suppress(AttributeError, RuntimeError):  # no such hook, or already exiting
    threading._register_atexit(_finish_at_exit)  # pyright: ignore[reportAttributeAccessIssue, reportPrivateUsage]


def _forget_writer(store: "OrbaxCheckpointStore") -> None:
    """``store`` closed: it is no longer its directory's writer."""
    with _writers_guard:
        current = _writers.get(store.directory)
        if current is not None and current() in (store, None):
            del _writers[store.directory]


class OrbaxCheckpointStore(StoreReads):
    """A step-addressed store: each step holds named items beside one ``CheckpointMetadata``.

    Every step is written by orbax's ``CheckpointManager`` (plain orbax restores it) and
    appears on disk only once complete, with a manifest of its files' sizes and CRC-32Cs that
    ``restore`` and ``verify`` check. Saves are asynchronous by default: ``save`` holds the
    state still (a copy on each accelerator) and returns while orbax's save runs on a writer
    thread (with several processes, once orbax copied the arrays to host memory); a failed
    background write raises ``CheckpointWriteError`` at the next ``save``, ``wait`` or ``close``.
    Close the store (or use a ``with`` block) before the program ends: a write still running
    when the interpreter exits cannot finish (Python starts no thread then, and orbax's write
    needs new ones), and a warning names the step lost; one orbax already committed is kept.

    One writer, many readers: a writer takes the directory's lock (freed by the kernel when the
    process dies) and a second writer is refused at open with ``CheckpointLockedError``; in one
    process the newest writer store of a directory takes over, and the earlier one refuses
    writes with ``CheckpointStoreSupersededError``. ``read_only=True`` opens take no lock, never
    write and, in a multi-process job, wait for no other process (process 0 alone may restore);
    an evaluator follows a live run with ``wait_for_step``.

    Args:
        directory: the store's root (a writer creates it at open; a reader needs it to exist).
        max_to_keep: keep the latest this many steps (None keeps all).
        keep_best: also keep the best this many steps by ``best_metric``.
        best_metric: the metric that ``keep_best`` ranks by.
        best_mode: ``Mode.MIN``/``"min"`` or ``Mode.MAX``/``"max"``.
        keep_every: also keep every step divisible by this.
        async_save: False makes ``save`` return only once the step is committed.
        use_ocdbt: store each item's arrays in one OCDBT database rather than one per array.
        use_zarr3: write arrays as zarr v3 rather than v2 (every layout reads back either way).
        use_compression: zstd-compress array chunks (smaller files, slower saves and restores).
        use_checksums: write each step's manifest and check the files a restore reads against it.
        read_only: open to read only: no lock, no cleanup, no index written, saves refused.

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
        self._lease = lease
        self._writer = Writer(self._directory, lease, manifests=use_checksums)
        self._release = weakref.finalize(self, self._writer.release)
        held = weakref.WeakMethod(self._held_steps)  # a store nobody holds is collected

        def held_steps() -> list[int]:
            method = held()
            return [] if method is None else method()

        self._book = IndexBook(
            self._directory,
            read_only=read_only,
            steps=held_steps,
            run=self._writer.chore,
            intact=self._writer.intact,
        )
        self._warned = set[str]()
        if not read_only:
            self._take_over()

    def _take_over(self) -> None:
        """Become the directory's writer in this process; the earlier writer store hands over."""
        with _writers_guard:
            earlier = _writers.get(self._directory)
            _writers[self._directory] = weakref.ref(self)
        previous = earlier() if earlier is not None else None
        if previous is not None and previous is not self:
            previous._hand_over()

    def _hand_over(self) -> None:
        """A newer writer store of this process opened the directory: finish, then only read."""
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
        self._book.follow()
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
            if not self._closed:
                try:
                    self.wait()
                finally:
                    self._closed = True
                    self._writer.stop_thread()
                    if self._manager_ is not None:
                        self._manager_.close()
                    self._release()  # the writer lock, once this store's writes are done
        finally:
            _forget_writer(self)

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
        is below the latest step, is the name of a folder that is not a step, or orbax rejects
        it. With ``overwrite`` the step replaced is kept aside until the new one is committed,
        and put back if the write fails. A write that fails raises ``CheckpointWriteError``
        naming its cause: here when blocking, else at the next ``save`` (this step is not
        written either; its ``unwritten`` names both), ``wait`` or ``close``. A NaN or infinite metric is recorded aside, never ranked;
        leaves orbax would store under one name raise ``CheckpointLeafNameCollisionError``,
        and with ``use_ocdbt=False`` a leaf whose keys make no file path ``ValueError``; a
        directory removed since the store opened raises ``CheckpointStoreRemovedError``. With
        several processes a refusal is decided by process 0, as are the metrics, ``epoch`` and
        ``extra`` recorded (so retention keeps the same steps on every process); a host-local
        ``jax.Array`` or NumPy leaf is saved as process 0's value; processes that save
        different steps or trees (an item or leaf some lack, or a leaf of another kind), or
        that opened different directories, raise ``ValueError``, each of them, naming what
        differs, and a save that a process never joins ``CheckpointWriteError`` naming it.

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
        step = int(step) if isinstance(step, np.integer) else step  # as restore takes it
        epoch = int(epoch) if isinstance(epoch, np.integer) else epoch  # recorded as JSON
        request = SaveRequest.build(
            step, items, epoch=epoch, metrics=metrics, producer=producer, extra=extra
        )
        if not self._layout.ocdbt:  # one directory per array: the file system's names
            check_file_names(request.items)
        kinds = _trees.leaf_kinds(items) if jax.process_count() > 1 else {}
        shared = self._lease is None or self._lease.shared()  # process 0's directory too
        record = agreed_record(request.record, self._directory, leaves=kinds, shared=shared)
        request = dataclasses.replace(request, record=record)
        self._check_open()
        try:
            self._finish_write()  # the index write it leaves running is ordered before the next
        except (CheckpointWriteError, CheckpointNotWrittenError) as error:  # neither is this one
            unwritten = (*error.unwritten, step)
            raise dataclasses.replace(cast("Any", error), unwritten=unwritten) from error.__cause__
        self._writer.write(
            self._writable_manager,
            request,
            steps=self.list_steps(),
            overwrite=overwrite,
            async_save=self._async,
            book=self._book,
        )
        if not self._async:
            self.wait()
        return self._step_dir(step)

    def delete(self, step: int) -> None:
        """Remove ``step``; a step the store does not hold is ``CheckpointNotFoundError``.

        With several processes every process calls it: one that does not within 5 minutes
        fails the others' with ``ValueError`` naming it, the step left in place.

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
        self._require(step)
        all_call("delete", step, self._directory)  # with several processes, each calls it
        self._writable_manager().delete(step)
        self._empty_deleted()
        self._book.deleted(step)

    def _empty_deleted(self) -> None:
        if is_primary():  # orbax renames a deleted step on process 0 only
            empty_deleted(self._directory)

    def prune(self) -> list[int]:
        """Apply the retention rules to every stored step now; return the deleted steps.

        A ``keep_best`` rule by a metric no stored step records is ``BestMetricNotRecordedError``.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.prune()
            []
        """
        self._check_current("prune")
        self.wait()
        doomed = prunable(self._retention, self.list_steps(), self._book.metrics(), self._directory)
        for step in doomed:
            self.delete(step)
        return doomed

    def __repr__(self) -> str:
        return f"OrbaxCheckpointStore({str(self._directory)!r}, retention={self._retention})"
