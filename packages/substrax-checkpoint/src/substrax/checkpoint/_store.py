"""``OrbaxCheckpointStore``: a step-addressed store of named PyTree items over orbax."""

import contextlib
import math
import time
import weakref
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_for
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self, cast

import jax
import orbax.checkpoint as ocp

from substrax.typing import JsonValue

from . import _trees
from ._errors import (
    CheckpointNotFoundError,
    CheckpointNotWrittenError,
    CheckpointWaitTimeoutError,
    CheckpointWriteError,
    NotWrittenReason,
)
from ._formats import DTYPES_ITEM, METADATA_ITEM, StepRecord, read_step
from ._index import IndexEntry, StepIndex
from ._lock import WriterLease, take_writer_lock
from ._manager import (
    Layout,
    empty_deleted,
    has_deleted,
    open_manager,
    remove_partial_steps,
    save_held,
    step_directories,
)
from ._metadata import (
    CheckpointMetadata,
    Producer,
    check_extra,
    check_item_names,
    library_versions,
)
from ._multihost import agree, is_primary
from ._paths import check_store_directory, make_store_directory
from ._protocol import Checkpoint, PyTree
from ._restore import restore_items, stored_trees
from ._retention import Mode, OrbaxPreservation, RetentionPolicy, check_mode
from ._snapshot import host_snapshot


_REASONS: Final[tuple[NotWrittenReason, ...]] = ("exists", "below_latest", "rejected")


