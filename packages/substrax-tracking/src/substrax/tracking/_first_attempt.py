"""FirstAttempt: a sink's first backend call, in a thread of its own, waited for at most a bound."""

from __future__ import annotations

import threading
from collections.abc import Callable


__all__ = ["FirstAttempt", "RunNotReadyError"]


class RunNotReadyError(ConnectionError):
    """A delivery came while the first attempt is still finding or creating the run: retried later."""


class FirstAttempt:
    """Run ``call`` (find or create the run) in a daemon thread named ``name``, its exception kept in :attr:`error`.

    Example:
        >>> from substrax.tracking._first_attempt import FirstAttempt
        >>> attempt = FirstAttempt(lambda: 1 / 0, name="demo-connect")
        >>> attempt.why_not_ready(5.0, refused=KeyError, late="did not answer", failed="failed")
        'failed (ZeroDivisionError: division by zero)'
    """

    def __init__(self, call: Callable[[], None], *, name: str) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as error:
            self.error = error

    def why_not_ready(
        self, timeout: float, *, refused: type[BaseException], late: str, failed: str
    ) -> str | None:
        """Wait at most ``timeout`` s: why the call has not succeeded (None: it has); a ``refused`` error is raised."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return f"{late} within {timeout:g} s"
        if isinstance(error := self.error, refused):
            raise error
        return None if error is None else f"{failed} ({type(error).__name__}: {error})"

    def check_returned(self, what: str) -> None:
        """Raise :class:`RunNotReadyError` naming ``what`` while the call has not returned."""
        if self._thread.is_alive():
            raise RunNotReadyError(f"{what} has not returned yet")
