"""AsyncDelivery: a bounded queue and a worker thread between the training step and a remote backend."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from pathlib import Path

from ._records import Record
from ._spool import Sink, SpoolFile, replay_spool


__all__ = ["AsyncDelivery"]

_log = logging.getLogger("substrax.tracking")

_BATCHABLE = frozenset({"scalars", "hyperparams"})


class _Control:
    __slots__ = ("done", "kind", "ok")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.done = threading.Event()
        self.ok = False


class AsyncDelivery:
    """Deliver records to a sink from a worker thread; never block or raise in the caller.

    The caller's :meth:`submit` puts a record on a bounded queue (or, if the queue is full,
    into the spool file). The worker materializes records, sends them in batches, and on a
    failure logs one warning, keeps them, and retries with backoff. Records the backend refuses
    and those still undelivered at :meth:`close` go to the spool file, which
    :func:`replay_spool` (or ``python -m substrax.tracking replay``) sends later. After a
    recovery the worker replays the spool itself.

    Args:
        sink: the backend run.
        spool_path: the spool file.
        media_dir: where images are written before upload.
        label: the name used in log messages.
        max_queue: the queue bound.
        max_batch: records per delivery.
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
        retry_initial: float = 0.05,
        retry_max: float = 2.0,
    ) -> None:
        self.sink = sink
        self.spool = SpoolFile(spool_path)
        self.media_dir = media_dir
        self.label = label
        self.max_batch = max_batch
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.delivered = 0
        self.spooled = 0
        self.failures = 0
        self._target = sink.target()
        self._target_key = json.dumps(self._target, sort_keys=True)
        self._queue: queue.Queue[Record | _Control] = queue.Queue(maxsize=max_queue)
        self._pending: list[Record] = []
        self._warned = False
        self._failing = False
        self._next_retry = 0.0
        self._delay = retry_initial
        self._overflowed = False
        self._singles = 0
        self._spool_dirty = False
        self._close_deadline = 0.0
        self._thread = threading.Thread(
            target=self._run, name=f"substrax-tracking-{label}", daemon=True
        )
        self._thread.start()

    # --- the caller's side --------------------------------------------------------------
    def submit(self, record: Record) -> None:
        """Queue ``record`` (never blocks; a full queue spills into the spool file)."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            if not self._overflowed:
                self._overflowed = True
                _log.warning(
                    "%s: the delivery queue is full; spilling records to %s (replayed once the "
                    "backend keeps up)",
                    self.label,
                    self.spool.path,
                )
            self.spooled += self.spool.append(self._target, [record.materialize(self.media_dir)])
            self._spool_dirty = True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is delivered; return whether it was."""
        control = _Control("flush")
        self._queue.put(control)
        control.done.wait(timeout)
        return control.ok

    def close(self, timeout: float = 30.0) -> int:
        """Deliver what it can within ``timeout`` seconds, spool the rest, end the run.

        Returns:
            how many records went to the spool file at close.
        """
        before = self.spooled
        self._close_deadline = time.monotonic() + timeout
        control = _Control("close")
        self._queue.put(control)
        self._thread.join(timeout + 30.0)
        return self.spooled - before

    # --- the worker ---------------------------------------------------------------------
    def _run(self) -> None:
        self._replay_own_spool()
        while True:
            controls: list[_Control] = []
            wait = None if not self._pending else max(0.0, self._next_retry - time.monotonic())
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = None
            while item is not None:
                if isinstance(item, _Control):
                    controls.append(item)
                    break
                self._pending.append(item)
                if len(self._pending) >= 10 * self.max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
            if self._pending and (
                not self._failing or time.monotonic() >= self._next_retry or controls
            ):
                self._deliver_pending()
            for control in controls:
                if control.kind == "close":
                    self._finish_close()
                    control.ok = not self._pending
                    control.done.set()
                    return
                control.ok = not self._pending
                control.done.set()

    def _deliver_pending(self) -> None:
        while self._pending:
            chunk = self._next_chunk()
            try:
                for record in chunk:
                    record.materialize(self.media_dir)
                self.sink.deliver(chunk)
            except Exception as error:
                if not self._is_permanent(error):
                    self._on_failure(error)
                    return
                if len(chunk) > 1:  # find the refused record: send these one at a time
                    self._singles = len(chunk)
                    continue
                _log.warning(
                    "%s refused a record (%s); it is kept in %s",
                    self.label,
                    error,
                    self.spool.path,
                )
                self.spooled += self._spool_chunk(chunk, f"{type(error).__name__}: {error}")
                self._done(chunk)
                continue
            self._done(chunk)
            self.delivered += len(chunk)
            if self._failing:
                self._failing = False
                self._delay = self.retry_initial
                _log.warning(
                    "%s: delivering again after %d failed attempts", self.label, self.failures
                )
                self._replay_own_spool()
            elif self._spool_dirty:
                self._spool_dirty = False
                self._replay_own_spool()

    def _done(self, chunk: list[Record]) -> None:
        del self._pending[: len(chunk)]
        self._singles = max(0, self._singles - len(chunk))

    def _spool_chunk(self, chunk: list[Record], error: str | None) -> int:
        for record in chunk:
            try:
                record.materialize(self.media_dir)
            except Exception as failure:
                record.payload = {"unserializable": repr(failure)}
                record.materialized = True
        return self.spool.append(self._target, chunk, error)

    def _is_permanent(self, error: BaseException) -> bool:
        try:
            return bool(self.sink.is_permanent(error))
        except Exception:
            return False

    def _next_chunk(self) -> list[Record]:
        first = self._pending[0]
        if first.kind not in _BATCHABLE or self._singles:
            return [first]
        end = 1
        while (
            end < len(self._pending)
            and end < self.max_batch
            and self._pending[end].kind in _BATCHABLE
        ):
            end += 1
        return self._pending[:end]

    def _on_failure(self, error: BaseException) -> None:
        self.failures += 1
        if not self._warned:
            self._warned = True
            _log.warning(
                "%s could not deliver (%s: %s); logging goes on, records are buffered and retried, "
                "and any left at close are written to %s (this is reported once)",
                self.label,
                type(error).__name__,
                error,
                self.spool.path,
            )
        self._failing = True
        self._next_retry = time.monotonic() + self._delay
        self._delay = min(self._delay * 2, self.retry_max)

    def _finish_close(self) -> None:
        while True:
            # Drain whatever is still queued (records submitted before close).
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Record):
                self._pending.append(item)
            else:
                item.ok = False
                item.done.set()
        while self._pending and time.monotonic() < self._close_deadline:
            self._deliver_pending()
            if self._pending:
                time.sleep(max(0.0, min(self._next_retry, self._close_deadline) - time.monotonic()))
        if self._pending:
            count = self._spool_chunk(self._pending, None)
            self.spooled += count
            self._pending.clear()
            _log.warning(
                "%s: %d records could not be delivered and are kept in %s; send them with "
                "`python -m substrax.tracking replay %s`",
                self.label,
                count,
                self.spool.path,
                self.spool.path,
            )
        try:
            self.sink.finish()
        except Exception as error:
            _log.warning("%s: could not end the run cleanly: %s", self.label, error)

    def _replay_own_spool(self) -> None:
        if not self.spool.path.exists():
            return
        try:
            result = replay_spool(self.spool.path, sinks={self._target_key: self.sink})
        except Exception as error:
            _log.warning("%s: could not replay %s: %s", self.label, self.spool.path, error)
            return
        if result.delivered:
            self.delivered += result.delivered
            _log.info("%s: replayed %d spooled records", self.label, result.delivered)
