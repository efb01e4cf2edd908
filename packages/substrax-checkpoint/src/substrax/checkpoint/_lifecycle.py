"""``StoreLifecycle``, a base of ``OrbaxCheckpointStore``: its orbax manager, steps, pending write."""

import logging
from collections.abc import Callable
from pathlib import Path

import orbax.checkpoint as ocp

from substrax.support import Closeable

from ._index import INDEX_FILE, IndexBook
from ._lock import is_primary
from ._manager import Layout, empty_deleted, has_deleted, open_manager, step_directories
from ._read_errors import CheckpointStoreClosedError
from ._retention import RetentionPolicy, prunable
from ._save import Writer
from ._steps import is_step, scan_steps
from ._write_errors import CheckpointStoreReadOnlyError, CheckpointStoreSupersededError


_logger = logging.getLogger(__name__)


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
        """The committed step directories, or (a writer's) the manager's steps, the one in flight too.

        Only a directory holding the metadata record of its own step is a step: orbax's manager
        also counts any other integer-named folder, which the store never lists, prunes or deletes.
        """
        if self._manager_ is None or self._read_only or self._superseded:
            return step_directories(self._directory)
        self._writer.settle()
        scan = scan_steps(self._directory)  # a folder "0005" beside step "5" hides no step
        held = self._manager_.all_steps()
        return sorted(step for step in held if step not in scan.others or step in scan.steps)

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

        A ``read_only`` store sees what a writer in another process commits. An integer-named
        folder that holds no metadata record of its own step is not a step (a warning says so).

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

        The index written after it (``substrax_index.json``, a cache of the steps' records)
        that cannot be written (a full disk) is warned about, never raised: the step is saved.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.wait()
        """
        self._finish_write()
        try:
            self._book.flush()
        except OSError as error:
            _logger.warning(
                "could not write %s (%s); the steps are saved, and the index, a cache of their "
                "records, is read from them instead until a write succeeds",
                self._directory / INDEX_FILE,
                error,
            )

    def _finish_write(self) -> None:
        """Finish the pending write; leave its index write and removals to the chores thread."""
        manager = self._manager_
        if manager is None:
            return
        committed = self._writer.finish(manager, forget=self._forget, latest_step=self.latest_step)
        if committed is not None:  # sealed too: what retention drops goes only now
            held, metrics = self._held_steps(), self._book.metrics()
            dropped = prunable(self._retention, held, metrics, self._directory, warned=self._warned)
            if dropped:  # the newest may be saved again (overwrite=True) with other metrics:
                newest = max(held)  # what it alone outranks goes at the next save, not now
                settled = {step: values for step, values in metrics.items() if step != newest}
                kept = self._retention.steps_to_keep(held, settled)
                dropped = [step for step in dropped if step not in kept]
            for step in dropped:
                manager.delete(step)
            self._book.committed(self._held_steps())
            if is_primary() and has_deleted(self._directory):  # what retention renamed away
                directory = self._directory
                self._writer.chore(lambda: empty_deleted(directory))

    def finish_at_exit(self, timeout: float) -> None:
        """The interpreter exits with this store open: finish its pending write, or warn it is lost.

        Waits ``timeout`` seconds at most. A write still running when the exit began cannot
        finish: Python starts no thread then, and orbax's write needs new ones.
        """
        step = self._writer.pending
        if self._closed or self._superseded or step is None:
            return
        error: Exception | None = None
        self._writer.exiting = True
        if self._writer.join(max(timeout, 0.0)):
            try:
                self.close()
            except Exception as failed:  # reported below: nobody is left to catch it
                error = failed
        if is_step(self._directory, step):  # committed: the next writer tidies what is left
            return
        _logger.warning(
            "checkpoint step %s in %s is lost: the store was never closed and the write was "
            "still running when the interpreter exited (%s); call store.close() (or use a with "
            "block) before the program ends, so that the write finishes first",
            step,
            self._directory,
            error or f"not finished within {timeout:.0f} s",
        )

    def _forget(self, step: int) -> None:
        """A write failed: drop its step and re-read what the directory really holds."""
        if self._manager_ is not None:
            self._manager_.reload()
        self._book.failed(step, self.list_steps)
