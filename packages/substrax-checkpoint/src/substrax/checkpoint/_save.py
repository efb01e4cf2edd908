"""The save path: a save's request, its refusal decided once, the write handed to orbax.

``OrbaxCheckpointStore.save`` validates a :class:`SaveRequest`, and its :class:`Writer` refuses
it (one :class:`NotWrittenReason`, agreed by every process) or starts the write through orbax's
``CheckpointManager.save``: in one process on the writer thread, from a snapshot of the items
(:mod:`._snapshot`), while ``save`` returns; with several, on the caller's thread. Once orbax commits the step,
the writer thread writes its manifest (:mod:`._manifest`: every file's size and CRC-32C).
``Writer.finish`` waits for both and says whether the step committed.
"""

import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_for
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import jax
import orbax.checkpoint as ocp

from substrax.support import check_int
from substrax.typing import JsonValue

from . import _trees
from ._errors import (
    CheckpointNotWrittenError,
    CheckpointStoreRemovedError,
    CheckpointWriteError,
    NotWrittenReason,
)
from ._formats import DTYPES_ITEM, METADATA_ITEM
from ._index import IndexBook, IndexEntry
from ._lock import LOCK_FILE, WriterLease
from ._manager import remove_remade, save_held
from ._manifest import write_manifest
from ._metadata import (
    NONFINITE_METRICS_KEY,
    CheckpointMetadata,
    Producer,
    check_extra,
    check_item_names,
    library_versions,
)
from ._multihost import agree, is_primary
from ._protocol import PyTree
from ._snapshot import snapshot


_logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SaveRequest:
    """One validated save: the items as orbax writes them, their dtypes and the metadata record."""

    step: int
    items: dict[str, PyTree]
    dtypes: dict[str, Any]
    record: CheckpointMetadata

    @classmethod
    def build(
        cls,
        step: int,
        items: Mapping[str, PyTree],
        *,
        epoch: int | None,
        metrics: Mapping[str, float] | None,
        producer: Producer | None,
        extra: Mapping[str, JsonValue] | None,
    ) -> "SaveRequest":
        """Validate a save's arguments (ValueError or TypeError naming the bad one).

        A NaN or infinite metric is kept out of ``metrics`` (so out of ``best_step`` and
        ``keep_best``) and recorded as text under ``extra["nonfinite_metrics"]``.
        """
        check_int("step", step, minimum=0)
        check_item_names(items)
        check_extra(extra or {})
        if NONFINITE_METRICS_KEY in (extra or {}):
            raise ValueError(
                f"extra key {NONFINITE_METRICS_KEY!r} is where the store records non-finite "
                "metrics; rename it"
            )
        saved, dtypes = _trees.for_saving(items)  # NumPy scalars as 0-d arrays, and their dtypes
        finite, nonfinite = split_metrics(metrics or {})
        recorded: dict[str, JsonValue] = dict(extra or {})
        if nonfinite:
            recorded[NONFINITE_METRICS_KEY] = dict(nonfinite)
        record = CheckpointMetadata(
            step=step,
            epoch=epoch,
            items=tuple(saved),
            libraries=library_versions(),
            producer=producer,
            metrics=finite,
            extra=recorded,
        )
        return cls(step=step, items=saved, dtypes=dtypes, record=record)

    def entry(self) -> IndexEntry:
        """The step's index entry."""
        return IndexEntry(epoch=self.record.epoch, metrics=self.record.metrics)

    def orbax_args(self, items: Mapping[str, PyTree]) -> dict[str, Any]:
        """Orbax's composite arguments: ``items`` beside the metadata record and the dtypes."""
        args: dict[str, Any] = {
            name: ocp.args.PyTreeSave({_trees.WRAPPER: tree}) for name, tree in items.items()
        }
        args[METADATA_ITEM] = ocp.args.JsonSave(self.record.to_dict())
        args[DTYPES_ITEM] = ocp.args.JsonSave(self.dtypes)
        return args


