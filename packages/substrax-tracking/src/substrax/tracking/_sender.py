"""Sender: records held for a backend, sent in batches, set aside when refused, spooled while it fails."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from ._errors import SpoolNotFoundError
from ._records import Record, prefetch_scalars, split_scalars
from ._replay import ReplayResult, is_permanent, run_replay, target_key
from ._spool import Sink
from ._spool_writer import Backoff, SpoolWriter, describe


__all__ = ["Sender", "SenderOptions", "lower_priority"]

_logger = logging.getLogger(__name__)

_BATCHABLE = frozenset({"scalars", "hyperparams"})
_PROBE_LINES = 1000  # spool lines a retry sends before it reads the whole spool
_NICE = 10  # how much lower the worker's CPU priority is than the training threads'

type _Replayed = tuple[ReplayResult, dict[str, tuple[Mapping[str, Any], BaseException]]]


def lower_priority() -> None:
    """Lower the calling thread's CPU priority (on Linux, where each thread has its own)."""
    if sys.platform.startswith("linux"):
        thread = threading.get_native_id()
        try:
            nice = os.getpriority(os.PRIO_PROCESS, thread)
            os.setpriority(os.PRIO_PROCESS, thread, min(nice + _NICE, 19))  # 19: the lowest
        except OSError as error:  # a sandbox that forbids it
            _logger.debug("could not lower the delivery thread's priority: %s", error)


class SenderOptions(TypedDict):
    """The keyword arguments of :class:`Sender`, which :class:`AsyncDelivery` passes on."""

    spool_path: Path
    media_dir: Path
    label: str
    max_batch: NotRequired[int]
    retry_initial: NotRequired[float]
    retry_max: NotRequired[float]


