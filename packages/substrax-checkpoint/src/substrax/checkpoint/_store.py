"""``OrbaxCheckpointStore``: a step-addressed store of named PyTree items over orbax.

The store holds the semantics and delegates each job: the save path to :mod:`._save`, the
index bookkeeping to :mod:`._index`, following a live writer to :mod:`._follow`, reading a
step to :mod:`._restore` and the orbax plumbing to :mod:`._manager`.
"""

import contextlib
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import jax
import orbax.checkpoint as ocp

from substrax.support import check_mode
from substrax.typing import JsonValue

from . import _trees
from ._errors import (
    CheckpointNotFoundError,
    CheckpointStoreClosedError,
    CheckpointStoreReadOnlyError,
)
from ._follow import deleted_under_read, wait_for_step
from ._formats import StepRecord, read_step
from ._index import IndexBook
from ._lock import take_writer_lock
from ._manager import (
    Layout,
    empty_deleted,
    has_deleted,
    open_manager,
    remove_partial_steps,
    step_directories,
)
from ._metadata import CheckpointMetadata, Producer
from ._multihost import is_primary
from ._paths import check_store_directory, make_store_directory
from ._protocol import Checkpoint, PyTree
from ._restore import restore_items, stored_trees
from ._retention import ModeLike, OrbaxPreservation, RetentionPolicy
from ._save import SaveRequest, Writer


