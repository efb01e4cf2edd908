"""The spool: records a remote backend could not take, kept in a local JSONL file until replayed."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from substrax.support import write_atomically

from ._errors import NotARecordError, NotASpoolError, SpoolBusyError, SpoolNotFoundError
from ._live import try_flock
from ._records import Record


__all__ = ["SpoolFile", "SpoolLine", "spool_lines"]

_logger = logging.getLogger(__name__)


def spool_lines(
    target: Mapping[str, Any], records: Iterable[Mapping[str, Any]], error: str | None = None
) -> list[str]:
    """The spool lines (no newlines) of records' JSON data, ``{"target", "record"[, "error"]}``.

    Example:
        >>> from substrax.tracking._spool import spool_lines
        >>> spool_lines({"backend": "b"}, [{"step": 1}], "E: x")
        ['{"target": {"backend": "b"}, "record": {"step": 1}, "error": "E: x"}']
    """
    head = '{"target": ' + json.dumps(dict(target)) + ', "record": '
    tail = "}" if error is None else ', "error": ' + json.dumps(error) + "}"
    # default=str: a value that is no JSON (checked at the call) never holds the writer up
    return [head + json.dumps(dict(record), default=str) + tail for record in records]


def _parse_line(text: str) -> tuple[dict[str, Any], Record]:
    """A spool line's data and record (ValueError, KeyError or TypeError: not one)."""
    line = json.loads(text)
    if not isinstance(line, dict):
        raise NotARecordError(f"a JSON {type(line).__name__}, not an object")
    data = cast("dict[str, Any]", line)
    if unknown := set(data) - {"target", "record", "error"}:
        raise NotARecordError(f"unknown fields {sorted(unknown)}")
    target = data.get("target")
    if not isinstance(target, dict) or "backend" not in target:
        raise NotARecordError("no target naming a backend")
    if not isinstance(record := data.get("record"), dict):
        raise NotARecordError("no record")
    return data, Record.from_json(cast("dict[str, Any]", record))


@dataclasses.dataclass(frozen=True, slots=True)
class SpoolLine:
    """A non-blank spool line: its number (from 1), its text, its data and record (None: not one)."""

    number: int
    text: str
    data: dict[str, Any] | None
    reason: str = ""  # why it is not a record
    record: Record | None = None


