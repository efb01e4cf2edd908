"""AsyncDelivery: a bounded queue and a worker thread between the training step and a remote backend."""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._errors import SpoolNotFoundError
from ._records import Record, Scalar, as_record, prefetch_scalars, split_scalars
from ._replay import ReplayResult, run_replay, target_key
from ._spool import Sink, SpoolFile


__all__ = ["AsyncDelivery"]

_logger = logging.getLogger(__name__)

_BATCHABLE = frozenset({"scalars", "hyperparams"})
_CLOSE_GRACE = 0.5  # seconds past close's deadline for the worker to write the spool and stop
_SPILL_BATCH = 1000  # records spilled past a full queue are written (and fsynced) in batches
_SPILL_AGE = 0.5  # seconds, at most, that a spilled record waits in memory to be written
_PROBE_LINES = 1000  # spool lines a retry sends before it reads the whole spool
_NICE = 10  # how much lower the worker's CPU priority is than the training threads' (Linux)
_LOWEST = 19  # the highest nice value there is


def _lower_priority() -> None:
    """Lower the calling thread's CPU priority, so that it yields the cores to the training step.

    Linux gives each thread its own nice value; elsewhere ``setpriority`` on a thread id could
    reach another process, so nothing is done there.
    """
    if sys.platform.startswith("linux"):
        thread = threading.get_native_id()
        try:
            nice = os.getpriority(os.PRIO_PROCESS, thread)
            os.setpriority(os.PRIO_PROCESS, thread, min(nice + _NICE, _LOWEST))
        except OSError as error:  # a sandbox that forbids it: the worker runs at normal priority
            _logger.debug("could not lower the delivery thread's priority: %s", error)


class _Control:
    __slots__ = ("done", "kind", "ok")

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "flush" (deliver), "persist" (deliver or spool) or "close"
        self.done = threading.Event()
        self.ok = False