class OrbaxCheckpointStore:
    """A step-addressed store: each step holds named items beside one ``CheckpointMetadata``.

    Saves are asynchronous by default: ``save`` returns once the arrays are copied off the
    devices and the write finishes in the background; a failed background write raises
    ``CheckpointWriteError`` at the next ``save``, ``wait`` or ``close``. When every array lives
    on CPU devices (already host memory) in a single process, even orbax's setup of the write
    runs in the background: ``save`` only holds the buffers in place and returns. A step appears on disk
    only once complete (one final rename), and a reader lists only such steps.

    One writer, many readers: a store opened without ``read_only`` takes the directory's writer
    lock (``.substrax-writer.lock``, an OS lock the kernel frees when the process dies, even by
    ``kill -9``). A second writer is refused at open with ``CheckpointLockedError`` naming the
    holder (host, pid, since when): it never waits and never costs the writer a save. Stores of
    one process share the lock; in a multi-host job the job's processes together are the writer.
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
        use_ocdbt: store each item's arrays in one OCDBT database (orbax's default) rather than
            one directory per array; every layout reads back whatever the options.
        use_zarr3: write arrays as zarr v3 (the default) rather than v2.
        use_compression: zstd-compress array chunks (smaller files for compressible data, but
            slower saves and restores of typical float weights).
        use_checksums: write a CRC-32C checksum with every chunk of every zarr3 array (the
            default layouts); a restore then raises ``CheckpointCorruptError`` for bytes that
            changed on disk instead of returning them. zarr v2 arrays carry no checksums.
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
        use_ocdbt: bool = False,
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
        self._layout = Layout(
            ocdbt=use_ocdbt, zarr3=use_zarr3, compression=use_compression, checksums=use_checksums
        )
        self._read_only = read_only
        self._manager_: ocp.CheckpointManager | None = None
        self._closed = False
        if read_only:
            check_store_directory(self._directory)
        else:
            make_store_directory(self._directory)
        lease = None if read_only else take_writer_lock(self._directory, clean=remove_partial_steps)
        self._writer = Writer(self._directory, lease)
        self._release = weakref.finalize(self, self._writer.release)
        self._book = IndexBook(self._directory, read_only=read_only, steps=self._held_steps)

    # -- properties --------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The store's root directory (absolute)."""
        return self._directory

    @property
    def retention(self) -> RetentionPolicy:
        """The retention rules applied after every committed save."""
        return self._retention

    # -- opening -----------------------------------------------------------------------------

    def _manager(self, *, create: bool = False) -> ocp.CheckpointManager | None:
        self._check_open()
        self._writer.settle()
        if self._manager_ is None:
            if not create and not self._directory.is_dir():
                return None
            self._manager_ = open_manager(
                self._directory,
                layout=self._layout,
                async_save=self._async,
                read_only=self._read_only,
                preservation=OrbaxPreservation(
                    self._retention, self._book.metrics, self._book.evict
                ),
            )
        return self._manager_

    def _held_steps(self) -> list[int]:
        """The steps held: the committed step directories, or the writer's manager's steps."""
        if self._manager_ is None or self._read_only:
            return step_directories(self._directory)
        self._writer.settle()
        return sorted(self._manager_.all_steps())

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointStoreClosedError(directory=self._directory)

    def _check_writable(self, operation: str) -> None:
        if self._read_only:
            raise CheckpointStoreReadOnlyError(directory=self._directory, operation=operation)

    def _step_dir(self, step: int) -> Path:
        return self._directory / str(step)

    # -- queries -----------------------------------------------------------------------------

    def list_steps(self) -> list[int]:
        """Every stored step, ascending (a step being written by this store included).

        A ``read_only`` store lists the committed step directories at every call, so it sees
        what a writer in another process commits.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.list_steps()
            []
        """
        self._check_open()
        return self._held_steps()

    def latest_step(self) -> int | None:
        """The highest stored step, or None for an empty store.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.latest_step() is None
            True
        """
        steps = self.list_steps()
        return steps[-1] if steps else None

    def best_step(self, metric: str, *, mode: ModeLike = "min") -> int | None:
        """The step whose ``metric`` is lowest (``"min"``) or highest (``"max"``), or None.

        Steps without the metric are skipped; ties go to the earliest step. Answered from an
        in-memory index, so its cost does not grow with the number of steps.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.best_step("loss") is None
            True
        """
        return self._book.best_step(metric, check_mode("mode", mode))

    def read_metadata(self, step: int | None) -> CheckpointMetadata:
        """The metadata record of ``step`` (a legacy format-2 sidecar is mapped onto it).

        ``None`` (what ``latest_step()`` returns for an empty store) reads the latest step; on an
        empty store it raises ``CheckpointNotFoundError`` saying the store is empty.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.read_metadata(3)
            Traceback (most recent call last):
            ...
            substrax.checkpoint.CheckpointNotFoundError: no checkpoint step 3 ...
        """
        step = self._resolve(step)
        with deleted_under_read(self._directory, step):
            return self._record(step).metadata

    def _resolve(self, step: int | None) -> int:
        """``step``, or the latest step for None (an empty store raises, saying it is empty)."""
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointNotFoundError(step=None, directory=self._directory)
        return step

    def _record(self, step: int) -> StepRecord:
        if step == self._writer.pending:
            self.wait()
        if step not in self.list_steps():
            raise CheckpointNotFoundError(
                step=step, directory=self._directory, available=tuple(self.list_steps())
            )
        return read_step(self._step_dir(step), step)

    def wait_for_step(
        self, after: int | None = None, *, timeout: float, poll_interval: float = 0.5
    ) -> int:
        """Wait until a step above ``after`` (any step for None) is committed; return the newest.

        An evaluator follows a live run with it, from a ``read_only`` store in another process:
        a step counts once its directory is committed, never while it is being written. Raises
        ``CheckpointWaitTimeoutError`` (a ``TimeoutError``) after ``timeout`` seconds.

        Example:
            >>> import tempfile
            >>> import numpy as np
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as root:
            ...     with OrbaxCheckpointStore(root, async_save=False) as writer:
            ...         _ = writer.save(3, {"model": {"w": np.zeros(2)}})
            ...     with OrbaxCheckpointStore(root, read_only=True) as evaluator:
            ...         evaluator.wait_for_step(after=2, timeout=10.0)
            3
            >>> with tempfile.TemporaryDirectory() as root:
            ...     with OrbaxCheckpointStore(root, read_only=True) as evaluator:
            ...         evaluator.wait_for_step(after=3, timeout=0.1)
            Traceback (most recent call last):
            ...
            substrax.checkpoint.CheckpointWaitTimeoutError: no step after 3 was committed ...
        """
        return wait_for_step(
            self._directory,
            after,
            timeout=timeout,
            poll_interval=poll_interval,
            check_open=self._check_open,
        )

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
        when it is below the latest step, or when orbax rejects it. With several processes the
        refusal is decided by process 0 and raised on every process, and a host-local
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
        request = SaveRequest.build(
            step, items, epoch=epoch, metrics=metrics, producer=producer, extra=extra
        )
        manager = self._manager(create=True)
        assert manager is not None  # noqa: S101 - create=True always opens
        self.wait()
        self._writer.write(
            manager,
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

    def wait(self) -> None:
        """Block until the pending background write is committed; raise if it failed.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.wait()
        """
        manager = self._manager_
        if manager is None:
            return
        committed = self._writer.finish(manager, forget=self._forget, latest_step=self.latest_step)
        if committed is not None:
            self._book.committed(manager.all_steps())
            if is_primary() and has_deleted(self._directory):  # what retention renamed away
                self._writer.background().submit(empty_deleted, self._directory)

    def _forget(self, step: int) -> None:
        """A write failed: drop its step and re-read what the directory really holds."""
        if self._manager_ is not None:
            self._manager_.reload()
        self._book.failed(step, self.list_steps)

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

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.prune()
            []
        """
        self.wait()
        steps = self.list_steps()
        keep = self._retention.steps_to_keep(steps, self._book.metrics())
        doomed = [step for step in steps if step not in keep]
        for step in doomed:
            self.delete(step)
        return doomed

    def close(self) -> None:
        """Finish the pending write (raising its error, if any) and release orbax's resources.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory:
            ...     OrbaxCheckpointStore(directory).close()
        """
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._writer.stop_thread()
            if self._manager_ is not None:
                self._manager_.close()
            self._release()  # the writer lock, once this store's writes are done

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return f"OrbaxCheckpointStore({str(self._directory)!r}, retention={self._retention})"

    # -- reading -----------------------------------------------------------------------------

    def restore(
        self,
        step: int | None,
        *,
        templates: Mapping[str, PyTree] | None = None,
        cast_dtypes: bool = False,
        mesh: jax.sharding.Mesh | None = None,
        items: Sequence[str] | None = None,
    ) -> Checkpoint:
        """Read ``step``: templated items land on their templates' shardings and dtypes.

        Without a template an item comes back as stored (its saved placement when those devices
        exist here, else the first local device). A template that does not fit raises ValueError
        naming the first mismatching leaf; a dtype change raises
        ``CheckpointDtypeMismatchError`` before any array is read unless ``cast_dtypes``.
        Templates built by ``nnx.eval_shape`` under ``jax.set_mesh`` carry abstract meshes:
        pass ``mesh=`` or restore inside ``jax.set_mesh(mesh)``. ``items=`` restores only the named
        items (e.g. only ``("model",)`` for evaluation). ``step=None`` (what ``latest_step()``
        returns for an empty store) restores the latest step; on an empty store it raises
        ``CheckpointNotFoundError`` saying the store is empty, so a resume never starts from
        scratch by accident. A step that a live writer's retention (or ``delete``) removes while
        it is read raises ``CheckpointNotFoundError`` with ``deleted=True``; bytes or files of a
        step that is still there that fail their checks raise ``CheckpointCorruptError``.

        Example:
            >>> import tempfile
            >>> import numpy as np
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     _ = store.save(0, {"rng": {"seed": 3}})
            ...     store.restore(0).items["rng"]
            {'seed': 3}
        """
        step = self._resolve(step)
        with deleted_under_read(self._directory, step):
            record = self._record(step)
            manager = self._manager()
            assert manager is not None  # noqa: S101 - _record found the step
            values = restore_items(
                manager,
                step,
                record,
                templates=templates or {},
                cast_dtypes=cast_dtypes,
                mesh=mesh,
                items=items,
            )
        return Checkpoint(step, values, record.metadata)

    def describe(self, step: int) -> dict[str, list[_trees.StoredLeaf]]:
        """Every item's leaves (path, shape, dtype, bytes) read from metadata, no array read.

        Example:
            >>> import tempfile
            >>> import numpy as np
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     _ = store.save(0, {"model": {"w": np.zeros((2, 3), np.float32)}})
            ...     store.describe(0)["model"][0].nbytes
            24
        """
        with deleted_under_read(self._directory, step):
            record = self._record(step)
            manager = self._manager()
            assert manager is not None  # noqa: S101 - _record found the step
            trees = stored_trees(manager, step, record)
        return {name: _trees.describe(tree) for name, tree in trees.items()}
