"""``with`` support for anything that has a ``close()``, written once."""

import abc
import logging
from types import TracebackType
from typing import Self


_logger = logging.getLogger(__name__)


class Closeable(abc.ABC):
    """A mixin that makes an object with ``close()`` a context manager that closes on the way out.

    Leaving the block closes the object. When the block raised, that exception is the one the
    caller sees: a failure to close on the way out is logged (with its traceback) instead of
    replacing it. Before closing after an exception, ``_block_failed`` hears of it (a logger
    marks its run failed there). Store, loggers and profiler windows share this, so each one's
    ``with`` behaves alike.

    Example:
        >>> from substrax.support import Closeable
        >>> class Handle(Closeable):
        ...     closed = False
        ...     def close(self) -> None:
        ...         self.closed = True
        >>> with Handle() as handle:
        ...     pass
        >>> handle.closed
        True
    """

    __slots__ = ()

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the object holds (called once on leaving a ``with`` block)."""

    def _block_failed(self, error: BaseException) -> None:  # noqa: B027  (optional hook)
        """Hear that the ``with`` block raised ``error``, just before closing (nothing here)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self._block_failed(exc)
        except Exception:
            _logger.warning(
                "%s could not record the block's %s",
                type(self).__name__,
                type(exc).__name__,
                exc_info=True,
            )
        try:
            self.close()
        except Exception:
            _logger.warning(
                "closing %s after %s failed as well; the %s propagates",
                type(self).__name__,
                type(exc).__name__,
                type(exc).__name__,
                exc_info=True,
            )
