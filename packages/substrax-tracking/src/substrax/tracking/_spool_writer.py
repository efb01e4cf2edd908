"""What the delivery threads use: SpoolWriter (a run's writes to its spool), Backoff, start_worker."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._records import Record
from ._refusals import RefusalNotes
from ._replay import run_replay
from ._send import describe_error
from ._spool import SpoolFile, SpoolLine


__all__ = ["Backoff", "SpoolWriter", "start_worker"]

_logger = logging.getLogger(__name__)

_NICE = 10  # how much lower the threads' CPU priority is than the training threads'
_FOUND_TIMEOUT = 5.0  # the most seconds spent sending what other runs left in the spool
_KNOWN_MOST = 5_000  # lines written kept in memory to be read back unparsed


def start_worker(
    loop: Callable[[], bool],
    name: str,
    *,
    label: str,
    stop: Callable[[], bool],
    first: Callable[[str], bool],
    pause: float,
) -> threading.Thread:
    """Start a daemon thread, at a lower CPU priority, running ``loop`` until it returns True or ``stop``.

    No error ends it: one is warned about once, and the loop goes on ``pause`` seconds later.
    """

    def guarded() -> None:
        if sys.platform.startswith("linux"):  # where each thread has its own priority
            thread = threading.get_native_id()
            try:
                nice = os.getpriority(os.PRIO_PROCESS, thread)
                os.setpriority(os.PRIO_PROCESS, thread, min(nice + _NICE, 19))  # 19: the lowest
            except OSError as error:  # a sandbox that forbids it
                _logger.debug("could not lower the delivery thread's priority: %s", error)
        while not stop():
            try:
                if loop():
                    return
            except Exception as error:
                # a handler that raises (pytest's) or a traceback linecache races must not end it
                with contextlib.suppress(Exception):
                    if first("worker"):
                        _logger.warning(
                            f"{label}: a delivery thread met an error ({describe_error(error)}); "
                            "it goes on, and no record is dropped (this is reported once)",
                            exc_info=error,
                        )
                    else:
                        _logger.debug("%s: a delivery thread met an error: %r", label, error)
                time.sleep(pause)

    thread = threading.Thread(target=guarded, name=name, daemon=True)
    thread.start()
    return thread


@dataclass
class Backoff:
    """When to try again after failures: ``initial`` seconds after the first, doubling up to ``longest``."""

    initial: float
    longest: float
    failing: bool = False
    next_try: float = 0.0
    delay: float = 0.0

    def fail(self) -> None:
        self.delay = min(self.delay * 2, self.longest) if self.failing else self.initial
        self.failing = True
        self.next_try = time.monotonic() + self.delay

    def recover(self) -> bool:
        """Note a success; whether it ends a failure."""
        failing, self.failing = self.failing, False
        return failing

    def due(self) -> bool:
        return not self.failing or time.monotonic() >= self.next_try

    def wait(self) -> float | None:
        """Seconds until the next try (None: nothing failed)."""
        return max(0.0, self.next_try - time.monotonic()) if self.failing else None


class SpoolWriter:
    """Write one run's records to its spool file, and say when it cannot (warned once, retried by :attr:`backoff`)."""

    def __init__(
        self, path: Path, target: dict[str, Any], *, media_dir: Path, label: str, backoff: Backoff
    ) -> None:
        self.file = SpoolFile(path)
        self.target = target
        self._earlier: list[dict[str, Any]] = []  # targets this run's lines were written under
        self.media_dir, self.label, self.backoff = media_dir, label, backoff
        self._unreadable: set[str] = set()  # metrics whose jax value could not be read (warned)
        self._warned = False
        self.refusals = RefusalNotes(label, self.file.refused_path)  # each key warned once
        self._written: dict[str, SpoolLine] = {}  # lines written since the spool was last read

    def materialize(self, records: list[Record], waiting: int) -> list[Record]:
        """``records`` as JSON data, up to one that needs room on disk this one has not (an image).

        A record that cannot be made JSON is kept as its error, for its backend to refuse once sent.
        """
        made: list[Record] = []
        for record in records:
            try:
                made.append(
                    record.materialize(self.media_dir, label=self.label, warned=self._unreadable)
                )
            except OSError as error:  # no room for an image: it waits, in order
                self.cannot_write(self.media_dir, error, waiting)
                break
            except Exception as failure:
                record.payload, record.materialized = {"unserializable": repr(failure)}, True
                made.append(record)
        return made

    def write(self, records: list[Record], *, sync: bool = True) -> bool:
        """Append materialized ``records``; whether it could."""
        try:
            self.file.append(self.target, records, sync=sync, written=self._remember)
        except OSError as failure:
            self.cannot_write(self.file.path, failure, len(records))
            return False
        if self.backoff.recover():
            _logger.warning(
                f"{self.label}: {self.file.path} is written again; the records that waited in "
                "memory are kept there"
            )
        return True

    def sync(self) -> None:
        """Flush the spool to disk (a failure is warned about as a failed write is)."""
        try:
            self.file.sync()
        except OSError as failure:
            self.cannot_write(self.file.path, failure, 0)

    def read_all(self, limit: int | None = None) -> list[SpoolLine]:
        """The spool's lines (up to ``limit`` records), those written here recognised by their text, unparsed."""
        return self.file.read_lines(limit, known=self._take_written)

    def _remember(self, lines: list[SpoolLine]) -> None:
        """Keep lines just written (under the spool's lock), to be read back unparsed."""
        room = _KNOWN_MOST - len(self._written)  # past it, the rest is parsed when read
        self._written.update((line.text, line) for line in lines[: max(room, 0)])

    def _take_written(self) -> dict[str, SpoolLine]:
        """The lines written since the last read (under the spool's lock, as a read starts)."""
        known, self._written = self._written, {}
        return known

    def add_refused(self, entries: list[tuple[str, str]]) -> None:
        """Keep refused spool lines (each with its error) in ``<spool>.refused``."""
        try:
            self.file.add_refused([line for line, _ in entries])
        except OSError as failure:
            _logger.error(f"{self.label}: could not write {self.file.refused_path}: {failure}")  # noqa: TRY400

    def cannot_write(self, path: Path, failure: OSError, count: int) -> None:
        """Note that ``path`` could not be written, for :attr:`backoff`; warn the first time."""
        self.backoff.fail()
        if not self._warned:
            self._warned = True
            _logger.warning(
                f"{self.label} could not write {path} ({describe_error(failure)}); logging goes "
                f"on: {count} records and every later one wait in memory, in order, and are "
                "delivered or written once there is room (this is reported once; a crash before "
                "then loses them)"
            )

    def replay_found(self, stop: Callable[[], bool]) -> None:
        """Send, once and within a bound, what other runs left in the spool (until ``stop``)."""
        notes = RefusalNotes(f"{self.label} (other runs' records)", self.refusals.kept_in)
        try:
            result, errors = run_replay(
                self.file,
                timeout=_FOUND_TIMEOUT,
                wait=0.0,
                stop=stop,
                on_refused=notes.note,
                # this run's lines are left to its sender: known, not parsed, and kept for it
                read=lambda limit: self.file.read_lines(limit, known=lambda: dict(self._written)),
            )
        except Exception as error:  # none, or another replay holds it: theirs to send
            _logger.debug("%s: no replay of other runs' records: %r", self.label, error)
            return
        path = self.file.path
        if result.delivered:
            _logger.info(f"{self.label}: replayed {result.delivered} spooled records")
        if result.bad_lines:
            bad = result.describe_bad_lines()
            _logger.warning(f"{self.label}: lines of {path} are not records: {bad}")
        for target, error in errors.values():
            _logger.warning(
                f"{self.label}: records for {target} in {path} could not be replayed yet "
                f"({error}); `python -m substrax.tracking replay {path}` sends them"
            )

    def write_end_mark(self, *, failed: bool) -> None:
        """Append a record of no values that a replay delivers, then ends the run (failed)."""
        target = {**self.target, "failed": True} if failed else self.target
        mark = Record(kind="scalars", step=None, time=time.time(), payload={"values": {}})
        with contextlib.suppress(OSError):
            self.file.append(target, [mark.materialize(self.media_dir)])

    def follow(self, target: dict[str, Any]) -> None:
        """Write later records under ``target``: the run's name once it exists (an MLflow id)."""
        self._earlier.append(self.target)
        self.target = target

    def targets(self) -> tuple[dict[str, Any], ...]:
        """Every target this run's lines were written under, the current one last."""
        return (*self._earlier, self.target)

    def count(self) -> int:
        """How many of this run's records the spool holds (counted without parsing the lines)."""
        try:
            return sum(self.file.count(target) for target in self.targets())
        except OSError:
            return 0

    def report_close(self, why: str, *, left: int, lost: int, reading: bool, ended: bool) -> None:
        """Say what a close left: records ``lost`` (in memory), ``left`` in the spool, a run not ``ended``."""
        path = self.file.path
        if lost:
            _logger.error(
                f"{self.label}: {lost} records could neither be written to {path} nor "
                "delivered by close and are lost; "
                + (
                    "the writer was still reading a value (a computation that had not ended)"
                    if reading
                    else "make room on its file system before a run ends"
                )
            )
        if left:
            _logger.warning(
                f"{self.label}: {why}; {left} records are kept in {path}; send them "
                f"with `python -m substrax.tracking replay {path}`"
            )
        elif not ended:
            _logger.warning(
                f"{self.label}: the run could not be ended ({why}); "
                f"`python -m substrax.tracking replay {path}` ends it"
            )
