"""FirstAttempt: a remote sink's first call to its backend, in a thread of its own, waited for in time."""

from __future__ import annotations

import threading
from collections.abc import Callable


__all__ = ["FirstAttempt"]


class FirstAttempt:
    """Run a sink's first backend call (find or create the run) without ever waiting past a bound.

    The call runs in a daemon thread; :meth:`wait` waits at most a timeout for it. A call that
    has not returned by then goes on in its thread, and :meth:`running` tells the sink not to
    start a second one meanwhile. An exception of the call is kept in :attr:`error`.

    Args:
        call: the first call (it raises when the backend refuses or cannot be reached).
        name: the thread's name.

    Example:
        >>> from substrax.tracking._first_attempt import FirstAttempt
        >>> attempt = FirstAttempt(lambda: None, name="demo-connect")
        >>> attempt.wait(5.0), attempt.running(), attempt.error
        (True, False, None)
    """

    def __init__(self, call: Callable[[], None], *, name: str) -> None:
        self._call = call
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name=name, daemon=True
        )
        self.error: BaseException | None = None
        self._thread.start()

    def _run(self) -> None:
        try:
            self._call()
        except Exception as error:
            self.error = error

    def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the call; return whether it has returned."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.running()

    def running(self) -> bool:
        """Whether the call has not returned yet."""
        thread = self._thread
        if thread is None:
            return False
        if thread.is_alive():
            return True
        self._thread = None
        return False
