"""MultiLogger: one call, several backends."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._base import Logger
from ._errors import NotALoggerError


__all__ = ["MultiLogger"]

_logger = logging.getLogger(__name__)


class MultiLogger(Logger):
    """Send every call to several loggers, in order.

    Every logger gets the call even if an earlier one raises; the first error is raised after.

    Args:
        loggers: the backends.
        name: the name of the fan-out.

    Example:
        >>> import io
        >>> from substrax.tracking import ConsoleLogger, MultiLogger
        >>> a, b = io.StringIO(), io.StringIO()
        >>> with MultiLogger([ConsoleLogger("a", stream=a), ConsoleLogger("b", stream=b)]) as logger:
        ...     logger.log_scalar("loss", 1.0, step=0)
        >>> bool(a.getvalue()) and bool(b.getvalue())
        True
    """

    def __init__(self, loggers: Iterable[Logger], *, name: str = "multi") -> None:
        super().__init__(name, process_index=0, all_processes=True)
        self.loggers: tuple[Logger, ...] = tuple(loggers)
        for logger in self.loggers:
            checked: object = logger
            if not isinstance(checked, Logger):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise NotALoggerError(logger)

    def _each(self, call: Callable[[Logger], Any]) -> None:
        first: Exception | None = None
        for logger in self.loggers:
            try:
                call(logger)
            except Exception as error:
                first = _first_error(first, logger, error)
        if first is not None:
            raise first

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        self._each(lambda logger: logger.log_scalars(metrics, step))

    def _write_scalar(self, name: str, value: Any, step: int | None) -> None:
        # _each's loop without its closure: the per-step call touches two frames fewer
        first: Exception | None = None
        for logger in self.loggers:
            try:
                logger.log_scalar(name, value, step)
            except Exception as error:
                first = _first_error(first, logger, error)
        if first is not None:
            raise first

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        self._each(lambda logger: logger.log_hyperparams(params))

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._each(lambda logger: logger.log_text(name, text, step))

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        self._each(lambda logger: logger.log_image(name, images, step))

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        self._each(lambda logger: logger.log_histogram(name, values, step))

    def flush(self) -> None:
        """Flush every logger."""
        self._each(lambda logger: logger.flush())

    def mark_failed(self) -> None:
        """Mark every logger's run failed (see :meth:`Logger.mark_failed`)."""
        super().mark_failed()
        self._each(lambda logger: logger.mark_failed())

    def _close(self) -> None:
        self._each(lambda logger: logger.close())


def _first_error(first: Exception | None, logger: Logger, error: Exception) -> Exception:
    """The error to raise once every logger had the call: the first; later ones are logged."""
    if first is None:
        return error
    _logger.warning("%r also failed: %s", logger, error)
    return first
