"""SpoolWriter: a run's writes to its spool file, which outlive a full disk, retried by a Backoff."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._records import Record
from ._replay import ReplayResult
from ._spool import SpoolFile


__all__ = ["Backoff", "SpoolWriter", "describe"]

_logger = logging.getLogger(__name__)


def describe(error: BaseException) -> str:
    """``Type: message``, as errors are named in warnings and in ``<spool>.refused``."""
    return f"{type(error).__name__}: {error}"


@dataclass
class Backoff:
    """When to try again after failures: ``initial`` seconds after the first, doubling up to ``longest``."""

    initial: float
    longest: float
    failing: bool = False
    next_try: float = 0.0
    delay: float = 0.0

    def fail(self) -> None:
        """Note a failure and when to try again."""
        self.delay = min(self.delay * 2, self.longest) if self.failing else self.initial
        self.failing = True
        self.next_try = time.monotonic() + self.delay

    def recover(self) -> bool:
        """Note a success; return whether it ends a failure."""
        failing, self.failing = self.failing, False
        return failing

    def due(self) -> bool:
        """Whether to try now: nothing failed, or the next try is due."""
        return not self.failing or time.monotonic() >= self.next_try


class SpoolWriter:
    """Write one run's records to its spool file, counting them, and say when it cannot.

    A write that fails (a full disk) is warned about once and tried again by ``backoff``; the
    caller keeps the records meanwhile. Records the backend refused go to ``<spool>.refused``
    with their error, and wait here, in order, while that file cannot be written.
    """

    def __init__(
        self, path: Path, target: dict[str, Any], *, media_dir: Path, label: str, backoff: Backoff
    ) -> None:
        self.file = SpoolFile(path)
        self.target = target
        self.media_dir = media_dir
        self.label = label
        self.backoff = backoff
        self.spooled = 0
        self.refused = 0
        self.waiting: list[tuple[Record, str]] = []  # refused records not written yet
        self._unreadable: set[str] = set()  # metrics whose jax value could not be read (warned)
        self._counts = threading.Lock()
        self._warned = False

    def materialize(self, record: Record) -> Record:
        """Read ``record``'s values into JSON data (see :meth:`Record.materialize`)."""
        return record.materialize(self.media_dir, label=self.label, warned=self._unreadable)

    def write_or_raise(self, records: list[Record], error: str | None = None) -> None:
        """Append ``records`` (with an ``error``: to ``<spool>.refused``) and count them.

        Raises:
            OSError: the file could not be written (nothing of it was counted).
        """
        for record in records:
            try:
                self.materialize(record)
            except Exception as failure:
                record.payload = {"unserializable": repr(failure)}
                record.materialized = True
        written = self.file.append(self.target, records, error)
        with self._counts:
            if error is None:
                self.spooled += written
            else:
                self.refused += written

    def write(self, records: list[Record], error: str | None = None) -> bool:
        """:meth:`write_or_raise`; return whether it could (a failure is warned about once)."""
        try:
            self.write_or_raise(records, error)
        except OSError as failure:
            self.backoff.fail()
            if not self._warned:
                self._warned = True
                _logger.warning(
                    f"{self.label} could not write {self.file.path} ({describe(failure)}); "
                    f"logging goes on: {len(records)} records and every later one wait in memory, "
                    "in order, and are delivered or written once there is room (this is reported "
                    "once; a crash before then loses them)"
                )
            return False
        if self.backoff.recover():
            _logger.warning(
                f"{self.label}: {self.file.path} is written again; the records that waited in "
                "memory are kept there"
            )
        return True

    def due(self) -> bool:
        """Whether to write now: the file works, or the next try after a failure is due."""
        return self.backoff.due()

    def refuse(self, record: Record, error: Exception) -> None:
        """Set ``record`` aside in ``<spool>.refused`` with ``error``, and say so."""
        _logger.warning(
            f"{self.label}: a {record.kind} record at step {record.step} is refused "
            f"({describe(error)}); it is kept in {self.file.refused_path}"
        )
        self.waiting.append((record, describe(error)))
        self.write_refused()

    def write_refused(self) -> None:
        """Write the refused records that wait, in order, while the file can be written."""
        while self.waiting and self.due() and self.write([self.waiting[0][0]], self.waiting[0][1]):
            del self.waiting[0]

    def note_refused(self, result: ReplayResult) -> None:
        """Count and report the spooled records a replay moved to ``<spool>.refused``."""
        if result.refused:
            with self._counts:
                self.refused += result.refused
            reasons = "; ".join(sorted(set(result.refused_reasons)))[:2000]
            _logger.warning(
                f"{self.label} refused {result.refused} spooled records ({reasons}); they are "
                f"kept in {result.refused_file}, the rest goes on"
            )

    def write_last(self, records: list[Record], error: str | None = None) -> bool:
        """Write ``records`` at close, without a later try: whether it could (if not, say so)."""
        try:
            self.write_or_raise(records, error)
        except OSError as failure:
            what, path = (
                ("", self.file.path) if error is None else ("refused ", self.file.refused_path)
            )
            _logger.error(  # noqa: TRY400  (the records are lost: say how many, and why)
                f"{self.label}: {len(records)} {what}records could not be written to {path} at "
                f"close ({describe(failure)}) and are lost; make room on its file system before "
                "a run ends"
            )
            return False
        return True

    def write_failed_mark(self) -> None:
        """Append a record of no values whose target says the run failed, for its replay to end it so."""
        self.target = {**self.target, "failed": True}
        mark = Record(kind="scalars", step=None, time=time.time(), payload={"values": {}})
        self.write_last([mark])

    def write_refused_last(self) -> None:
        """Write the refused records that wait, at close (see :meth:`write_last`)."""
        for record, error in self.waiting:
            self.write_last([record], error)
        self.waiting = []

    def count(self) -> int:
        """How many of this run's records the spool holds (counted without parsing the lines)."""
        try:
            return self.file.count(self.target)
        except OSError:
            return 0

    def warn_left(self, why: str, count: int | None = None) -> None:
        """Say that records are left in the spool (if any are), and how to send them."""
        count = self.count() if count is None else count
        if count:
            _logger.warning(
                f"{self.label}: {why}; {count} records are kept in {self.file.path}; send them "
                f"with `python -m substrax.tracking replay {self.file.path}`"
            )