class Sender:
    """Send the records held in ``_pending`` to a sink; the base of :class:`AsyncDelivery`.

    Batchable records go together, at most ``max_batch`` at a time. A record the sink refuses
    for good goes to ``<spool>.refused`` (of several scalars, only the refused ones) and the
    rest goes on. While the sink fails (warned once), records go to the spool and are retried
    from there, in order, with backoff. ``_lock`` guards what is held against a caller that
    takes it over while a backend call runs; once ``_abandoned``, nothing is touched.

    Args:
        sink: the backend run.
        spool_path: the spool file.
        media_dir: where images are written before upload.
        label: the name used in log messages.
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
        max_batch: int = 1000,
        retry_initial: float = 0.05,
        retry_max: float = 2.0,
    ) -> None:
        self.sink = sink
        self.label = label
        self.max_batch = max_batch
        self.delivered = 0
        self.failures = 0
        target = sink.target()
        self._key = target_key(target)
        self._backoff = Backoff(retry_initial, retry_max)  # the backend's
        self._spool = SpoolWriter(
            spool_path,
            target,
            media_dir=media_dir,
            label=label,
            backoff=Backoff(retry_initial, retry_max),
        )
        self._lock = threading.Lock()
        self._pending: list[Record] = []
        self._held_since = 0.0  # when the first record held arrived
        self._in_flight: list[Record] = []
        self._in_call = False  # inside a backend call
        self._abandoned = False
        self._spool_dirty = False  # this run's records wait in the spool while the backend works
        self._warned: set[str] = set()

    @property
    def spooled(self) -> int:
        """How many records were written to the spool file."""
        return self._spool.spooled

    @property
    def refused(self) -> int:
        """How many records the backend refused (kept in ``<spool>.refused``)."""
        return self._spool.refused

    def _first(self, what: str) -> bool:
        """Whether ``what`` happens for the first time (it is warned about once)."""
        first = what not in self._warned
        self._warned.add(what)
        return first

    def _hold(self, records: list[Record]) -> None:  # under _lock
        if records and not self._pending:
            self._held_since = time.monotonic()
        self._pending.extend(records)

    def _spool_pending(self) -> bool:
        """Move the held records to the spool (or keep them); False if close() took over."""
        with self._lock:
            if self._abandoned:
                return False
            if not self._pending or not self._spool.due():
                return True
            if self._spool.backoff.failing:  # a try after a failure: one record first
                if not self._spool.write(self._pending[:1]):
                    return True
                del self._pending[:1]
            if self._spool.write(self._pending):
                self._pending = []
        return True

    def _deliver_pending(self) -> None:
        """Send what is held, in batches; a record refused for good is set aside alone.

        While the backend fails, this is the retry that probes it (nothing was spooled).
        """
        if not self._materialize_pending():
            return
        singles = 0  # how many of the next records are sent one at a time (to find a refusal)
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

    def _materialize_pending(self) -> bool:
        """Read the held records' values (refusing what cannot be); False if close() took over."""
        with self._lock:
            if self._abandoned:
                return False
            prefetch_scalars(self._pending)
            kept: list[Record] = []
            for record in self._pending:
                try:
                    kept.append(self._spool.materialize(record))
                except Exception as error:
                    self._spool.refuse(record, error)
            self._pending = kept
        return True

    def _next_chunk(self, *, single: bool) -> list[Record]:
        """The next records to send together: batchable ones, at most ``max_batch``."""
        if single or self._pending[0].kind not in _BATCHABLE:
            return self._pending[:1]
        head = self._pending[: self.max_batch]
        end = next((i for i, r in enumerate(head) if r.kind not in _BATCHABLE), len(head))
        return head[:end]

    def _send(self, chunk: list[Record]) -> bool | Exception:
        """Deliver the head of ``_pending``: True, the error (put back), or False if closed."""
        with self._lock:
            if self._abandoned:
                return False
            self._in_flight, self._in_call = chunk, True
            del self._pending[: len(chunk)]
        error = None
        try:
            self.sink.deliver(chunk)
        except Exception as failure:
            error = failure
        with self._lock:
            self._in_call = False
            if self._abandoned:
                return False
            if error is not None:
                self._pending[:0] = self._in_flight
            self._in_flight = []
        return True if error is None else error

    def _set_aside(self, chunk: list[Record], error: Exception, singles: int) -> int | None:
        """After a refusal of ``chunk`` (back at the head of ``_pending``): the new ``singles``.

        A batch is sent again a record at a time, a record of several scalars a scalar at a
        time; a record alone is refused. None if close() took over.
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
            del self._pending[:1]
            self._spool.refuse(chunk[0], error)
        return max(0, singles - 1)

    def _is_permanent(self, error: Exception) -> bool:
        return is_permanent(self.sink, error)

    def _on_failure(self, error: BaseException) -> None:
        self.failures += 1
        if self._first("backend"):
            path = self._spool.file.path
            _logger.warning(
                f"{self.label} could not deliver ({describe(error)}); logging goes on, records "
                f"are kept in {path} and retried (this is reported once); if they are still "
                f"there when the run ends, send them with `python -m substrax.tracking replay "
                f"{path}`"
            )
        self._backoff.fail()

    def _recovered(self) -> None:
        if self._backoff.recover():
            _logger.warning(f"{self.label}: delivering again after {self.failures} failed attempts")

    def _replay(self, *, only: str | None, limit: int | None = None) -> _Replayed | None:
        """Replay the spool (a backend call), counting what it delivered; None if closed."""
        with self._lock:
            if self._abandoned:
                return None
            self._in_call = True
        try:
            result, errors = run_replay(
                self._spool.file, sinks={self._key: self.sink}, only=only, limit=limit
            )
        finally:
            with self._lock:
                self._in_call = False
        self.delivered += result.delivered
        self._spool.note_refused(result)
        return result, errors

    def _retry(self) -> None:
        """Send this run's spooled records, in order; on success the backend is back.

        While it fails, a retry sends the spool's first lines before reading the whole spool;
        with nothing spooled, the records held in memory are the probe.
        """
        replayed = 0
        if self._spool.file.path.exists():
            for limit in (_PROBE_LINES, None) if self._backoff.failing else (None,):
                try:
                    done = self._replay(only=self._key, limit=limit)
                except SpoolNotFoundError:  # replayed meanwhile by another process
                    break
                except Exception as error:
                    self._on_failure(error)
                    return
                if done is None:
                    return
                result, errors = done
                replayed += result.delivered
                if self._key in errors:
                    self._on_failure(errors[self._key][1])
                    return
                if limit is not None and not self._spool.count():
                    break
        if self._backoff.failing and not replayed and self._pending:
            self._deliver_pending()
        else:
            self._recovered()

    def _replay_spool_found(self) -> None:
        """Send what an earlier run left in the spool file (for every target in it)."""
        path = self._spool.file.path
        if not path.exists():
            return
        try:
            done = self._replay(only=None)
        except Exception as error:
            _logger.warning(f"{self.label}: could not replay {path}: {error}")
            return
        if done is None:
            return
        result, errors = done
        if result.delivered:
            _logger.info(f"{self.label}: replayed {result.delivered} spooled records")
        if result.bad_lines:
            bad = result.describe_bad_lines()
            _logger.warning(f"{self.label}: lines of {path} are not records: {bad}")
        for target, error in errors.values():
            _logger.warning(
                f"{self.label}: records for {dict(target)} in {path} could not be replayed yet "
                f"({error})"
            )
        if self._key in errors:
            self._on_failure(errors[self._key][1])
