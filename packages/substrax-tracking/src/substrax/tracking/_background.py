"""AsyncDelivery: a queue and a worker thread between the training step and a remote backend."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Unpack

from ._records import Record, Scalar, as_record, on_host
from ._sender import Sender, SenderOptions, lower_priority
from ._spool import Sink
from ._spool_writer import describe


__all__ = ["AsyncDelivery"]

_logger = logging.getLogger(__name__)

_CLOSE_GRACE = 0.5  # seconds past close's deadline for the worker to write the spool and stop
_SPILL_BATCH = 1000  # held records past which spilled ones are written to the spool (fsynced)


@dataclass(eq=False)
class _Control:
    kind: str  # "flush" (deliver), "persist" (deliver or spool) or "close"
    ok: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class AsyncDelivery(Sender):
    """Deliver records to a sink from a worker thread; never block or raise in the caller.

    :meth:`submit` queues a record (past ``max_queue``, into the spool file). The worker, at a
    lower CPU priority than the training threads (Linux), holds records for ``batch_interval``
    seconds (or until ``max_batch`` wait, or :meth:`flush`, :meth:`persist` or :meth:`close`),
    then reads their values and sends them as :class:`Sender` does. While the spool cannot be
    written (a full disk), records wait in memory, in order. Nothing is dropped, and no error
    stops the worker.

    Args:
        sink: the backend run.
        max_queue: the queue bound.
        batch_interval: the most seconds a record waits for others to be delivered with.
        **options: the spool, the media directory, the label and the batching and retries, as
            :class:`Sender` takes them.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        max_queue: int = 100_000,
        batch_interval: float = 1.0,
        **options: Unpack[SenderOptions],
    ) -> None:
        super().__init__(sink, **options)
        self.max_queue = max_queue
        self.batch_interval = batch_interval
        self._queue: queue.SimpleQueue[Record | Scalar | _Control] = queue.SimpleQueue()
        self._spill: list[Record | Scalar] = []  # past a full queue: taken after the queue
        self._spill_lock = threading.Lock()
        self._spilling = (
            False  # records go to _spill, not to the queue, until the worker takes them
        )
        self._wake = threading.Event()  # wakes a worker that holds records
        self._close_deadline = 0.0
        self._held_controls: list[_Control] = []  # the running cycle's
        self._flight_spooled: list[Record] | None = None  # the _in_flight spooled by a take-over
        self._thread = threading.Thread(
            target=self._run, name=f"substrax-tracking-{self.label}", daemon=True
        )
        self._thread.start()

    def submit(self, record: Record | Scalar) -> None:
        """Queue ``record`` (a :data:`Scalar` tuple is made a record by the worker)."""
        if not self._spilling:
            queued = self._queue.qsize()
            if queued < self.max_queue:
                self._queue.put(record)
                if queued + 1 >= self.max_batch:
                    self._wake.set()
                return
        with self._spill_lock:  # past a full queue: kept in order, behind what is queued
            if not self._spilling and self._queue.qsize() < self.max_queue:
                self._queue.put(record)
                return
            self._spilling = True
            self._spill.append(record)
            full = len(self._spill) >= _SPILL_BATCH
        if self._first("overflow"):
            _logger.warning(
                f"{self.label}: the delivery queue is full; spilling records to "
                f"{self._spool.file.path} (replayed once the backend keeps up)"
            )
            self._wake.set()
        if full and self._in_call:  # the worker is stuck in a backend call: spool what it holds
            with self._lock:
                if self._in_call and not self._abandoned and on_host(self._spill):
                    self._spool_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is delivered; return whether it was."""
        if not self._thread.is_alive():
            return False
        control = self._control("flush")
        control.done.wait(timeout)
        return control.ok

    def persist(self, timeout: float) -> bool:
        """Deliver everything submitted so far, or write it to the spool file (fsynced).

        Returns within ``timeout`` seconds (and the time to write the spool): a worker still
        inside a backend call by then is taken over, its call's records spooled too (MLflow and
        W&B ignore such a record if it also arrives). A worker busy otherwise is waited for.

        Returns:
            whether every record submitted before the call was delivered or is in the spool
            (False: the spool could not be written, a full disk; they wait in memory).
        """
        if not self._thread.is_alive():
            return self._only_on_disk()
        control = self._control("persist")
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

    def close(self, timeout: float = 30.0) -> int:
        """Deliver what it can within ``timeout`` seconds, spool the rest, end the run.

        Returns within ``timeout`` plus half a second (and the time to write the spool file)
        whatever the backend does.

        Returns:
            how many of this run's records the spool file holds afterwards.
        """
        self._close_deadline = time.monotonic() + timeout
        self._control("close")
        self._thread.join(timeout + _CLOSE_GRACE)
        stuck = self._thread.is_alive()
        records = self._abandon()
        written = bool(records) and self._spool.write_last(records)
        self._spool.write_refused_last()
        left = self._spool.count()
        if left and getattr(self.sink, "failed", False):  # the replay that ends the run: failed
            self._spool.write_failed_mark()
        if stuck:
            why = f"close_timeout={timeout:g} s ran out while a backend call was still running"
            self._spool.warn_left(why, left)
        elif written:
            self._spool.warn_left("the delivery thread stopped", left)
        return left

    def _control(self, kind: str) -> _Control:
        control = _Control(kind)
        self._queue.put(control)
        self._wake.set()
        return control

    def _take_over(self, control: _Control) -> bool:
        """Spool what the worker holds while it is inside a backend call (under ``_lock``)."""
        try:
            return self._spool_all(control)
        finally:
            control.done.set()

    def _spool_all(self, control: _Control | None = None) -> bool:
        """Spool, in order, what the worker holds in a backend call and what waits (under ``_lock``)."""
        queued, controls = self._take_all()
        for other in controls:
            if other is not control:
                self._queue.put(other)
        flight = [] if self._flight_spooled is self._in_flight else self._in_flight
        if self._spool.write([*flight, *self._pending, *queued]):
            self._pending = []  # _in_flight stays the worker's: its call is still running
            self._flight_spooled = self._in_flight
            self._spool_dirty = True  # sent, in order, once the call returns
            return True
        self._hold(queued)
        return False

    def _abandon(self) -> list[Record]:
        """Stop the worker from touching anything; return the records it had not delivered."""
        with self._lock:
            self._abandoned = True
            records = [*self._in_flight, *self._pending]
            self._in_flight, self._pending = [], []
        queued, controls = self._take_all()
        for control in controls:
            control.done.set()
        return records + queued

    def _only_on_disk(self) -> bool:
        """Whether no record waits in memory only (a spool that cannot be written)."""
        return not self._pending and not self._spill and not self._spool.waiting

    def _take_all(self) -> tuple[list[Record], list[_Control]]:
        """Take everything queued, then the records spilled past it (in the order submitted)."""
        with self._spill_lock:
            records, controls = self._take(everything=True)
            spilled, self._spill, self._spilling = self._spill, [], False
        return records + [as_record(item) for item in spilled], controls

    def _run(self) -> None:
        lower_priority()
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
        # A handler that raises (pytest's does) or a traceback that cannot be formatted (the
        # stdlib's linecache races a library that drops its entries) must not end the worker.
        with contextlib.suppress(Exception):
            if self._first("worker"):
                _logger.warning(
                    f"{self.label}: the delivery thread met an error ({describe(error)}); it "
                    "goes on, and the records it holds are kept (this is reported once)",
                    exc_info=error,
                )
            else:
                _logger.debug("%s: the delivery thread met an error again: %r", self.label, error)
        time.sleep(self._backoff.longest)

    def _cycle(self) -> bool:
        """Take what is queued and act on it; True once the worker is done (closed or abandoned)."""
        records, controls, spilled = self._next_items()
        self._held_controls = controls
        with self._lock:
            if self._abandoned:
                return True
            self._hold(records)
        if spilled and len(self._pending) >= _SPILL_BATCH:
            with self._lock:  # the backend does not keep up: to the spool, sent from there
                if not self._abandoned and self._spool.due() and self._spool.write(self._pending):
                    self._pending, self._spool_dirty = [], True
        self._spool.write_refused()
        due = bool(controls) or self._batch_due()
        retry_due = self._backoff.failing and (bool(controls) or self._backoff.due())
        if self._backoff.failing:
            if (due or retry_due) and not self._spool_pending():
                return True
            for control in controls:  # what is held is in the spool now (unless it failed)
                self._answer_persist(control)
        if retry_due:
            self._retry()
        if not self._backoff.failing and self._spool_dirty:
            self._spool_dirty = False  # spooled while the backend worked: sent before what is held
            self._retry()
        if not self._backoff.failing and self._pending and due:
            self._deliver_pending()
        for control in controls:
            self._answer_persist(control)
            if control.kind == "close":
                self._finish_close()
            elif control.kind == "flush":
                control.ok = not (self._backoff.failing or self._pending or self._spool_dirty)
            control.done.set()
        self._held_controls = []
        return any(control.kind == "close" for control in controls)

    def _answer_persist(self, control: _Control) -> None:
        """Answer a ``persist`` (unless a take-over did): whether nothing waits in memory only."""
        if control.kind == "persist" and not control.done.is_set():
            control.ok = self._only_on_disk()
            control.done.set()

    def _next_items(self) -> tuple[list[Record], list[_Control], bool]:
        """Wait for what is next to do (with records held: until due, unless woken); take it.

        Records spilled past a full queue are taken with all that is queued before them.
        """
        now = time.monotonic()
        spool_next = self._spool.backoff.next_try if self._spool.backoff.failing else None
        waits: list[float] = []
        if self._backoff.failing:
            waits.append(self._backoff.next_try)
        if self._pending:  # while nothing works, they wait for the spool's next try
            due = self._held_since + self.batch_interval
            waits.append(spool_next if spool_next is not None and self._backoff.failing else due)
        if self._spilling:
            waits.append(now)
        if self._spool.waiting:
            waits.append(now + self.batch_interval if spool_next is None else spool_next)
        wait = max(0.0, min(waits) - now) if waits else None
        if self._pending:
            self._wake.wait(wait)
            self._wake.clear()
        records, controls = self._take(wait if not self._pending else 0.0)
        if not self._spilling:
            return records, controls, False
        more, later = self._take_all()
        return records + more, controls + later, True

    def _take(
        self, wait: float | None = 0.0, *, everything: bool = False
    ) -> tuple[list[Record], list[_Control]]:
        """Wait up to ``wait`` s for an item, then take all queued, or up to a control or ten batches."""
        records: list[Record] = []
        controls: list[_Control] = []
        try:
            item = self._queue.get(timeout=wait)
            while True:
                if isinstance(item, _Control):
                    controls.append(item)
                else:
                    records.append(as_record(item))
                if not everything and (controls or len(records) >= 10 * self.max_batch):
                    break
                item = self._queue.get_nowait()
        except queue.Empty:
            pass
        return records, controls

    def _batch_due(self) -> bool:
        """Whether the held records go now: a full batch, or waited enough (if all is down, the spool's next try)."""
        if not self._pending or (self._backoff.failing and not self._spool.due()):
            return False
        waited = time.monotonic() - self._held_since
        return len(self._pending) >= self.max_batch or waited >= self.batch_interval

    def _finish_close(self) -> None:
        records, controls = self._take_all()
        for control in controls:
            control.done.set()
        with self._lock:
            if self._abandoned:
                return
            self._hold(records)
        self._deliver_until_deadline()
        left = len(self._pending)
        if not self._spool_pending() or self._pending:
            return  # close() took over, or tries the spool once more and says what is lost
        if self._backoff.failing:  # the run is ended by the replay that delivers its records
            self._spool.warn_left("the backend is unreachable")
            return
        if left:
            self._spool.warn_left(f"close_timeout ran out with {left} records to send")
        try:
            self.sink.finish()
        except Exception as error:
            _logger.warning(f"{self.label}: could not end the run cleanly: {error}")

    def _deliver_until_deadline(self) -> None:
        while time.monotonic() < self._close_deadline:
            if self._backoff.failing:
                if not self._spool_pending():
                    return
                if self._backoff.due():
                    self._retry()
                else:
                    until = min(self._backoff.next_try, self._close_deadline)
                    time.sleep(max(0.0, until - time.monotonic()))
            elif self._spool_dirty:  # spooled before what is held
                self._spool_dirty = False
                self._retry()
            elif self._pending:
                self._deliver_pending()
            else:
                break