class SpoolFile:
    """An append-only JSONL file of ``{"target", "record"}`` lines, shared safely between processes.

    Every change and read holds an exclusive ``flock`` on ``<spool>.lock``; ``<spool>.refused``
    holds the records a backend refused (with their ``"error"``), ``<spool>.bad`` the non-records.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.name in ("", ".", ".."):
            raise NotASpoolError(self.path, "a directory")
        self.lock_path, self.refused_path, self.bad_path, self.replay_lock_path = (
            self.path.with_name(self.path.name + suffix)
            for suffix in (".lock", ".refused", ".bad", ".replay.lock")
        )

    @contextlib.contextmanager
    def _flock(self, path: Path, deadline: float | None = None) -> Generator[int | None]:
        """Hold an exclusive ``flock`` on ``path`` until ``deadline``; yield a holder's pid met."""
        holder: int | None = None
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # no directory: no spool
                raise SpoolNotFoundError(self.path) from None
            try:
                while not try_flock(fd):
                    holder = _pid_in(fd) or holder
                    if deadline is None:
                        fcntl.flock(fd, fcntl.LOCK_EX)
                        break
                    if time.monotonic() >= deadline:
                        raise SpoolBusyError(self.path, holder)
                    time.sleep(0.05)
                try:
                    current = path.stat().st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    current = False
                if current:  # not removed (by a holder that left no spool) while we waited
                    yield holder
                    return
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def replaying(self, wait: float | None) -> Generator[int | None]:
        """Hold ``<spool>.replay.lock``, waiting at most ``wait`` s (None: unbounded); yield the pid waited for."""
        deadline = None if wait is None else time.monotonic() + wait
        with self._flock(self.replay_lock_path, deadline) as waited_for:
            with contextlib.suppress(OSError):  # only says who replays (a full disk: nobody)
                self.replay_lock_path.write_text(str(os.getpid()))
            try:
                yield waited_for
            finally:
                self.replay_lock_path.unlink(missing_ok=True)

    def check_regular(self) -> None:
        """Raise SpoolNotFoundError if the spool does not exist, NotASpoolError if it is no file."""
        try:
            mode = self.path.stat().st_mode
        except FileNotFoundError:
            raise SpoolNotFoundError(self.path) from None
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise NotASpoolError(self.path, kind)

    def append(
        self,
        target: Mapping[str, Any],
        records: Iterable[Record],
        *,
        sync: bool = True,
        written: Callable[[list[SpoolLine]], None] | None = None,
    ) -> None:
        """Append materialized ``records``, then call ``written`` with their lines, under the spool's lock.

        ``sync=False`` leaves the fsync to later: the lines outlive a kill -9, not a power cut.
        """
        records = list(records)
        data = [record.to_json() for record in records]
        if not (texts := spool_lines(target, data)):
            return
        head = dict(target)
        lines = [
            SpoolLine(0, text, {"target": head, "record": payload}, record=record)
            for text, payload, record in zip(texts, data, records, strict=True)
        ]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._flock(self.lock_path):
            _append_lines(self.path, texts, sync=sync)
            if written is not None:
                written(lines)

    def sync(self) -> None:
        """An fsync of the spool (lines appended with ``sync=False``), if there is one."""
        with contextlib.suppress(FileNotFoundError), self.path.open("rb") as file:
            os.fsync(file.fileno())

    def add_refused(self, lines: list[str]) -> None:
        """Append spool ``lines`` (each with its ``"error"``) to ``<spool>.refused``."""
        if lines:
            with self._flock(self.lock_path):
                _append_lines(self.refused_path, lines)

    def read_lines(
        self,
        limit: int | None = None,
        *,
        known: Callable[[], Mapping[str, SpoolLine]] | None = None,
    ) -> list[SpoolLine]:
        """The non-blank lines, records or not, up to the ``limit``-th record; those ``known()`` unparsed.

        Raises SpoolNotFoundError, or NotASpoolError: not a regular file, or no line is a record.
        """
        with self._flock(self.lock_path):
            data = b""
            recognised = {} if known is None else known()
            try:
                self.check_regular()  # again: a replay may have removed it
                data = self.path.read_bytes()
            finally:
                if not data.strip():  # gone or blank: no remove() follows to delete the lock file
                    self.lock_path.unlink(missing_ok=True)
        lines: list[SpoolLine] = []
        records = 0
        for number, text in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if records == limit:
                break
            if not text.strip():
                continue
            if (line := recognised.get(text)) is not None:
                parsed, record = line.data, line.record
            else:
                try:
                    parsed, record = _parse_line(text)
                except (ValueError, KeyError, TypeError) as error:  # JSONDecodeError: a ValueError
                    lines.append(SpoolLine(number, text, None, str(error)))
                    continue
            lines.append(SpoolLine(number, text, parsed, record=record))
            records += 1
        if lines and not records and not any(line.text.startswith('{"target"') for line in lines):
            with self._flock(self.lock_path):  # made by this call: nothing else locks such a file
                self.lock_path.unlink(missing_ok=True)
            raise NotASpoolError(
                self.path, f"no line is a spool record; line {lines[0].number}: {lines[0].reason}"
            )
        return lines

    def count(self, target: Mapping[str, Any]) -> int:
        """How many lines are ``target``'s (0 without a file), without parsing them."""
        prefix = ('{"target": ' + json.dumps(dict(target)) + ",").encode()
        if not self.path.is_file():
            return 0
        with self._flock(self.lock_path):
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                self.lock_path.unlink(missing_ok=True)
                return 0
        return data.count(b"\n" + prefix) + data.startswith(prefix)

    def remove(
        self,
        texts: Iterable[str],
        *,
        refused: Iterable[str] = (),
        bad: Iterable[str] = (),
        aside: Iterable[str] = (),
    ) -> bool:
        """Remove the lines ``texts`` (once each), keeping every other; an emptied spool is deleted.

        ``refused`` and ``bad`` lines go to ``<spool>.refused`` and ``<spool>.bad`` first; whether
        they went (on a full disk, the lines ``aside`` stay).
        """
        gone = collections.Counter(texts)
        with self._flock(self.lock_path):
            try:
                for path, lines in ((self.refused_path, list(refused)), (self.bad_path, list(bad))):
                    if lines:
                        _append_lines(path, lines)
                moved = True
            except OSError:
                gone.subtract(aside)
                moved = False
            try:
                data = self.path.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                data = ""
            kept: list[str] = []
            for text in data.splitlines():
                if gone[text] > 0:
                    gone[text] -= 1
                elif text.strip():
                    kept.append(text)
            if kept:
                data = "".join(f"{text}\n" for text in kept)
                try:
                    write_atomically(self.path, data)
                except OSError:  # no room for a copy: in place (it is no longer than before)
                    with self.path.open("r+b") as file:
                        file.write(data.encode("utf-8"))
                        file.truncate()
            else:
                self.path.unlink(missing_ok=True)
                self.lock_path.unlink(missing_ok=True)
        return moved

    def restore_refused(self) -> int:
        """Move the records of ``<spool>.refused`` back into the spool, without their errors (others: to ``.bad``)."""
        if not self.refused_path.is_file():
            return 0
        with self._flock(self.lock_path):
            try:
                data = self.refused_path.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                return 0
            lines: list[str] = []
            bad: list[str] = []
            for text in filter(str.strip, data.splitlines()):
                try:
                    line, _ = _parse_line(text)
                except (ValueError, KeyError, TypeError):
                    bad.append(text)
                    continue
                line.pop("error", None)
                lines.append(json.dumps(line))
            if bad:
                _append_lines(self.bad_path, bad)
                _logger.warning(
                    "%d lines of %s are not records; they are moved to %s",
                    len(bad),
                    self.refused_path,
                    self.bad_path,
                )
            _append_lines(self.path, lines)
            self.refused_path.unlink()
        return len(lines)


def _pid_in(fd: int) -> int | None:
    """The pid a replay lock file holds (None when empty or unreadable)."""
    text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    return int(text) if text.isdigit() else None


def _append_lines(path: Path, lines: list[str], *, sync: bool = True) -> None:
    """Append ``lines`` with one write (and an fsync); a write failing part way is cut off again."""
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":  # a last line cut short by a crash
            data = b"\n" + data  # ends there: it stays a bad line, and the next is whole
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)