class AsyncDelivery:
    """Deliver records to a sink from a worker thread; never block or raise in the caller.

    The caller's :meth:`submit` puts a record on a queue (past ``max_queue`` records, into the
    spool file) and does nothing else: the worker does not even wake up for each record. It
    holds what arrives for ``batch_interval`` seconds (or until ``max_batch`` records wait, or
    :meth:`flush`, :meth:`persist` or :meth:`close` is called), then materializes the records
    and sends them in one batch, at a lower CPU priority than the training threads (Linux).
    When the backend fails, the worker warns once, writes the records it holds to the spool
    file (so that a crash loses nothing), keeps spooling while the backend is down, and
    retries with backoff by replaying the spool in order. A record the backend refuses for good
    goes to ``<spool>.refused`` with its error (of a record of several scalars, only the
    refused ones), and the rest goes on. When the spool itself cannot be written (a full
    disk), the worker warns once and keeps the records in memory, in order, trying again with
    backoff; nothing it holds is dropped and the worker never stops on an error.
    :meth:`persist` returns within its timeout with every record submitted before it delivered
    or in the spool, and :meth:`close` never waits for the backend longer than its timeout: if
    the worker is still inside a backend call by then, the caller spools what is undelivered
    itself.

    Args:
        sink: the backend run.
        spool_path: the spool file.
        media_dir: where images are written before upload.
        label: the name used in log messages.
        max_queue: the queue bound.
        max_batch: records per delivery.
        batch_interval: the most seconds a record waits for others to be delivered with.
        retry_initial: the first retry delay in seconds (doubling up to ``retry_max``).
        retry_max: the longest delay between retries.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        spool_path: Path,
        media_dir: Path,
        label: str,
        max_queue: int = 100_000,
        max_batch: int = 1000,
        batch_interval: float = 1.0,
        retry_initial: float = 0.05,
        retry_max: float = 2.0,
    ) -> None:
        self.sink = sink
        self.spool = SpoolFile(spool_path)
        self.media_dir = media_dir
        self.label = label
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.batch_interval = batch_interval
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.delivered = 0
        self.spooled = 0
        self.refused = 0
        self.failures = 0
        self._counts = threading.Lock()
        self._warned_unreadable: set[str] = set()  # metrics whose jax value could not be read
        self._spill: list[Record] = []
        self._spill_lock = threading.Lock()
        self._spill_since = 0.0
        self._target = sink.target()
        self._key = target_key(self._target)
        self._queue: queue.SimpleQueue[Record | Scalar | _Control] = queue.SimpleQueue()
        # _lock guards _pending, _in_flight, _in_call, _abandoned and the worker's spool writes
        # against the caller's take-overs in persist() and close().
        self._lock = threading.Lock()
        self._pending: list[Record] = []
        self._held_since = 0.0  # when the first record of the batch being held arrived
        # Set by flush(), close() and a queue that holds a whole batch: wakes a worker that holds
        # records (one that holds none waits on the queue itself).
        self._wake = threading.Event()
        self._in_flight: list[Record] = []
        self._in_call = False  # the worker is inside a backend call (it holds no record itself)
        self._abandoned = False
        self._warned = False
        self._failing = False
        self._next_retry = 0.0
        self._delay = retry_initial
        self._overflowed = False
        self._spool_dirty = False
        self._close_deadline = 0.0
        # The spool cannot be written (a full disk): why, and when to try again. Records then
        # wait in memory (_pending, _spill, _refused_waiting), in order.
        self._spool_error: str | None = None
        self._next_spool_try = 0.0
        self._spool_delay = retry_initial
        self._warned_spool = False
        self._refused_waiting: list[tuple[list[Record], str]] = []
        self._warned_worker = False
        self._held_controls: list[_Control] = []  # taken by the cycle that runs now
        self._thread = threading.Thread(
            target=self._run, name=f"substrax-tracking-{label}", daemon=True
        )
        self._thread.start()

    # --- the caller's side --------------------------------------------------------------
    def submit(self, record: Record | Scalar) -> None:
        """Queue ``record`` (never blocks on the backend; past ``max_queue``, into the spool file).

        A :data:`Scalar` tuple is made into its record by the worker.
        """
        queued = self._queue.qsize()
        if queued < self.max_queue:
            self._queue.put(record)
            if queued + 1 >= self.max_batch:
                self._wake.set()
            return
        if not self._overflowed:
            self._overflowed = True
            _logger.warning(
                "%s: the delivery queue is full; spilling records to %s (replayed once the "
                "backend keeps up)",
                self.label,
                self.spool.path,
            )
        with self._spill_lock:
            self._spill.append(as_record(record))
            if len(self._spill) == 1:
                self._spill_since = time.monotonic()
            due = self._spool_error is None and (  # a spool that failed: the worker retries it
                len(self._spill) >= _SPILL_BATCH
                or time.monotonic() - self._spill_since >= _SPILL_AGE
            )
        if due:
            self._write_spill()

    def _take_spill(self) -> list[Record]:
        with self._spill_lock:
            records, self._spill = self._spill, []
        return records

    def _write_spill(self) -> None:
        """Write the records spilled past the full queue to the spool, in one batch.

        A spool that cannot be written keeps them spilled, in memory, for a later try.
        """
        if not self._spool_due():
            return
        records = self._take_spill()
        if not records:
            return
        if self._to_spool(records):
            self._spool_dirty = True
            return
        with self._spill_lock:
            self._spill[:0] = records
            self._spill_since = time.monotonic()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is delivered; return whether it was."""
        if not self._thread.is_alive():
            return False
        control = _Control("flush")
        self._queue.put(control)
        self._wake.set()
        control.done.wait(timeout)
        return control.ok

    def persist(self, timeout: float) -> bool:
        """Deliver everything submitted so far, or write it to the spool file (fsynced).

        Returns within ``timeout`` seconds (and the time to write the spool) whatever the
        backend does: if the worker is still inside a backend call by then, the caller writes
        what is undelivered to the spool itself (what that call was sending included: it may
        arrive twice, which MLflow and W&B ignore for a metric of the same step, time and
        value). A worker busy with anything else (reading a jax value still computed) is
        waited for.

        Returns:
            whether every record submitted before the call was delivered or is in the spool
            (False: the spool could not be written, a full disk; they wait in memory).
        """
        if not self._thread.is_alive():
            return not self._pending and not self._spill
        control = _Control("persist")
        self._queue.put(control)
        self._wake.set()
        if control.done.wait(timeout):
            return control.ok
        while True:
            with self._lock:
                if self._abandoned:
                    return False
                if self._in_call and not control.done.is_set():
                    return self._take_over(control)
            if control.done.wait(0.05):
                return control.ok

    def _take_over(self, control: _Control) -> bool:
        """Spool what the worker holds while it is inside a backend call (under ``_lock``)."""
        records = [*self._in_flight, *self._pending]
        queued, controls = self._empty_queue()
        controls = [other for other in controls if other is not control]
        spilled = self._take_spill()
        try:
            if self._to_spool([*records, *queued, *spilled]):
                self._pending = []  # _in_flight stays the worker's: its call is still running
                self._spool_dirty = True  # sent (in order) once the call returns
                return True
            if queued and not self._pending:
                self._held_since = time.monotonic()
            self._pending.extend(queued)
            with self._spill_lock:
                self._spill[:0] = spilled
            return False
        finally:
            for other in controls:
                self._queue.put(other)
            control.done.set()

    def close(self, timeout: float = 30.0) -> int:
        """Deliver what it can within ``timeout`` seconds, spool the rest, end the run.

        Returns within ``timeout`` plus half a second (and the time to write the spool file)
        whatever the backend does.

        Returns:
            how many of this run's records the spool file holds afterwards.
        """
        self._close_deadline = time.monotonic() + timeout
        self._queue.put(_Control("close"))
        self._wake.set()
        self._thread.join(timeout + _CLOSE_GRACE)
        stuck = self._thread.is_alive()
        records = self._abandon()
        if records:
            try:
                self._spool_records(records, None)
            except OSError as error:
                _logger.error(  # noqa: TRY400  (the records are lost: say how many, and why)
                    "%s: %d records could not be written to %s at close (%s: %s) and are lost; "
                    "make room on its file system before a run ends",
                    self.label,
                    len(records),
                    self.spool.path,
                    type(error).__name__,
                    error,
                )
                records = []
        for refused, error_text in self._refused_waiting:
            try:
                self._spool_records(refused, error_text)
            except OSError as error:
                _logger.error(  # noqa: TRY400
                    "%s: %d refused records could not be written to %s (%s)",
                    self.label,
                    len(refused),
                    self.spool.refused_path,
                    error,
                )
        self._refused_waiting = []
        left = self._spooled_now()
        if stuck or records:
            self._warn_left(
                f"close_timeout={timeout:g} s ran out while a backend call was still running"
                if stuck
                else "the delivery thread stopped",
                left,
            )
        return left

    def _abandon(self) -> list[Record]:
        """Stop the worker from touching anything; return the records it had not delivered."""
        with self._lock:
            self._abandoned = True
            records = [*self._in_flight, *self._pending]
            self._in_flight, self._pending = [], []
        queued, controls = self._empty_queue()
        for item in controls:
            item.done.set()
        return records + queued + self._take_spill()

    def _empty_queue(self) -> tuple[list[Record], list[_Control]]:
        """Empty the queue: its records, in order, and its control messages."""
        records: list[Record] = []
        controls: list[_Control] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return records, controls
            if isinstance(item, _Control):
                controls.append(item)
            else:
                records.append(as_record(item))

    def _spooled_now(self) -> int:
        """How many of this run's records the spool holds (counted without parsing the lines)."""
        try:
            return self.spool.count(self._target)
        except OSError:
            return 0

    def _warn_left(self, why: str, count: int | None = None) -> None:
        if count is None:
            count = self._spooled_now()
        if count:
            _logger.warning(
                "%s: %s; %d records are kept in %s; send them with "
                "`python -m substrax.tracking replay %s`",
                self.label,
                why,
                count,
                self.spool.path,
                self.spool.path,
            )

    def _spool_records(self, records: list[Record], error: str | None) -> int:
        """Write ``records`` to the spool (with an ``error``: to ``<spool>.refused``); count them.

        Raises:
            OSError: the file could not be written (nothing of it was counted).
        """
        for record in records:
            try:
                record.materialize(self.media_dir, label=self.label, warned=self._warned_unreadable)
            except Exception as failure:
                record.payload = {"unserializable": repr(failure)}
                record.materialized = True
        written = self.spool.append(self._target, records, error)
        with self._counts:
            if error is None:
                self.spooled += written
            else:
                self.refused += written
        return written

    def _to_spool(self, records: list[Record], error: str | None = None) -> bool:
        """:meth:`_spool_records`, a failure to write noted (warned once); whether they were written."""
        try:
            self._spool_records(records, error)
        except OSError as failure:
            self._spool_failed(failure, len(records))
            return False
        if self._spool_error is not None:
            self._spool_error = None
            _logger.warning(
                "%s: %s is written again; the records that waited in memory are kept there",
                self.label,
                self.spool.path,
            )
        return True

    def _spool_failed(self, failure: OSError, count: int) -> None:
        first = self._spool_error is None
        self._spool_delay = (
            self.retry_initial if first else min(self._spool_delay * 2, self.retry_max)
        )
        self._spool_error = f"{type(failure).__name__}: {failure}"
        self._next_spool_try = time.monotonic() + self._spool_delay
        if not self._warned_spool:
            self._warned_spool = True
            _logger.warning(
                "%s could not write %s (%s); logging goes on: %d records and every later one "
                "wait in memory, in order, and are delivered or written once there is room "
                "(this is reported once; a crash before then loses them)",
                self.label,
                self.spool.path,
                self._spool_error,
                count,
            )

    def _spool_due(self) -> bool:
        """Whether to write to the spool now: it works, or the next try after a failure is due."""
        return self._spool_error is None or time.monotonic() >= self._next_spool_try

    def _refuse(self, records: list[Record], error: str) -> None:
        """Set ``records`` aside in ``<spool>.refused`` (in memory until that file can be written)."""
        self._refused_waiting.append((records, error))
        self._write_refused()

    def _write_refused(self) -> None:
        while self._refused_waiting and self._spool_due():
            records, error = self._refused_waiting[0]
            if not self._to_spool(records, error):
                return
            del self._refused_waiting[0]

    # --- the worker ---------------------------------------------------------------------
    def _run(self) -> None:
        _lower_priority()
        self._replay_spool_found()
        while not self._abandoned:
            try:
                if self._cycle():
                    return
            except Exception as error:  # never die: the records it holds are still held
                self._worker_failed(error)

    def _worker_failed(self, error: Exception) -> None:
        """Answer the controls of the cycle that raised (a close is queued again), pause, go on."""
        held, self._held_controls = self._held_controls, []
        for control in held:
            if control.kind == "close":
                self._queue.put(control)
            else:
                control.done.set()
        if not self._warned_worker:
            self._warned_worker = True
            _logger.warning(
                "%s: the delivery thread met an error (%s: %s); it goes on, and the records it "
                "holds are kept (this is reported once)",
                self.label,
                type(error).__name__,
                error,
                exc_info=error,
            )
        else:
            _logger.debug("%s: the delivery thread met an error again: %r", self.label, error)
        time.sleep(self.retry_max)

    def _cycle(self) -> bool:
        """Take what is queued and act on it; True once the worker is done (closed or abandoned)."""
        records, controls = self._next_items()
        self._held_controls = controls
        with self._lock:
            if self._abandoned:
                return True
            if records and not self._pending:
                self._held_since = time.monotonic()
            self._pending.extend(records)
        if controls or self._spill_due():
            self._write_spill()
        if self._refused_waiting:
            self._write_refused()
        due = bool(controls) or self._batch_due()
        retry_due = self._failing and (bool(controls) or time.monotonic() >= self._next_retry)
        if self._failing and (due or retry_due) and not self._spool_pending():
            return True
        if self._failing:  # what is held is in the spool now (unless the spool failed)
            self._answer(controls, "persist")
        if retry_due:
            self._retry()
        if not self._failing and self._pending and due:
            self._deliver_pending()
        if not self._failing and not self._pending and self._spool_dirty:
            self._spool_dirty = False  # records spilled past the full queue: send them
            self._retry()
        done = self._answer_all(controls)
        self._held_controls = []
        return done

    def _answer_all(self, controls: list[_Control]) -> bool:
        """Answer the cycle's controls, in order; True once a close ended the worker."""
        for control in controls:
            if control.kind == "close":
                self._finish_close()
                control.done.set()
                return True
            if control.kind == "persist":
                self._answer([control], "persist")
            else:
                control.ok = not self._failing and not self._pending and not self._spool_dirty
                control.done.set()
        return False

    def _answer(self, controls: list[_Control], kind: str) -> None:
        """Answer the ``persist`` controls: whether nothing is held in memory only."""
        for control in controls:
            if control.kind == kind and not control.done.is_set():
                control.ok = not self._pending and not self._spill and not self._refused_waiting
                control.done.set()

    def _next_items(self) -> tuple[list[Record], list[_Control]]:
        """Wait for what is next to do; return the records and controls queued by then.

        A worker that holds no records waits on the queue. One that holds a batch sleeps until
        the batch is due (or a retry, or a spill write), unless flush, close or a full batch
        wakes it, so that a record submitted meanwhile costs the caller no thread switch.
        """
        now = time.monotonic()
        waits: list[float] = []
        if self._failing:
            waits.append(self._next_retry - now)
        if self._pending:
            if self._failing and self._spool_error is not None:
                waits.append(self._next_spool_try - now)  # nowhere to put them before then
            else:
                waits.append(self._held_since + self.batch_interval - now)
        if self._spill or self._refused_waiting:
            waits.append(_SPILL_AGE if self._spool_error is None else self._next_spool_try - now)
        wait = max(0.0, min(waits)) if waits else None
        if not self._pending:
            return self._take(wait)
        self._wake.wait(wait)
        self._wake.clear()
        return self._take(0.0)

    def _batch_due(self) -> bool:
        """Whether the records held are sent (or spooled) now.

        A whole batch, or the oldest waited long enough; while the backend fails and the spool
        cannot be written either, not before the next try to write it.
        """
        if not self._pending:
            return False
        now = time.monotonic()
        if self._failing and self._spool_error is not None and now < self._next_spool_try:
            return False
        return len(self._pending) >= self.max_batch or now - self._held_since >= self.batch_interval

    def _spill_due(self) -> bool:
        with self._spill_lock:
            return (
                bool(self._spill)
                and time.monotonic() - self._spill_since >= _SPILL_AGE
                and self._spool_due()
            )

    def _take(self, wait: float | None) -> tuple[list[Record], list[_Control]]:
        """Records and controls from the queue: wait for the first, then take what is there."""
        records: list[Record] = []
        controls: list[_Control] = []
        try:
            item = self._queue.get(timeout=wait)
        except queue.Empty:
            return records, controls
        while True:
            if isinstance(item, _Control):
                controls.append(item)
                break
            records.append(as_record(item))
            if len(records) >= 10 * self.max_batch:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        return records, controls

    def _materialize_pending(self) -> bool:
        """Turn pending payloads into JSON data; a value that cannot be is set aside with its error.

        Under the lock, so that a record is materialized once even if close() spools it.
        Returns False if close() took over.
        """
        with self._lock:
            if self._abandoned:
                return False
            kept: list[Record] = []
            prefetch_scalars(self._pending)
            for record in self._pending:
                try:
                    kept.append(
                        record.materialize(
                            self.media_dir, label=self.label, warned=self._warned_unreadable
                        )
                    )
                except Exception as error:
                    _logger.warning(
                        "%s: a %s record at step %s cannot be sent (%s); it is kept in %s",
                        self.label,
                        record.kind,
                        record.step,
                        error,
                        self.spool.refused_path,
                    )
                    self._refuse([record], f"{type(error).__name__}: {error}")
            self._pending = kept
        return True

    def _deliver_pending(self) -> None:
        """Send what is held, in batches; a record refused for good is set aside alone.

        While the backend fails, this is the retry that probes it (the spool held nothing):
        the first batch it takes ends the failure.
        """
        singles = 0  # how many of the next records are sent one at a time (to find a refusal)
        if not self._materialize_pending():
            return
        while self._pending:
            chunk = self._next_chunk(single=singles > 0)
            outcome = self._send(chunk)
            if outcome is False:  # close() took over
                return
            if outcome is True:
                singles = max(0, singles - len(chunk))
                self.delivered += len(chunk)
                self._recovered()
                if self._spool_dirty:
                    self._spool_dirty = False
                    self._retry()
                continue
            if not self._is_permanent(outcome):
                self._on_failure(outcome)
                self._spool_pending()
                return
            left = self._set_aside(chunk, outcome, singles)
            if left is None:
                return
            singles = left

    def _send(self, chunk: list[Record]) -> bool | Exception:
        """Deliver ``chunk`` (taken off ``_pending``): True, the error (put back), or False (closed)."""
        with self._lock:
            if self._abandoned:
                return False
            self._in_flight = chunk
            self._in_call = True
            del self._pending[: len(chunk)]
        try:
            self.sink.deliver(chunk)
        except Exception as error:
            with self._lock:
                self._in_call = False
                if self._abandoned:
                    return False
                self._pending[:0] = self._in_flight
                self._in_flight = []
            return error
        with self._lock:
            self._in_call = False
            if self._abandoned:
                return False
            self._in_flight = []
        return True

    def _set_aside(self, chunk: list[Record], error: Exception, singles: int) -> int | None:
        """After a refusal of ``chunk`` (back at the head of ``_pending``): the new ``singles``.

        A batch is sent again one record at a time; a refused record of several scalars one
        scalar at a time; a refused record alone is set aside in ``<spool>.refused``. None if
        close() took over.
        """
        if len(chunk) > 1:
            return len(chunk)
        parts = split_scalars(chunk[0])
        with self._lock:
            if self._abandoned:
                return None
            if parts:
                self._pending[:1] = parts
                return max(0, singles - 1) + len(parts)
            _logger.warning(
                "%s refused a record (%s); it is kept in %s",
                self.label,
                error,
                self.spool.refused_path,
            )
            del self._pending[:1]
            self._refuse(chunk, f"{type(error).__name__}: {error}")
        return max(0, singles - 1)

    def _next_chunk(self, *, single: bool) -> list[Record]:
        first = self._pending[0]
        if first.kind not in _BATCHABLE or single:
            return [first]
        end = 1
        while (
            end < len(self._pending)
            and end < self.max_batch
            and self._pending[end].kind in _BATCHABLE
        ):
            end += 1
        return self._pending[:end]

    def _spool_pending(self) -> bool:
        """Move the pending records to the spool file; False if close() took over.

        A spool that cannot be written (a full disk) keeps them pending, in memory.
        """
        with self._lock:
            if self._abandoned:
                return False
            if not self._pending or not self._spool_due():
                return True
            if self._spool_error is not None:  # a try after a failure: one record first
                if not self._to_spool(self._pending[:1]):
                    return True
                del self._pending[:1]
            if self._to_spool(self._pending):
                self._pending = []
        return True

    def _is_permanent(self, error: BaseException) -> bool:
        try:
            return bool(self.sink.is_permanent(error))
        except Exception:
            return False

    def _on_failure(self, error: BaseException) -> None:
        self.failures += 1
        if not self._warned:
            self._warned = True
            _logger.warning(
                "%s could not deliver (%s: %s); logging goes on, records are kept in %s and "
                "retried (this is reported once); if they are still there when the run ends, "
                "send them with `python -m substrax.tracking replay %s`",
                self.label,
                type(error).__name__,
                error,
                self.spool.path,
                self.spool.path,
            )
        self._failing = True
        self._next_retry = time.monotonic() + self._delay
        self._delay = min(self._delay * 2, self.retry_max)

    def _replay(
        self, limit: int | None
    ) -> tuple[ReplayResult, dict[str, tuple[Mapping[str, Any], BaseException]]] | None:
        """Replay this run's spooled records (a backend call); None if close() took over."""
        with self._lock:
            if self._abandoned:
                return None
            self._in_call = True
        try:
            return run_replay(self.spool, sinks={self._key: self.sink}, only=self._key, limit=limit)
        finally:
            with self._lock:
                self._in_call = False

    def _retry(self) -> None:
        """Send this run's spooled records, in order; on success the backend is back.

        With nothing spooled, the records held in memory (a spool that could not be written)
        are the probe.
        """
        replayed = 0
        if self.spool.path.exists():
            # While the backend fails, a retry reads and sends only the spool's first lines: a
            # long spool is read in full once the backend took those.
            for limit in (_PROBE_LINES, None) if self._failing else (None,):
                try:
                    done = self._replay(limit)
                except SpoolNotFoundError:  # replayed meanwhile by another process
                    break
                except Exception as error:
                    self._on_failure(error)
                    return
                if done is None:
                    return
                result, errors = done
                replayed += result.delivered
                self.delivered += result.delivered
                self._note_refused(result)
                if self._key in errors:
                    self._on_failure(errors[self._key][1])
                    return
                if limit is not None and not self._spooled_now():
                    break
        if self._failing and not replayed and self._pending:
            self._deliver_pending()
            return
        self._recovered()

    def _note_refused(self, result: ReplayResult) -> None:
        if result.refused:
            with self._counts:
                self.refused += result.refused
            _logger.warning(
                "%s refused %d spooled records (%s); they are kept in %s, the rest goes on",
                self.label,
                result.refused,
                "; ".join(sorted(set(result.refused_reasons)))[:2000],
                result.refused_file,
            )

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            self._delay = self.retry_initial
            _logger.warning(
                "%s: delivering again after %d failed attempts", self.label, self.failures
            )

    def _drain(self) -> bool:
        """Take the records submitted before close; False if close() took over."""
        while True:
            records, controls = self._take(0.0)
            for control in controls:
                control.done.set()
            if not records and not controls:
                return True
            with self._lock:
                if self._abandoned:
                    return False
                self._pending.extend(records)

    def _finish_close(self) -> None:
        if not self._drain():
            return
        self._write_spill()
        self._deliver_until_deadline()
        left = len(self._pending)
        if not self._spool_pending():
            return
        if self._pending or self._spill:
            return  # the spool cannot be written: close() tries once more, and says what is lost
        if self._failing:
            # The backend is down: the run is ended by the replay that delivers its records.
            self._warn_left("the backend is unreachable")
            return
        if left:
            self._warn_left(f"close_timeout ran out with {left} records to send")
        try:
            self.sink.finish()
        except Exception as error:
            _logger.warning("%s: could not end the run cleanly: %s", self.label, error)

    def _deliver_until_deadline(self) -> None:
        """Deliver (or retry) until nothing is left or close's deadline passed."""
        while time.monotonic() < self._close_deadline:
            if self._failing:
                if not self._spool_pending():
                    return
                if time.monotonic() >= self._next_retry:
                    self._retry()
                else:
                    time.sleep(
                        max(0.0, min(self._next_retry, self._close_deadline) - time.monotonic())
                    )
            elif self._pending:
                self._deliver_pending()
            elif self._spool_dirty:
                self._spool_dirty = False
                self._retry()
            else:
                break

    def _replay_spool_found(self) -> None:
        """Send what an earlier run left in this spool file (every target in it)."""
        if not self.spool.path.exists():
            return
        with self._lock:
            self._in_call = True
        try:
            result, errors = run_replay(self.spool, sinks={self._key: self.sink})
        except Exception as error:
            _logger.warning("%s: could not replay %s: %s", self.label, self.spool.path, error)
            return
        finally:
            with self._lock:
                self._in_call = False
        self.delivered += result.delivered
        self._note_refused(result)
        if result.delivered:
            _logger.info("%s: replayed %d spooled records", self.label, result.delivered)
        if result.bad_lines:
            _logger.warning(
                "%s: lines of %s are not records: %s",
                self.label,
                self.spool.path,
                result.describe_bad_lines(),
            )
        for target, error in errors.values():
            _logger.warning(
                "%s: records for %s in %s could not be replayed yet (%s)",
                self.label,
                dict(target),
                self.spool.path,
                error,
            )
        if self._key in errors:
            self._on_failure(errors[self._key][1])
