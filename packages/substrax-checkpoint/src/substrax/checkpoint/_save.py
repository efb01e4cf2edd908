"""The save path: a save's request, its refusal decided once, the write handed to orbax.

In one process orbax's save runs on the writer thread, from a snapshot, while ``save`` returns;
with several, on the caller's thread. Once orbax commits the step, its manifest (due till then).
"""

import contextlib
import logging
import math
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_for
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import jax
import orbax.checkpoint as ocp

from substrax.support import check_array_variables, check_int
from substrax.typing import JsonValue

from . import _trees
from ._extra import NONFINITE_METRICS_KEY, check_extra
from ._index import IndexBook, IndexEntry
from ._lock import LOCK_FILE, WriterLease, agree, is_primary
from ._manager import remove_remade, save_held, snapshot
from ._manifest import mark_due, write_manifest
from ._metadata import (
    DTYPES_ITEM,
    METADATA_ITEM,
    WRAPPER,
    CheckpointMetadata,
    Producer,
    check_item_names,
    library_versions,
)
from ._protocol import PyTree
from ._steps import move_aside, move_back
from ._write_errors import (
    CheckpointNotWrittenError,
    CheckpointStoreRemovedError,
    CheckpointWriteError,
    NotWrittenReason,
)


_logger = logging.getLogger(__name__)


def _number(name: str, value: object) -> float:
    """A metric's value as a float (NaN and infinity too); anything else is refused by name."""
    if not isinstance(name, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"metric name {name!r} must be a str (it is recorded as JSON text)")
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) == "bool":
        # float(True) is 1.0: a flag would be ranked by best_step and keep_best as a score
        raise TypeError(
            f"metric {name!r} must be a number, not the bool {bool(value)}; a flag goes in extra="
        )
    try:
        if not isinstance(value, str | bytes):  # float("0.5") would take a text
            return float(value)  # pyright: ignore[reportArgumentType] - a number or scalar array
    except OverflowError:  # an int past float's range: an infinity, set aside as one
        return math.inf if value > 0 else -math.inf  # pyright: ignore[reportOperatorIssue]
    except (TypeError, ValueError):
        pass
    raise TypeError(f"metric {name!r} must be a number, not {value!r:.80}")


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
        """Validate a save's arguments (ValueError or TypeError naming the bad one)."""
        check_int("step", step, minimum=0)
        check_item_names(items)
        for name, tree in items.items():  # orbax has no handler for a jax.Ref or hijax value
            check_array_variables(tree, f"save (item {name!r})")
        check_extra(extra or {})  # refuses NONFINITE_METRICS_KEY too: the save records it
        saved, dtypes = _trees.for_saving(items)  # NumPy scalars as 0-d arrays, and their dtypes
        if producer is not None and not isinstance(producer, Producer):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"producer must be a Producer(name=..., version=...), not {producer!r}")
        if metrics is not None and not isinstance(metrics, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"metrics must be a mapping of names to numbers, not {metrics!r:.80}")
        numbers = {name: _number(name, value) for name, value in (metrics or {}).items()}
        finite = {name: value for name, value in numbers.items() if math.isfinite(value)}
        nonfinite = {name: str(value) for name, value in numbers.items() if name not in finite}
        recorded: dict[str, JsonValue] = dict(extra or {})
        if nonfinite:
            recorded[NONFINITE_METRICS_KEY] = dict[str, JsonValue](nonfinite)
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

    def orbax_args(self, items: Mapping[str, PyTree]) -> ocp.args.Composite:
        """Orbax's composite arguments: ``items`` beside the metadata record and the dtypes."""
        args: dict[str, Any] = {
            name: ocp.args.PyTreeSave({WRAPPER: tree}) for name, tree in items.items()
        }
        args[METADATA_ITEM] = ocp.args.JsonSave(self.record.to_dict())
        args[DTYPES_ITEM] = ocp.args.JsonSave(self.dtypes)
        return ocp.args.Composite(**args)


def refusal(
    step: int, steps: list[int], *, overwrite: bool, occupied: bool = False
) -> NotWrittenReason | None:
    """Why ``step`` may not be written beside ``steps`` (ascending; process 0's view), or None.

    ``occupied``: a folder named like the step is not a step (never replaced, even to overwrite).
    """
    reason: NotWrittenReason | None = None
    if occupied:
        reason = NotWrittenReason.OCCUPIED
    elif steps and step < steps[-1]:  # even with overwrite=True: steps only move forward
        reason = NotWrittenReason.BELOW_LATEST
    elif step in steps and not overwrite:
        reason = NotWrittenReason.EXISTS
    agreed = agree(reason or "")
    return NotWrittenReason(agreed) if agreed else None


