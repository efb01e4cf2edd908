"""FirstAttempt: a sink's first backend call, in a thread of its own, waited for at most a bound."""

from __future__ import annotations

import threading
from collections.abc import Callable


__all__ = ["FirstAttempt", "RunNotReadyError"]


class RunNotReadyError(ConnectionError):
    """A delivery came while the first attempt is still finding or creating the run: retried later."""


class FirstAttempt:
    """Run ``call`` (find or create the run) in a daemon thread named ``name``.

    :meth:`wait` waits for it at most a timeout; a call not returned by then goes on, and
    :meth:`running` tells the sink not to start a second one. Its exception is kept in
    :attr:`error`.

    Example:
        >>> from substrax.tracking._first_attempt import FirstAttempt
        >>> attempt = FirstAttempt(lambda: None, name="demo-connect")
        >>> attempt.wait(5.0), attempt.running(), attempt.error
        (True, False, None)
    """

    def __init__(self, call: Callable[[], None], *, name: str) -> None:
        self.error: BaseException | None = None
        self._call = call
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._call()
        except Exception as error:
            self.error = error

    def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the call; return whether it has returned."""
        self._thread.join(timeout)
        return not self.running()

    def running(self) -> bool:
        """Whether the call has not returned yet."""
        return self._thread.is_alive()

    def check_returned(self, what: str) -> None:
        """Raise :class:`RunNotReadyError` naming ``what`` while the call has not returned."""
        if self.running():
            raise RunNotReadyError(f"{what} has not returned yet")
