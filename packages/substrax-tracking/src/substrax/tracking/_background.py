"""AsyncDelivery: records written ahead to a spool file by one thread, sent from it by another."""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ._errors import SpoolNotFoundError
from ._live import LiveLocks
from ._records import Record, Scalar, as_record, prefetch_scalars
from ._replay import run_replay
from ._send import deliver_in_memory, describe_error, run_of, target_key
from ._sink import Sink
from ._spool_writer import Backoff, SpoolWriter, start_worker


__all__ = ["AsyncDelivery"]

_logger = logging.getLogger(__name__)

_CLOSE_GRACE = 0.5  # seconds past close's deadline for the threads to stop
_PROBE_LINES = 1000  # spool lines a retry sends before it reads the whole spool
_LOCK_WAIT = 10.0  # the most seconds a send waits for another to let go of the spool
_SLICE = 0.1  # seconds a wait lasts before it looks whether a thread it waits for is gone


@dataclass(eq=False)
class _Control:
    kind: str  # "flush" (deliver), "persist" (on disk) or "close"
    ok: bool = False
    sent_after: int = 0  # a flush: the sender passes started before its records were written
    done: threading.Event = field(default_factory=threading.Event)


class AsyncDelivery:
    """Deliver records to a sink in the background; never block or raise in the caller.

    A writer thread appends submitted records to the spool (within ``batch_interval`` s, or once
    ``max_queue`` wait); a sender thread replays the spool to the sink in order, a pass per
    ``send_interval`` at most, retrying a failing sink with backoff. On a full disk records wait
    in memory, in order, and are sent from there.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        spool_path: Path,
        media_dir: Path,
        label: str,
        max_queue: int = 1000,
        batch_interval: float = 1.0,
        send_interval: float = 5.0,
        retry_initial: float = 0.05,
        retry_max: float = 2.0,
        reached: bool = True,
    ) -> None:
        self.sink = sink
        self.label = label
        self.max_queue = max_queue
        self.batch_interval, self.send_interval = batch_interval, send_interval
        self.delivered = self.failures = 0
        target = sink.target()
        self._run = run_of(target)
        self._backoff = Backoff(retry_initial, retry_max)  # the sink's; the spool has its own
        self._answered = reached  # the backend answered at the start
        self._spool = SpoolWriter(
            spool_path,
            target,
            media_dir=media_dir,
            label=label,
            backoff=Backoff(retry_initial, retry_max),
        )
        self._queue: queue.SimpleQueue[Record | Scalar | _Control] = queue.SimpleQueue()
        self._wake = threading.Event()  # wakes the writer
        self._send = threading.Event()  # wakes the sender
        self._urgent = threading.Event()  # a flush or close waits: the sender sends at once
        self._next_pass = 0.0  # the sender's next pass, unless urgent (time.monotonic())
        self._passes = threading.Condition()  # the sender's passes, started and done
        self._started = self._done = 0
        self._hung: int | None = None  # the pass a flush ran out of time on, still running
        self._raw: list[Record] = []  # values not read yet: an image waits for room on disk
        self._unwritten: list[Record] = []  # materialized, waiting for room on disk
        self._unwritten_lock = threading.Lock()
        self._in_hand = 0  # of them, taken by the sender
        self._unsynced = False
        self._deadline = 0.0  # close's: the sender's last moment
        self._closing = threading.Event()  # set by the writer once close's records are written
        self._abandoned = False
        self._finished = self._end_failed = False  # the run was ended; ending it failed
        self._warned: set[str] = set()
        # held: a replay leaves its runs alone; they name the attempt, for one after a kill
        self._lives = LiveLocks(self._spool.file.path, getattr(sink, "attempt", ""))
        self._lives.hold(self._run)
        self._thread, self._sender = (  # the writer, then the sender
            start_worker(
                loop,
                f"substrax-tracking-{label}{suffix}",
                label=label,
                stop=lambda: self._abandoned,
                first=self._first,
                pause=self._backoff.longest,
            )
            for loop, suffix in ((self._write_loop, ""), (self._send_loop, "-send"))
        )

    def _follow_target(self) -> None:
        """Once the sink names its run otherwise (created from a spec: by its id), spool so."""
        if target_key(target := self.sink.target()) != target_key(self._spool.target):
            self._run = run_of(target)
            self._lives.hold(self._run)
            self._spool.follow(target)

    @property
    def failing(self) -> bool:
        """Whether the backend failed its last send, or has not answered since the start."""
        return self._backoff.failing or not (self._answered or self.delivered > 0)

    @property
    def spooled(self) -> int:
        """How many of this run's records the spool file holds now (not delivered yet)."""
        return self._spool.count()

    def submit(self, record: Record | Scalar) -> None:
        """Queue ``record`` (a :data:`Scalar` tuple is made a record by the writer)."""
        self._queue.put(record)
        if self._queue.qsize() >= self.max_queue:
            self._wake.set()

    def flush(
        self, timeout: float | None = None, *, once: bool = False, brief: bool = False
    ) -> bool:
        """Wait until all submitted is delivered (``once``: one pass after the write; ``brief``: none on a call a flush timed out on); whether it was."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        control = self._control("flush")
        while not control.done.wait(min(_SLICE, max(0.0, deadline - time.monotonic()))):
            if not self._thread.is_alive() or time.monotonic() >= deadline:
                return False
        after = control.sent_after
        while not (brief and self._hung == self._started > self._done):  # a call that hangs
            with self._passes:
                wait = min(_SLICE, max(0.0, deadline - time.monotonic()))
                passed = self._passes.wait_for(lambda after=after: self._done > after, wait)
                after = self._started if passed else after
            if passed and (once or not self._left()):
                return not self._left()
            if time.monotonic() >= deadline or not self._sender.is_alive():
                self._hung = self._started if self._started > self._done else None
                return False
        return False

    def _left(self) -> bool:
        """Whether anything is not delivered: the backend failing, records on disk or waiting."""
        return bool(self._backoff.failing or self._waiting() or self._spool.count())

    def _waiting(self) -> int:
        """How many records wait in memory for room on disk."""
        return len(self._raw) + len(self._unwritten) + self._in_hand

    def persist(self, timeout: float) -> bool:
        """Write and fsync everything submitted so far, within ``timeout``; whether it is all on disk or delivered."""
        if not self._thread.is_alive():
            return not self._waiting()
        control = self._control("persist")
        return control.done.wait(timeout) and control.ok

    def close(self, timeout: float = 30.0) -> int:
        """Deliver what it can within ``timeout`` (plus about a second), end the run; how many records stay spooled."""
        self._deadline = time.monotonic() + timeout
        self._control("close")
        self._thread.join(timeout + _CLOSE_GRACE)
        self._sender.join(max(0.0, self._deadline - time.monotonic()) + _CLOSE_GRACE)
        stuck = self._sender.is_alive()
        reading = self._thread.is_alive()  # still waiting for a value: the queue stays unread
        self._abandoned = True
        self._urgent.set()
        self._send.set()
        lost = self._waiting() + (self._queue.qsize() if reading else 0)
        left = self._spool.count()
        failed = bool(getattr(self.sink, "failed", False))
        if not self._finished and (failed or stuck or not left):  # for the replay that ends it
            self._spool.write_end_mark(failed=failed)
        self._lives.let_go()
        if stuck:
            why = f"close_timeout={timeout:g} s ran out while a backend call was still running"
        elif self._backoff.failing or self._end_failed:
            why = "the backend is unreachable"
        else:
            why = "close_timeout ran out"
        self._spool.report_close(why, left=left, lost=lost, reading=reading, ended=self._finished)
        return left

    def _control(self, kind: str) -> _Control:
        control = _Control(kind)
        self._queue.put(control)
        self._wake.set()
        return control

    def _first(self, what: str) -> bool:
        """Whether ``what`` happens for the first time (warned about once)."""
        first = what not in self._warned
        self._warned.add(what)
        return first

    def _write_loop(self) -> bool:
        """Wait for records (or a control), write them; True once closed."""
        wait = self._spool.backoff.wait() if self._waiting() else None
        self._wake.wait(self.batch_interval if wait is None else min(wait, self.batch_interval))
        self._wake.clear()
        records: list[Record] = []
        controls: list[_Control] = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if isinstance(item, _Control):
                    controls.append(item)
                else:
                    records.append(as_record(item))
        kinds = {control.kind for control in controls}
        try:
            self._write(records, sync=bool(kinds - {"flush"}), now=bool(kinds))
        finally:
            for control in controls:
                control.ok = not self._waiting()
                with self._passes:
                    control.sent_after = self._started
                if control.kind == "close":
                    self._closing.set()
                control.done.set()
            if kinds - {"persist"}:
                self._urgent.set()  # a flush or close: the sender sends at once
            if kinds:
                self._send.set()
        return "close" in kinds

    def _write(self, records: list[Record], *, sync: bool, now: bool) -> None:
        """Append ``records``, after any that wait, to the spool; after a failure, when the backoff says or ``now``.

        ``now`` (a flush or close waits), what reads at once is written before a value still computing is waited for.
        """
        self._raw.extend(records)
        prefetch_scalars(self._raw)
        while True:
            unready = (i for i, record in enumerate(self._raw) if not record.ready())
            take = (next(unready, len(self._raw)) or 1) if now else len(self._raw)
            due = now or self._spool.backoff.due()
            materialized = self._spool.materialize(self._raw[:take], len(self._raw)) if due else []
            del self._raw[: len(materialized)]
            with self._unwritten_lock:
                self._unwritten.extend(materialized)
                if self._unwritten and due:
                    if self._spool.write(self._unwritten, sync=sync):
                        self._unwritten = []
                        self._unsynced = not sync
                elif sync and self._unsynced:
                    self._spool.sync()
                    self._unsynced = False
            if records or self._unwritten:  # written, or to be sent from memory
                self._send.set()
            if len(materialized) < take or not self._raw:  # all written, or no room on disk
                return

    def _send_loop(self) -> bool:
        """Send the spool's lines of this run; True once closed."""
        if self._started == 0:
            self._send_pass()
            if not self._abandoned and self._lives.held[self._run] is not None:  # it stays its own
                self._spool.replay_found(lambda: self._abandoned or self._closing.is_set())
        while not self._closing.is_set() and not self._abandoned:
            self._send.wait(self._backoff.wait())
            if not self._backoff.due():  # woken while the sink fails: wait for the next try
                self._closing.wait(self._backoff.wait())
                continue
            if not self._backoff.failing:  # a retry goes when the backoff says
                self._urgent.wait(self._next_pass - time.monotonic())  # a pass per send_interval
            self._send.clear()
            self._urgent.clear()
            if not self._closing.is_set():
                self._send_pass()
        self._finish()
        return True

    def _send_pass(self) -> None:
        """Send this run's spooled lines (an earlier attempt's too), then what waits in memory."""
        with self._passes:
            self._started += 1
        began, delivered = time.monotonic(), self.delivered
        try:
            if self._send_spool() and self._unwritten:
                self._send_unwritten()
            self._follow_target()
        finally:
            if self.delivered > delivered:  # a pass that sent nothing sets no wait
                self._next_pass = began + self.send_interval
            with self._passes:
                self._done += 1
                self._passes.notify_all()

    def _send_spool(self) -> bool:
        """Replay the spool (a probe of its first lines while the sink fails); whether it all went."""
        if not self._spool.file.path.exists():
            return self._spool_sent()
        for limit in (_PROBE_LINES, None) if self._backoff.failing else (None,):
            try:
                result, errors = run_replay(
                    self._spool.file,
                    sinks=dict.fromkeys(map(target_key, self._spool.targets()), self.sink),
                    only=tuple(self._lives.held),
                    own=tuple(self._lives.held),
                    stop=lambda: self._abandoned,
                    limit=limit,
                    wait=_LOCK_WAIT,
                    on_refused=self._spool.refusals.note,
                    read=self._spool.read_all,
                )
            except SpoolNotFoundError:  # replayed meanwhile by another process
                return self._spool_sent()
            except Exception as error:  # another replay holds it, or it cannot be read
                return self._failed(error)
            self.delivered += result.delivered
            if result.bad_lines:  # damaged by hand or by a crash: moved aside, and said so
                path = self._spool.file.path
                _logger.warning(
                    f"{self.label}: lines of {path} are not records: {result.describe_bad_lines()}"
                )
            if errors:  # of this run's lines, the only ones sent
                return self._failed(next(iter(errors.values()))[1])
            if limit is not None and not self._spool.count():
                break
        return self._spool_sent()

    def _spool_sent(self) -> bool:
        """The spool's lines went: a recovery, unless records in memory (a full disk) still tell."""
        return True if self._unwritten else self._recovered()

    def _send_unwritten(self) -> None:
        """Send the records that wait in memory, as a replay sends the spool."""
        with self._unwritten_lock:  # taken: the writer cannot also write them meanwhile
            records, self._unwritten = self._unwritten, []
            self._in_hand = len(records)
        done: set[int] = set()
        try:
            job, error = deliver_in_memory(
                records, self._spool.target, self.sink, self._spool.refusals.note
            )
            done = {*job.delivered, *job.refused}
        finally:
            with self._unwritten_lock:  # what did not arrive waits again, first
                self._unwritten[:0] = [r for i, r in enumerate(records) if i not in done]
                self._in_hand = 0
        self.delivered += len(job.delivered)
        self._spool.add_refused([entry for i in sorted(job.refused) for entry in job.refused[i]])
        _ = self._recovered() if error is None else self._failed(error)

    def _failed(self, error: BaseException) -> bool:
        self.failures += 1
        if self._first("backend"):
            path = self._spool.file.path
            _logger.warning(
                f"{self.label} could not deliver ({describe_error(error)}); logging goes on, records "
                f"are kept in {path} and retried (this is reported once); if they are still "
                f"there when the run ends, send them with `python -m substrax.tracking replay "
                f"{path}`"
            )
        self._backoff.fail()
        return False

    def _recovered(self) -> bool:
        if self._backoff.recover():
            _logger.warning(f"{self.label}: delivering again after {self.failures} failed attempts")
        return True

    def _finish(self) -> None:
        """At close: send until the deadline, then end the run (retried with a backoff of its own)."""
        end = Backoff(self._backoff.initial, self._backoff.longest)
        while not self._abandoned and time.monotonic() < self._deadline:
            if self._backoff.due() and (
                self._started == 0 or self._unwritten or self._spool.count()
            ):
                self._send_pass()
            done = not self._backoff.failing and not self._waiting() and not self._spool.count()
            if done and end.due():
                try:
                    self.sink.finish()
                except Exception as error:
                    end.fail()
                    self._end_failed = True
                    _logger.debug("%s: could not end the run yet: %r", self.label, error)
                else:
                    self._finished = True
                    return
            waits = [w for w in (self._backoff.wait(), end.wait()) if w is not None]
            time.sleep(max(0.0, min([*waits, 0.05, self._deadline - time.monotonic()])))
