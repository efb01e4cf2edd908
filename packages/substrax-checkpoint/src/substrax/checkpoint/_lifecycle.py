"""``StoreLifecycle``, a base of ``OrbaxCheckpointStore``: its orbax manager, steps, pending write."""

from collections.abc import Callable
from pathlib import Path

import orbax.checkpoint as ocp

from substrax.support import Closeable

from ._index import IndexBook
from ._lock import is_primary
from ._manager import Layout, empty_deleted, has_deleted, open_manager, step_directories
from ._read_errors import CheckpointStoreClosedError
from ._retention import RetentionPolicy, prunable
from ._save import Writer
from ._write_errors import CheckpointStoreReadOnlyError, CheckpointStoreSupersededError


class StoreLifecycle(Closeable):
    """An open step-addressed store: its orbax manager, its steps, its pending write."""

    _directory: Path
    _retention: RetentionPolicy
    _async: bool
    _layout: Layout
    _checksums: bool  # manifests written after each commit, and checked by restores
    _read_only: bool
    _superseded: bool  # a newer writer store of this process took the directory over
    _manager_: ocp.CheckpointManager | None
    _warned: set[str]  # the metrics retention warned that no step records
    _closed: bool
    _writer: Writer
    _release: Callable[[], object]
    _book: IndexBook

    @property
    def directory(self) -> Path:
        """The store's root directory (absolute)."""
        return self._directory

    @property
    def retention(self) -> RetentionPolicy:
        """The retention rules applied once each save is committed (and its manifest written)."""
        return self._retention

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
                read_only=self._read_only or self._superseded,
            )
        return self._manager_

    def _writable_manager(self) -> ocp.CheckpointManager:
        manager = self._manager(create=True)
        assert manager is not None  # noqa: S101 - create=True always opens
        return manager

    def _held_steps(self) -> list[int]:
        """The committed step directories, or (a writer's) the manager's steps, the one in flight too."""
        if self._manager_ is None or self._read_only or self._superseded:
            return step_directories(self._directory)
        self._writer.settle()
        return sorted(self._manager_.all_steps())

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointStoreClosedError(directory=self._directory)

    def _check_writable(self, operation: str) -> None:
        if self._read_only:
            raise CheckpointStoreReadOnlyError(directory=self._directory, operation=operation)
        self._check_current(operation)

    def _check_current(self, operation: str) -> None:
        """Refuse ``operation`` once a newer writer store of this process took the directory."""
        if self._superseded:
            raise CheckpointStoreSupersededError(directory=self._directory, operation=operation)

    def _step_dir(self, step: int) -> Path:
        return self._directory / str(step)

    def list_steps(self) -> list[int]:
        """Every stored step, ascending (a step being written by this store included).

        A ``read_only`` store sees what a writer in another process commits.

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

    def wait(self) -> None:
        """Block until the pending background write is committed; raise if it failed.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.wait()
        """
        self._finish_write()
        self._book.flush()

    def _finish_write(self) -> None:
        """Finish the pending write; leave its index write and removals to the chores thread."""
        manager = self._manager_
        if manager is None:
            return
        committed = self._writer.finish(manager, forget=self._forget, latest_step=self.latest_step)
        if committed is not None:  # sealed too: what retention drops goes only now
            held, metrics = self._held_steps(), self._book.metrics()
            dropped = prunable(self._retention, held, metrics, self._directory, warned=self._warned)
            for step in dropped:
                manager.delete(step)
            self._book.committed(self._held_steps())
            if is_primary() and has_deleted(self._directory):  # what retention renamed away
                directory = self._directory
                self._writer.chore(lambda: empty_deleted(directory))

    def _forget(self, step: int) -> None:
        """A write failed: drop its step and re-read what the directory really holds."""
        if self._manager_ is not None:
            self._manager_.reload()
        self._book.failed(step, self.list_steps)