def split_metrics(metrics: Mapping[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """``metrics`` as floats: the finite ones, and the others as text (``"nan"``, ``"inf"``...).

    Example:
        >>> from substrax.checkpoint._save import split_metrics
        >>> split_metrics({"loss": float("inf"), "acc": 0.5})
        ({'acc': 0.5}, {'loss': 'inf'})
    """
    finite: dict[str, float] = {}
    nonfinite: dict[str, str] = {}
    for name, value in metrics.items():
        number = float(value)
        if math.isfinite(number):
            finite[name] = number
        else:
            nonfinite[name] = str(number)
    return finite, nonfinite


def refusal(step: int, steps: list[int], *, overwrite: bool) -> NotWrittenReason | None:
    """Why ``step`` may not be written beside ``steps`` (ascending), None when it may.

    Decided from process 0's view of the directory and returned on every process, so that all
    processes raise the same error or all enter the collective write.

    Example:
        >>> from substrax.checkpoint._save import refusal
        >>> refusal(3, [1, 5], overwrite=False)
        <NotWrittenReason.BELOW_LATEST: 'below_latest'>
        >>> refusal(5, [1, 5], overwrite=True) is None
        True
    """
    reason: NotWrittenReason | None = None
    if step in steps and not overwrite:
        reason = NotWrittenReason.EXISTS
    elif steps and step < steps[-1]:
        reason = NotWrittenReason.BELOW_LATEST
    agreed = agree(reason or "")
    return NotWrittenReason(agreed) if agreed else None


class Writer:
    """A store's writing side: its writer lock, its writer thread and the one write in flight.

    It references neither the store nor its orbax manager (whose retention policy calls back
    into the store), so a store nobody closed can be collected and its finalizer release this.

    Attributes:
        pending: the step being written, None when no write is in flight.
    """

    def __init__(self, directory: Path, lease: WriterLease | None, *, manifests: bool) -> None:
        self._directory = directory
        self._lease = lease
        self._manifests = manifests  # whether a committed step gets its manifest
        self._thread: ThreadPoolExecutor | None = None
        self._chores: ThreadPoolExecutor | None = None
        self._control: Future[bool] | None = None  # orbax's save call, run by the writer thread
        self._seal: Future[None] | None = None  # the manifest of the step in flight
        self.pending: int | None = None

    def background(self) -> ThreadPoolExecutor:
        """The writer thread (started at first use)."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="substrax-checkpoint-writer")
        return self._thread

    def chore(self, work: Callable[[], None]) -> Future[None]:
        """Run ``work`` on the chores thread (started at first use), after the chores before it.

        Chores are the files a save leaves to tidy once committed (the index, deleted steps):
        on their own thread they never delay the next save's write, nor the training thread.
        """
        if self._chores is None:
            self._chores = ThreadPoolExecutor(1, thread_name_prefix="substrax-checkpoint-chores")
        return self._chores.submit(work)

    def check_lock(self) -> None:
        """Raise ``CheckpointStoreRemovedError`` (on every process) if the writer lock was lost.

        It is lost when the directory is removed, or its lock file replaced, under the open
        store: orbax would create the directory again without it and let a second writer in.
        """
        intact = self._lease is None or self._lease.intact()
        if agree(str(intact), topic="writer-lock") != "True":
            raise CheckpointStoreRemovedError(directory=self._directory)

    def settle(self) -> None:
        """Let the writer thread's orbax call return before another thread uses the manager.

        Only the setup of a write runs there (milliseconds); its errors surface in ``finish``.
        """
        if self._control is not None:
            wait_for([self._control])

    def write(
        self,
        manager: Callable[[], ocp.CheckpointManager],
        request: SaveRequest,
        *,
        steps: list[int],
        overwrite: bool,
        async_save: bool,
        book: IndexBook,
        empty_deleted: Callable[[], None],
    ) -> None:
        """Refuse ``request`` (``CheckpointNotWrittenError``) or start writing it.

        ``manager`` opens the store's orbax manager; ``steps`` are the steps held (ascending,
        no write in flight); with ``overwrite`` an existing step is deleted first, and the
        index written without it before: a crash once the new step is committed (before the
        index is written again) leaves no entry of the old step to trust, so the next open
        reads the new step's own record. ``empty_deleted`` removes what orbax renamed away.
        A write that fails here (orbax or jax refusing a leaf, a donated array) leaves no entry
        in ``book``.
        """
        step = request.step
        latest = steps[-1] if steps else None
        reason = refusal(step, steps, overwrite=overwrite)
        if reason is not None:
            raise CheckpointNotWrittenError(step=step, latest_step=latest, reason=reason)
        if step in steps:
            book.deleted(step)  # persisted before the step's directory is replaced
            manager().delete(step)
            empty_deleted()
            steps = [held for held in steps if held != step]
        book.saving(step, request.entry())
        try:
            self._start(
                manager, request, latest=steps[-1] if steps else None, async_save=async_save
            )
        except BaseException:
            book.evict([step])  # never written: no trace of it in the index
            raise

    def _start(
        self,
        manager: Callable[[], ocp.CheckpointManager],
        request: SaveRequest,
        *,
        latest: int | None,
        async_save: bool,
    ) -> None:
        """Start writing ``request`` (``latest``: the latest step held besides it); see :meth:`write`."""
        step, orbax = request.step, manager()
        items = _trees.globalize_host_local(request.items)  # orbax saves only global arrays
        # one process: orbax's save call on the writer thread, from a snapshot (with several,
        # it waits on the other processes, so it stays on the caller's thread in step with theirs)
        frozen = snapshot(items) if async_save and jax.process_count() == 1 else None
        if frozen is not None:
            args = request.orbax_args(frozen.items)
            self._control = self.background().submit(save_held, orbax, step, args, frozen)
        else:
            composite = ocp.args.Composite(**request.orbax_args(items))
            if agree(str(bool(orbax.save(step, args=composite, force=True)))) != "True":
                raise CheckpointNotWrittenError(
                    step=step, latest_step=latest, reason=NotWrittenReason.REJECTED
                )
        self.pending = step
        if self._manifests and is_primary():  # after the save call, on the same thread
            self._seal = self.background().submit(self._write_manifest, orbax, step)

    def _write_manifest(self, manager: ocp.CheckpointManager, step: int) -> None:
        """The writer thread's last part of a save: once orbax commits ``step``, its manifest.

        A write that failed leaves no manifest (``finish`` raises its error); a manifest that
        cannot be written (a full disk) leaves the step committed but unverified, with a warning.
        """
        with contextlib.suppress(Exception):  # a failed write is ``finish``'s to raise
            manager.wait_until_finished()
        step_dir = self._directory / str(step)
        if not (step_dir / METADATA_ITEM).is_dir():
            return
        try:
            write_manifest(step_dir)
        except OSError as error:
            _logger.warning(
                "checkpoint step %s in %s was committed, but its manifest could not be written "
                "(%s): it restores unverified",
                step,
                self._directory,
                error,
            )

    def _intact(self) -> bool:
        return self._lease is None or self._lease.intact()

    def intact(self) -> bool:
        """Whether this process's share of the writer lock still holds its directory's lock file."""
        return self._intact()

    def finish(
        self,
        manager: ocp.CheckpointManager,
        *,
        forget: Callable[[int], None],
        latest_step: Callable[[], int | None],
    ) -> int | None:
        """Wait for the write in flight; return its step once committed (None: none was).

        A failed write calls ``forget`` with its step, then raises ``CheckpointWriteError`` (or
        ``CheckpointNotWrittenError`` when orbax refused it on the writer thread). When ``forget``
        fails too (the directory that refused the write refuses the index), that is logged and
        the write's own error raised. When the store's directory was removed during the write
        (its writer lock with it), the write is ``CheckpointStoreRemovedError`` whatever it
        ended in, and what it made again there is removed (see :meth:`_removed`).
        """
        step, self.pending = self.pending, None
        control, self._control = self._control, None
        seal, self._seal = self._seal, None
        try:
            accepted = control is None or control.result()
            if seal is not None:
                seal.result()
            manager.wait_until_finished()
            manager.check_for_errors()
        except Exception as error:
            if step is None:
                raise
            if self._lost_lock():
                self._removed(step, forget, error)
            self._forget(forget, step)
            raise CheckpointWriteError(
                step=step, directory=self._directory, cause=f"{type(error).__name__}: {error}"
            ) from error
        if step is None:
            return None
        if self._lost_lock():
            self._removed(step, forget, None)
        if not accepted:
            self._forget(forget, step)
            raise CheckpointNotWrittenError(
                step=step, latest_step=latest_step(), reason=NotWrittenReason.REJECTED
            )
        if not (self._directory / str(step) / METADATA_ITEM).is_dir():
            self._forget(forget, step)
            raise CheckpointWriteError(
                step=step, directory=self._directory, cause="its directory was never committed"
            )
        return step

    def _lost_lock(self) -> bool:
        """Whether the writer lock was lost (decided by process 0, the same on every process)."""
        return agree(str(self._intact()), topic="writer-lock") != "True"

    def _removed(
        self, step: int, forget: Callable[[int], None], error: Exception | None
    ) -> NoReturn:
        """Raise the error of a write of ``step`` into a store removed meanwhile, once tidied up.

        Orbax and TensorStore create the folders a write misses, so a store removed during a
        write comes back holding that step alone, without its writer lock, even when the write
        itself succeeded. Where no other writer's lock file stands there, process 0 removes
        what the write made again (and the directory, once empty); a directory another writer
        locked since is left alone. Raises ``CheckpointWriteError`` whose cause is
        ``CheckpointStoreRemovedError`` (itself caused by ``error``, what the write raised).
        """
        if is_primary() and not (self._directory / LOCK_FILE).exists():
            remove_remade(self._directory, step)
        self._forget(forget, step)
        removed = CheckpointStoreRemovedError(directory=self._directory)
        removed.__cause__ = error
        raise CheckpointWriteError(
            step=step, directory=self._directory, cause=f"CheckpointStoreRemovedError: {removed}"
        ) from removed

    def _forget(self, forget: Callable[[int], None], step: int) -> None:
        """Call ``forget(step)``; its failure is logged, never raised in place of the write's."""
        try:
            forget(step)
        except Exception:
            _logger.warning(
                "checkpoint step %s in %s failed, and so did updating the store's index after it",
                step,
                self._directory,
                exc_info=True,
            )

    def stop_thread(self) -> None:
        """Let the writer and chores threads finish what they run, and end them."""
        for thread in (self._thread, self._chores):
            if thread is not None:
                thread.shutdown()

    def release(self) -> None:
        """End the writer thread, then free the writer lock (idempotent)."""
        lease, self._lease = self._lease, None
        try:
            self.stop_thread()
        finally:
            if lease is not None:
                lease.release()
