"""The files of a file log: lines appended whole and in order, the log's lock, a resume's rewrite."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, cast

from substrax.support import optional, write_atomically

from ._errors import FileLogBusyError


__all__ = ["Appender", "csv_step", "drop_past", "hold_log", "jsonl_step"]

_logger = logging.getLogger(__name__)


def jsonl_step(line: str) -> int | None:
    """The integer ``step`` of a JSONL record; None for any other line."""
    try:
        record: object = json.loads(line)
    except ValueError:
        return None
    step = cast("dict[str, object]", record).get("step") if isinstance(record, dict) else None
    return step if type(step) is int else None


def csv_step(line: str) -> int | None:
    """The step of a CSV metric row; None for the header or a damaged line."""
    try:
        row = next(csv.reader([line]), [])
    except csv.Error:
        return None
    return int(row[1]) if len(row) > 1 and row[1].isdigit() else None


def drop_past(path: Path, step: int, step_of: Callable[[str], int | None]) -> tuple[int, int]:
    r"""Rewrite a log without its lines of steps after ``step`` and a cut-short last line.

    Parsed line by line (a damaged CSV quote cannot swallow the next), cut as bytes (a kill may
    cut a character).

    Returns:
        How many lines it dropped, and the highest step it held (-1: none).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.tracking._log_files import drop_past, jsonl_step
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     log = Path(directory) / "run.metrics.jsonl"
        ...     _ = log.write_text('{"step": 1}\n{"step": null}\n{"step": 5}\n{"ste')
        ...     drop_past(log, 2, jsonl_step), log.read_text()
        ((2, 5), '{"step": 1}\n{"step": null}\n')
    """
    if not path.exists():
        return 0, -1
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    lines = data[:end].decode("utf-8").splitlines(keepends=True)
    steps = [step_of(line) for line in lines]
    kept = [line for line, at in zip(lines, steps, strict=True) if at is None or at <= step]
    dropped = len(lines) - len(kept) + (end < len(data))
    if dropped:
        write_atomically(path, "".join(kept))
    return dropped, max((at for at in steps if at is not None), default=-1)


def hold_log(lock_path: Path, log_dir: Path, name: str) -> BinaryIO | None:
    """Hold an exclusive ``flock`` on ``lock_path`` until the file returned (None: no locks) closes.

    Raises:
        FileLogBusyError: another logger (of any process) holds it.
    """
    fcntl = optional("fcntl")
    if fcntl is None:  # Windows
        return None
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            pid = int(holder) if holder.isdigit() else None
            raise FileLogBusyError(log_dir, name, pid) from None
        except OSError as error:  # a file system without locks (some network mounts)
            os.close(fd)
            _logger.debug("%s cannot be locked (%s); the log is not guarded", lock_path, error)
            return None
        with contextlib.suppress(FileNotFoundError):
            if lock_path.stat().st_ino == os.fstat(fd).st_ino:
                held = os.fdopen(fd, "r+b", buffering=0)
                held.truncate(0)
                held.write(str(os.getpid()).encode())
                return held
        os.close(fd)  # a logger closing meanwhile removed the file we locked: lock the new one


class Appender:
    """One append-only file: lines wait here until written, and a write that stops keeps the rest.

    What a full disk or a file size limit stopped is written first by the next :meth:`write`, so
    lines reach the file whole and in order.
    """

    __slots__ = ("fd", "path", "waiting")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.waiting = bytearray()

    def open(self) -> int:
        """The file's descriptor, opened (and the file created) on the first call."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self.fd

    def add(self, text: str) -> None:
        """Add lines to write."""
        self.waiting += text.encode("utf-8")

    @property
    def lines(self) -> int:
        """How many lines wait (a line written in part counts as one)."""
        return self.waiting.count(b"\n")

    def write(self) -> OSError | None:
        """Write what waits; the error that stopped it, or None."""
        written = 0
        try:
            fd = self.open()
            with memoryview(self.waiting) as view:
                while written < len(view):
                    written += os.write(fd, view[written:])
        except OSError as error:
            return error
        finally:
            del self.waiting[:written]
        return None

    def drop_torn_line(self) -> bool:
        """Cut off a last line written in part (no newline); whether there was one."""
        fd = self.open()
        size = os.fstat(fd).st_size
        if not size or os.pread(fd, 1, size - 1) == b"\n":
            return False
        os.ftruncate(fd, os.pread(fd, size, 0).rfind(b"\n") + 1)
        return True

    def close(self) -> None:
        """Close the file; a later write opens it again."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
