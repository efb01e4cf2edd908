"""DueWriter: a thread that writes what waits ``every`` seconds after it began to wait."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable


__all__ = ["DueWriter"]

_logger = logging.getLogger(__name__)


class DueWriter:
    """Calls ``write`` ``every`` seconds after :meth:`due`, though no later call comes.

    A run that logs, then hangs in a collective or a save and is killed, lost what its logger
    held until the next call. ``write`` returns whether something still waits (a value still
    computed: it is called again ``every`` seconds later); an error it raises is a warning.

    Example:
        >>> from substrax.tracking._due_writer import DueWriter
        >>> written = []
        >>> writer = DueWriter(lambda: written.append(1) or False, 0.01, "example")
        >>> writer.due()
        >>> writer.close()  # ends the thread; what waits is its owner's to write now
    """

    def __init__(self, write: Callable[[], bool], every: float, name: str) -> None:
        self._write, self._every = write, every
        self._due, self._closing = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def due(self) -> None:
        """Something waits: write it ``every`` seconds from now (once, however often called)."""
        if not self._due.is_set():
            self._due.set()

    def _run(self) -> None:
        while self._due.wait() and not self._closing.wait(self._every):
            self._due.clear()
            try:
                if self._write():
                    self._due.set()
            except Exception as error:  # never a traceback from this thread
                _logger.warning(f"{self._thread.name}: writing what waits failed: {error!r}")

    def close(self) -> None:
        """End the thread (idempotent); a write under way finishes first."""
        self._closing.set()
        self._due.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