class _Resources:
    """The writer lock and thread of a store: freed at ``close`` or when the store is collected.

    It references neither the store nor its orbax manager (whose retention policy calls back
    into the store), so a store nobody closed can be collected. It cannot be while orbax still
    writes: orbax's thread holds the manager, and the manager the store.
    """

    def __init__(self, lease: WriterLease | None) -> None:
        self.lease = lease
        self.writer: ThreadPoolExecutor | None = None

    def release(self) -> None:
        lease, self.lease = self.lease, None
        try:
            if self.writer is not None:
                self.writer.shutdown()  # the save call it runs finishes first
        finally:
            if lease is not None:
                lease.release()


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
        >>> from substrax.checkpoint import OrbaxCheckpointStore
    Only the lock's new holder removes the leftovers of an interrupted save, when it opens.
    ``read_only=True`` opens take no lock and never write, delete or rename anything; an
    evaluator follows a live run with ``wait_for_step``.

    Args:
        directory: the store's root (a writer creates it at open; a reader needs it to exist).
        max_to_keep: keep the latest this many steps (None keeps all).
        keep_best: also keep the best this many steps by ``best_metric``.
        best_metric: the metric that ``keep_best`` ranks by.
        best_mode: ``"min"`` or ``"max"``.
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
        >>> with OrbaxCheckpointStore(tempfile.mkdtemp(), max_to_keep=2) as store:
        ...     _ = store.save(1, {"model": {"w": np.ones(3, np.float32)}}, metrics={"loss": 0.5})
        ...     store.restore(1).items["model"]["w"].tolist()
        [1.0, 1.0, 1.0]
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_to_keep: int | None = 5,
        keep_best: int = 0,
        best_metric: str | None = None,
        best_mode: Mode = "min",
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
        self._index_: StepIndex | None = None
        self._pending: int | None = None
        self._control: Future[bool] | None = None  # orbax's save call, run by the writer thread
        self._writer: ThreadPoolExecutor | None = None
        self._closed = False
        lease: WriterLease | None = None
        if read_only:
            check_store_directory(self._directory)
        else:
            make_store_directory(self._directory)
            lease = take_writer_lock(self._directory, clean=remove_partial_steps)
        self._resources = _Resources(lease)
        self._release = weakref.finalize(self, self._resources.release)
        self._index_steps: list[int] | None = None  # a reader's index reflects these steps

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
        if self._closed:
            raise RuntimeError(f"the checkpoint store at {self._directory} is closed")
        self._settle()
        if self._manager_ is None:
            if not create and not self._directory.is_dir():
                return None
            self._manager_ = open_manager(
                self._directory,
            >>> from substrax.checkpoint import OrbaxCheckpointStore
                layout=self._layout,
                async_save=self._async,
                read_only=self._read_only,
                preservation=OrbaxPreservation(self._retention, self._metrics, self._evicted),
            )
        return self._manager_

    def _settle(self) -> None:
        """Let the writer thread's orbax call return before this thread uses the manager.

        Only the setup of a write runs there (milliseconds); its errors surface in ``wait``.
            >>> from substrax.checkpoint import OrbaxCheckpointStore
        """
        if self._control is not None:
            wait_for([self._control])

    def _index(self) -> StepIndex:
        if self._read_only:  # a writer elsewhere adds and removes steps: follow the directory
            steps = step_directories(self._directory)
            if steps != self._index_steps:
                self._index_ = StepIndex.load(self._directory, steps, self._read_entry)
                self._index_steps = steps
            assert self._index_ is not None  # noqa: S101 - loaded above or at a previous call
            return self._index_
        if self._index_ is None:
            self._settle()
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            if self._manager_ is not None:
                steps = list(self._manager_.all_steps())
            else:  # a directory listing is enough: a step directory exists only once committed
                steps = step_directories(self._directory)
            self._index_ = StepIndex.load(self._directory, steps, self._read_entry)
        return self._index_

    def _read_entry(self, step: int) -> IndexEntry | None:
        try:
            record = read_step(self._step_dir(step), step)
        except (OSError, ValueError):
            return None
        return IndexEntry(epoch=record.metadata.epoch, metrics=dict(record.metadata.metrics))

    def _evicted(self, steps: list[int]) -> None:
        """Retention will delete ``steps`` once the new step commits: drop them from the index now."""
        index = self._index()
        for step in steps:
            index.remove(step)

    def _metrics(self) -> dict[int, Mapping[str, float]]:
        return self._index().metrics()

    def _step_dir(self, step: int) -> Path:
        return self._directory / str(step)

    def _write_index(self) -> None:
        if (
            self._index_ is not None
            and not self._read_only
            and is_primary()
            and self._directory.is_dir()
        ):
            self._index_.write(self._directory)

    # -- queries -----------------------------------------------------------------------------

    def list_steps(self) -> list[int]:
        """Every stored step, ascending (a step being written by this store included).

        A ``read_only`` store lists the committed step directories at every call, so it sees
        what a writer in another process commits.

        Example:
            >>> import tempfile
            >>> OrbaxCheckpointStore(tempfile.mkdtemp()).list_steps()
            []
        """
        if self._closed:
            raise RuntimeError(f"the checkpoint store at {self._directory} is closed")
        if self._manager_ is None or self._read_only:  # the committed step directories
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            return step_directories(self._directory)
        self._settle()
        return sorted(self._manager_.all_steps())

    def latest_step(self) -> int | None:
        """The highest stored step, or None for an empty store.

        Example:
            >>> import tempfile
            >>> OrbaxCheckpointStore(tempfile.mkdtemp()).latest_step() is None
            True
        """
        steps = self.list_steps()
        return steps[-1] if steps else None

    def best_step(self, metric: str, *, mode: Mode = "min") -> int | None:
        """The step whose ``metric`` is lowest (``"min"``) or highest (``"max"``), or None.

        Steps without the metric are skipped; ties go to the earliest step. Answered from an
        in-memory index, so its cost does not grow with the number of steps.

        Example:
            >>> import tempfile
            >>> OrbaxCheckpointStore(tempfile.mkdtemp()).best_step("loss") is None
            True
        """
        return self._index().best_step(metric, check_mode(mode))

    def read_metadata(self, step: int | None) -> CheckpointMetadata:
        """The metadata record of ``step`` (a legacy format-2 sidecar is mapped onto it).

        ``None`` (what ``latest_step()`` returns for an empty store) reads the latest step; on an
        empty store it raises ``CheckpointNotFoundError`` saying the store is empty.

        Example:
            >>> import tempfile
            >>> OrbaxCheckpointStore(tempfile.mkdtemp()).read_metadata(3)
            Traceback (most recent call last):
            ...
            substrax.checkpoint._errors.CheckpointNotFoundError: no checkpoint step 3 ...
        """
        step = self._resolve(step)
        with self._reading(step):
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            return self._record(step).metadata

    @contextlib.contextmanager
    def _reading(self, step: int) -> Generator[None]:
        """Raise ``CheckpointNotFoundError`` for a read of ``step`` that failed as it was deleted.

        A writer's retention (or ``delete``) removes a step in one rename: when a read fails and
        the step's directory is gone, the step was deleted under the read, whatever orbax or
        TensorStore said about its missing files.
        """
        try:
            yield
        except CheckpointNotFoundError:
            raise
        except Exception as error:
            if self._step_dir(step).is_dir():
                raise
            raise CheckpointNotFoundError(
                step=step,
                directory=self._directory,
                available=tuple(step_directories(self._directory)),
                deleted=True,
            ) from error

    def _resolve(self, step: int | None) -> int:
        """``step``, or the latest step for None (an empty store raises, saying it is empty)."""
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointNotFoundError(step=None, directory=self._directory)
            >>> from substrax.checkpoint import OrbaxCheckpointStore
        return step

    def _record(self, step: int) -> StepRecord:
        if step == self._pending:
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
            >>> root = tempfile.mkdtemp()
            >>> with OrbaxCheckpointStore(root, async_save=False) as writer:
            ...     _ = writer.save(3, {"model": {"w": np.zeros(2)}})
            >>> evaluator = OrbaxCheckpointStore(root, read_only=True)
            >>> evaluator.wait_for_step(after=2, timeout=10.0)
            3
            >>> evaluator.wait_for_step(after=3, timeout=0.1)
            Traceback (most recent call last):
            ...
            substrax.checkpoint._errors.CheckpointWaitTimeoutError: no step after 3 was committed ...
        """
        if not math.isfinite(timeout) or timeout < 0:
            raise ValueError(
                f"timeout must be a finite number of seconds >= 0, got {timeout!r}; "
                "pass how long to wait (a large value to wait for a long run)"
            )
        if not math.isfinite(poll_interval) or poll_interval <= 0:
            raise ValueError(
                f"poll_interval must be a finite number of seconds > 0, got {poll_interval!r}"
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._closed:
                raise RuntimeError(f"the checkpoint store at {self._directory} is closed")
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            steps = step_directories(self._directory)
            newer = [step for step in steps if after is None or step > after]
            if newer:
                return newer[-1]
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckpointWaitTimeoutError(
                    directory=self._directory,
                    after=after,
                    timeout=timeout,
                    latest_step=steps[-1] if steps else None,
                )
            time.sleep(min(poll_interval, left))

    # -- writing -----------------------------------------------------------------------------

            >>> from substrax.checkpoint import OrbaxCheckpointStore
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
            >>> store = OrbaxCheckpointStore(tempfile.mkdtemp(), async_save=False)
            >>> store.save(5, {"model": {"w": np.zeros(2)}}).name
            '5'
            >>> store.close()
        """
        self._check_writable()
        if isinstance(step, bool) or not isinstance(cast(object, step), int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        check_item_names(items)
        check_extra(extra or {})
        items, dtypes = _trees.for_saving(items)  # NumPy scalars as 0-d arrays, and their dtypes
        record = CheckpointMetadata(
            step=step,
            epoch=epoch,
            items=tuple(items),
            libraries=library_versions(),
            producer=producer,
            metrics={name: float(value) for name, value in (metrics or {}).items()},
            extra=dict(extra or {}),
        )
        manager = self._manager(create=True)
        assert manager is not None  # noqa: S101 - create=True always opens
        self.wait()
        steps = self.list_steps()
        latest = steps[-1] if steps else None
        code = 0
        if step in steps and not overwrite:
            code = 1
        elif latest is not None and step < latest:
            code = 2
        code = agree(code)
        if code:
            raise CheckpointNotWrittenError(
                step=step, latest_step=latest, reason=_REASONS[code - 1]
            )
        index = self._index()
        if step in steps:
            manager.delete(step)
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            self._empty_deleted()
            index.remove(step)
        index.add(step, IndexEntry(epoch=epoch, metrics=record.metrics))
        items = _trees.globalize_host_local(items)  # orbax saves only global arrays
        snapshot = host_snapshot(items) if self._async and jax.process_count() == 1 else None
        if snapshot is not None:
            items = snapshot.items
        args: dict[str, Any] = {
            name: ocp.args.PyTreeSave({_trees.WRAPPER: tree}) for name, tree in items.items()
        }
        args[METADATA_ITEM] = ocp.args.JsonSave(record.to_dict())
        args[DTYPES_ITEM] = ocp.args.JsonSave(dtypes)
        if snapshot is not None:
            self._control = self._background().submit(save_held, manager, step, args, snapshot)
            self._pending = step
            return self._step_dir(step)
        accepted = bool(agree(int(manager.save(step, args=ocp.args.Composite(**args), force=True))))
        if accepted:
            self._pending = step
        else:
            index.remove(step)
            raise CheckpointNotWrittenError(step=step, latest_step=latest, reason="rejected")
        if not self._async:
            self.wait()
        return self._step_dir(step)

    def _background(self) -> ThreadPoolExecutor:
            >>> from substrax.checkpoint import OrbaxCheckpointStore
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="substrax-checkpoint-writer")
            self._resources.writer = self._writer
        return self._writer

    def _check_writable(self) -> None:
        if self._read_only:
            raise PermissionError(
                f"the checkpoint store at {self._directory} was opened read_only=True; "
                "open it without read_only to save or delete"
            )

    def wait(self) -> None:
        """Block until the pending background write is committed; raise if it failed.

        Example:
            >>> import tempfile
            >>> OrbaxCheckpointStore(tempfile.mkdtemp()).wait()
        """
        manager = self._manager_
        if manager is None:
            return
        step, self._pending = self._pending, None
        control, self._control = self._control, None
        try:
            accepted = control is None or control.result()
            manager.wait_until_finished()
            manager.check_for_errors()
        except Exception as error:
            if step is not None:
                self._forget(step)
                raise CheckpointWriteError(
                    step=step, directory=self._directory, cause=repr(error)
                ) from error
            raise
        if step is not None and not accepted:
            self._forget(step)
            raise CheckpointNotWrittenError(
                step=step, latest_step=self.latest_step(), reason="rejected"
            )
        if step is not None and not (self._step_dir(step) / METADATA_ITEM).is_dir():
            self._forget(step)
            raise CheckpointWriteError(
                step=step, directory=self._directory, cause="its directory was never committed"
            )
        if step is not None:
            self._sync_index()
            if is_primary() and has_deleted(self._directory):  # what retention renamed away
                self._background().submit(empty_deleted, self._directory)

    def _forget(self, step: int) -> None:
        """A write failed: drop its step and re-read what the directory really holds."""
        manager = self._manager_
        if manager is not None:
            manager.reload()
        if self._index_ is not None:
            self._index_.remove(step)
            for held in self.list_steps():
                if held not in self._index_.entries and (entry := self._read_entry(held)):
                    self._index_.add(held, entry)
        self._write_index()

    def _sync_index(self) -> None:
        """Drop index entries of steps retention deleted, then persist the index."""
        manager = self._manager_
        if manager is None or self._index_ is None:
            return
        held = set(manager.all_steps())
        for step in [s for s in self._index_.entries if s not in held]:
            self._index_.remove(step)
        self._write_index()

    def delete(self, step: int) -> None:
        """Remove ``step``; a step the store does not hold is ``CheckpointNotFoundError``.

        Example:
            >>> import tempfile
            >>> OrbaxCheckpointStore(tempfile.mkdtemp()).delete(1)
            Traceback (most recent call last):
            ...
            substrax.checkpoint._errors.CheckpointNotFoundError: no checkpoint step 1 ...
        """
        self._check_writable()
        self.wait()
        manager = self._manager()
        if manager is None or step not in manager.all_steps():
            raise CheckpointNotFoundError(
                step=step, directory=self._directory, available=tuple(self.list_steps())
            )
        manager.delete(step)
        self._empty_deleted()
        self._index().remove(step)
        self._write_index()

    def _empty_deleted(self) -> None:
        if is_primary():  # orbax renames a deleted step on process 0 only
            empty_deleted(self._directory)

    def prune(self) -> list[int]:
        """Apply the retention rules to every stored step now; return the deleted steps.

        Example:
            >>> import tempfile
            >>> OrbaxCheckpointStore(tempfile.mkdtemp()).prune()
            []
        """
        self.wait()
        steps = self.list_steps()
        keep = self._retention.steps_to_keep(steps, self._metrics())
        doomed = [step for step in steps if step not in keep]
        for step in doomed:
            self.delete(step)
        return doomed

    def close(self) -> None:
        """Finish the pending write (raising its error, if any) and release orbax's resources.

        Example:
            >>> import tempfile
            >>> OrbaxCheckpointStore(tempfile.mkdtemp()).close()
        """
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            if self._writer is not None:
                self._writer.shutdown()
            if self._manager_ is not None:
                self._manager_.close()
            self._resources.writer = None
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
            >>> with OrbaxCheckpointStore(tempfile.mkdtemp()) as store:
            ...     _ = store.save(0, {"rng": {"seed": 3}})
            ...     store.restore(0).items["rng"]
            {'seed': 3}
        """
        step = self._resolve(step)
        with self._reading(step):
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
            >>> with OrbaxCheckpointStore(tempfile.mkdtemp()) as store:
            ...     _ = store.save(0, {"model": {"w": np.zeros((2, 3), np.float32)}})
            ...     store.describe(0)["model"][0].nbytes
            24
        """
        with self._reading(step):
            record = self._record(step)
            manager = self._manager()
            assert manager is not None  # noqa: S101 - _record found the step
            trees = stored_trees(manager, step, record)
        return {name: _trees.describe(tree) for name, tree in trees.items()}