class Writer:
    """A store's writing side: its writer lock, its threads and the write in flight (``pending``).

    It references neither the store nor its orbax manager, so a store nobody closed can be
    collected and its finalizer release this.
    """

    def __init__(self, directory: Path, lease: WriterLease | None, *, manifests: bool) -> None:
        self._directory = directory
        self._lease = lease
        self._manifests = manifests  # whether a committed step gets its manifest
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="substrax-checkpoint-writer")
        self._chores = ThreadPoolExecutor(1, thread_name_prefix="substrax-checkpoint-chores")
        self.exiting = False  # the interpreter exits: a failure is expected, and warned of once
        self._control: Future[bool] | None = None  # orbax's save call, run by the writer thread
        self._seal: Future[None] | None = None  # the commit (and manifest) of the step in flight
        self._aside: Path | None = None  # the step the write in flight replaces, kept till then
        self.pending: int | None = None

    def chore(self, work: Callable[[], None]) -> Future[None]:
        """Run ``work`` on the chores thread, after the chores before it."""
        return self._chores.submit(work)

    def intact(self) -> bool:
        """Whether this process's share of the writer lock still holds its directory's lock file."""
        return self._lease is None or self._lease.intact()

    def _lost_lock(self) -> bool:
        """Whether the writer lock was lost (the directory removed, or its lock file replaced)."""
        return agree(str(self.intact()), topic="writer-lock") != "True"

    def check_lock(self) -> None:
        """Raise ``CheckpointStoreRemovedError`` (on every process) if the writer lock was lost."""
        if self._lost_lock():
            raise CheckpointStoreRemovedError(directory=self._directory)

    def settle(self) -> None:
        """Let the writer thread's orbax call (a write's setup) return before the manager is used."""
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
    ) -> None:
        """Refuse ``request`` (``CheckpointNotWrittenError``) or start writing it.

        With ``overwrite`` an existing step is moved aside (``REPLACED``), the index written
        without it before (a crash then leaves no entry of the old step to trust); it is removed
        once the new step is committed, and put back if the write fails (or, after a crash, by
        the next writer to open the store). A write that fails here leaves ``book`` as it was.
        """
        step = request.step
        # ``steps`` leaves out the folders that are no steps: one named like the step is foreign
        occupied = step not in steps and (self._directory / str(step)).exists()
        reason = refusal(step, steps, overwrite=overwrite, occupied=occupied)
        if reason is not None:
            latest = steps[-1] if steps else None
            raise CheckpointNotWrittenError(step=step, latest_step=latest, reason=reason)
        aside = None
        if step in steps:
            book.deleted(step)  # persisted before the step's directory is moved
            try:
                aside = move_aside(self._directory, step, manager())
            except CheckpointWriteError:
                book.failed(step, lambda: [step])  # still in place: its entry back
                raise
            steps = [held for held in steps if held != step]
        book.saving(step, request.entry())
        sealing = self._directory / str(step) if self._manifests and is_primary() else None
        mark_due(sealing, due=True)  # before orbax commits the step
        try:
            latest = steps[-1] if steps else None
            self._start(manager(), request, latest=latest, async_save=async_save, sealing=sealing)
        except BaseException:
            mark_due(sealing, due=False)
            if aside is None:
                book.evict([step])  # never written: no trace of it in the index
            else:
                move_back(self._directory, aside, manager())
                book.failed(step, lambda: [step])  # the old step's entry, read back
            raise
        self._aside = aside

    def _start(
        self,
        orbax: ocp.CheckpointManager,
        request: SaveRequest,
        *,
        latest: int | None,
        async_save: bool,
        sealing: Path | None,
    ) -> None:
        """Start writing ``request`` (``latest``: the step before it; ``sealing``: its manifest's)."""
        step = request.step
        items = _trees.globalize_host_local(request.items)  # orbax saves only global arrays
        # one process: orbax's save call on the writer thread, from a snapshot (with several,
        # it waits on the other processes, so it stays on the caller's thread in step with theirs)
        frozen = snapshot(items) if async_save and jax.process_count() == 1 else None
        if frozen is not None:
            args = request.orbax_args(frozen.items)
            self._control = self._thread.submit(save_held, orbax, step, args, frozen)
        else:
            try:  # a failed write reads as a background one's; a refused item as orbax says
                saved = orbax.save(step, args=request.orbax_args(items), force=True)
            except (ValueError, TypeError):
                raise
            except Exception as error:
                raise CheckpointWriteError.of(step, self._directory, error) from error
            if agree(str(bool(saved))) != "True":
                raise CheckpointNotWrittenError(
                    step=step, latest_step=latest, reason=NotWrittenReason.REJECTED
                )
        self.pending = step
        if sealing is not None or jax.process_count() == 1:  # after the save call, same thread
            self._seal = self._thread.submit(self._seal_step, orbax, step, sealing is not None)

    def _seal_step(self, manager: ocp.CheckpointManager, step: int, manifest: bool) -> None:
        """Once orbax commits ``step``, its manifest (if ``manifest``), then no longer due.

        Failing to write the manifest is a warning; a failed write is ``finish``'s to raise.
        """
        with contextlib.suppress(Exception):
            manager.wait_until_finished()
        if manifest:
            self._write_manifest(step)

    def _write_manifest(self, step: int) -> None:
        """The manifest of committed ``step``, then no longer due; failing is a warning."""
        step_dir = self._directory / str(step)
        try:
            if (step_dir / METADATA_ITEM).is_dir():
                write_manifest(step_dir)
        except OSError as error:
            _logger.warning(
                "checkpoint step %s in %s was committed, but its manifest could not be written "
                "(%s): it restores unverified",
                step,
                self._directory,
                error,
            )
        finally:
            mark_due(step_dir, due=False)

    def join(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the write in flight; return whether it ended."""
        running: list[Future[Any]] = [f for f in (self._control, self._seal) if f is not None]
        return not wait_for(running, timeout=timeout).not_done

    def finish(
        self,
        manager: ocp.CheckpointManager,
        *,
        forget: Callable[[int], None],
        latest_step: Callable[[], int | None],
    ) -> int | None:
        """Wait for the write in flight; return its step once committed (None: none was).

        A failed write calls ``forget`` with its step, then raises ``CheckpointWriteError``
        (``CheckpointNotWrittenError`` when orbax refused it), or :meth:`_removed`'s error when
        the store's directory was removed during the write.
        """
        step, self.pending = self.pending, None
        control, self._control = self._control, None
        seal, self._seal = self._seal, None
        aside, self._aside = self._aside, None
        try:
            accepted = control is None or control.result()
            if seal is not None:
                seal.result()
            manager.wait_until_finished()
            manager.check_for_errors()
        except Exception as error:
            if step is None:  # orbax keeps a failed write's error: this one was raised already
                _logger.debug(
                    "%s: orbax reports a write already failed: %r", self._directory, error
                )
                return None
            if self._lost_lock():
                self._removed(step, forget, error)
            move_back(self._directory, aside, manager)
            self._forget(forget, step)
            raise CheckpointWriteError.of(step, self._directory, error) from error
        if step is None:
            return None
        if self._lost_lock():
            self._removed(step, forget, None)
        if not accepted:
            move_back(self._directory, aside, manager)
            self._forget(forget, step)
            raise CheckpointNotWrittenError(
                step=step, latest_step=latest_step(), reason=NotWrittenReason.REJECTED
            )
        if not (self._directory / str(step) / METADATA_ITEM).is_dir():
            move_back(self._directory, aside, manager)
            self._forget(forget, step)
            raise CheckpointWriteError(
                step=step, directory=self._directory, cause="its directory was never committed"
            )
        if aside is not None and is_primary():  # replaced: the old step goes now
            self._chores.submit(shutil.rmtree, aside, ignore_errors=True)
        return step

    def _removed(
        self, step: int, forget: Callable[[int], None], error: Exception | None
    ) -> NoReturn:
        """Raise ``CheckpointWriteError`` caused by ``CheckpointStoreRemovedError``, once tidied up.

        Orbax recreates the folders a write misses: unless another writer locked the directory
        since, process 0 removes what the write made again.
        """
        if is_primary() and not (self._directory / LOCK_FILE).exists():
            remove_remade(self._directory, step)
        self._forget(forget, step)
        removed = CheckpointStoreRemovedError(directory=self._directory)
        removed.__cause__ = error
        raise CheckpointWriteError.of(step, self._directory, removed) from removed

    def _forget(self, forget: Callable[[int], None], step: int) -> None:
        """Call ``forget(step)``; its failure is logged, never raised in place of the write's."""
        try:
            forget(step)
        except Exception:
            if self.exiting:  # no thread starts at exit: finish_at_exit says the step is lost
                return
            _logger.warning(
                "checkpoint step %s in %s failed, and so did updating the store's index after it",
                step,
                self._directory,
                exc_info=True,
            )

    def stop_thread(self) -> None:
        """Let the writer and chores threads finish what they run, and end them."""
        self._thread.shutdown()
        self._chores.shutdown()

    def release(self) -> None:
        """End the writer thread, then free the writer lock (idempotent)."""
        lease, self._lease = self._lease, None
        try:
            self.stop_thread()
        finally:
            if lease is not None:
                lease.release()
