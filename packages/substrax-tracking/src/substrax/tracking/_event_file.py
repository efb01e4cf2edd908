"""TensorBoard event files written without tensorboardX's writer thread.

tensorboardX's writer thread cannot start at interpreter exit and hung on a full disk; an
:class:`EventFile` is written by the calling thread and by one flusher thread for all of them.
"""

# ruff: noqa: ANN401  (protocol buffers of a generated module are typed Any on purpose)

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from ._log_files import Appender


__all__ = ["EventFile", "event", "last_number"]

_logger = logging.getLogger(__name__)
_TICK = 0.5  # seconds between the flusher's looks at the open files
_EXIT_WAIT = 5.0  # the most seconds the exit waits for a call still writing an event
# an event file an EventFile was named with: its number, then the process that wrote it
_NUMBERED = re.compile(r"events\.out\.tfevents\..*\.(\d{6})\.\d+")
_OPEN: weakref.WeakSet[EventFile] = weakref.WeakSet()
_FLUSHER: list[threading.Thread] = []  # the flusher thread of this process, once started
_STARTING = threading.Lock()


def last_number(log_dir: Path) -> int:
    """The highest number an event file of ``log_dir`` was named with (0: none).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.tracking._event_file import last_number
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     (Path(directory) / "events.out.tfevents.1.host.a.000007.345678").touch()
        ...     last_number(Path(directory))
        7
    """
    found = (_NUMBERED.fullmatch(path.name) for path in log_dir.glob("events.out.tfevents.*"))
    return max((int(match[1]) for match in found if match), default=0)


def event(**fields: Any) -> Any:
    """A TensorBoard ``Event`` protocol buffer of ``fields``."""
    from tensorboardX.proto.event_pb2 import (  # noqa: PLC0415
        Event,  # pyright: ignore[reportAttributeAccessIssue]  (generated: no stub)
    )

    return Event(**fields)


class EventFile:
    """One event file: each event a TFRecord record (its length and data, each with a CRC).

    Events are written ``flush_secs`` after the last write; what a full disk refused waits in
    memory until there is room, and what waits at exit is written then.
    """

    def __init__(self, path: Path, flush_secs: float, label: str) -> None:
        from tensorboardX.record_writer import masked_crc32c  # noqa: PLC0415

        self._crc: Any = masked_crc32c
        self._file = Appender(path)
        self._lock = threading.Lock()  # the image thread and the flusher write too
        self._flush_secs, self._written = flush_secs, time.monotonic()
        self._label, self._warned = label, False
        self.add(event(wall_time=time.time(), file_version="brain.Event:2"))
        with self._lock:
            self._write()  # the file exists from now on: the next file is numbered after it
        self._finalizer = weakref.finalize(self, _write_and_close, self._file, self._lock)
        _OPEN.add(self)
        _start_flusher()

    def add(self, data: Any) -> None:
        """Add an ``Event``; write what waits if ``flush_secs`` passed since the last write."""
        data = data.SerializeToString()
        header = struct.pack("<Q", len(data))
        crc = self._crc
        record = header + struct.pack("<I", crc(header)) + data + struct.pack("<I", crc(data))
        with self._lock:
            self._file.waiting += record
            if time.monotonic() - self._written >= self._flush_secs:
                self._write()

    def add_summary(self, summary: Any, step: int | None, when: float) -> None:
        self.add(event(wall_time=when, summary=summary, **({} if step is None else {"step": step})))

    def _write(self) -> bool:
        """Write what waits (under the lock); whether all of it is written."""
        self._written = time.monotonic()
        if (error := self._file.write()) is None:
            return True
        if not self._warned:
            self._warned = True
            _logger.warning(
                f"{self._label} cannot write {self._file.path} ({error}); its events wait in "
                "memory and are written once there is room (this is reported once)"
            )
        return False

    def write_if_due(self) -> None:
        """The flusher's: write what has waited ``flush_secs`` (never waiting for a caller)."""
        if self._lock.acquire(blocking=False):
            try:
                if self._file.waiting and time.monotonic() - self._written >= self._flush_secs:
                    self._write()
            finally:
                self._lock.release()

    def flush(self) -> None:
        """Write what waits and fsync the file (a full disk: it keeps waiting)."""
        with self._lock:
            if self._write() and self._file.fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(self._file.fd)

    def forget(self) -> None:
        """Never write what waits (a forked child's copy: the parent writes it)."""
        self._finalizer.detach()

    def close(self) -> None:
        """Flush, then close the file; what a full disk still refuses is named in an error log."""
        self.flush()
        self._finalizer()


def _write_and_close(file: Appender, lock: threading.Lock) -> None:
    """Write what waits in ``file`` and close it (a logger dropped unclosed, or the exit)."""
    held = lock.acquire(timeout=_EXIT_WAIT)  # a thread may be adding an event
    try:
        if error := file.write():
            _logger.error(f"{file.path}: {len(file.waiting)} bytes of events are lost ({error})")
    finally:
        file.close()
        if held:
            lock.release()


def _flush_due() -> None:
    while True:
        time.sleep(_TICK)
        for events in list(_OPEN):
            with contextlib.suppress(Exception):  # nothing ends it; a write failure is warned
                events.write_if_due()


def _start_flusher() -> None:
    with _STARTING:
        if not _FLUSHER:
            thread = threading.Thread(target=_flush_due, name="substrax-tensorboard", daemon=True)
            thread.start()
            _FLUSHER.append(thread)


def _forget_in_child() -> None:
    """A forked child has no flusher, and leaves its parent's events to the parent."""
    for events in list(_OPEN):
        events.forget()
    _OPEN.clear()
    _FLUSHER.clear()


os.register_at_fork(after_in_child=_forget_in_child)
