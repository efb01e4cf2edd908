"""MultiLogger: one call, several backends."""

# ruff: noqa: ANN401  (logged values and SDK objects are typed Any on purpose)

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ._base import Logger
from ._errors import NotALoggerError, UploadNotFoundError


__all__ = ["MultiLogger"]

_logger = logging.getLogger(__name__)


class MultiLogger(Logger):
    """Send every call to several loggers, in order; every one gets it even if an earlier one raises.

    The first error is raised once all had the call. A name or hyperparameters that one of them
    refuses at the call (W&B's own keys, two params MLflow would join into one) are refused
    before any logger has it, so that the backends never disagree.

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
        super().__init__(name, all_processes=True)
        self.loggers: tuple[Logger, ...] = tuple(loggers)
        for logger in self.loggers:
            if not isinstance(logger, Logger):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise NotALoggerError(logger)
        # active where one of its loggers is: on process 1 of a job logging from process 0, its
        # messages (info, warning...) went out through Python's last-resort handler
        self.active = any(logger.active for logger in self.loggers)

    def _each(self, method: str, *args: Any) -> None:
        """Call ``method(*args)`` on each logger that has it; raise the first error once all had it."""
        first: Exception | None = None
        for logger in self.loggers:
            try:
                call = getattr(logger, method, None)
                if call is not None:
                    call(*args)
            except Exception as error:
                if first is None:
                    first = error
                elif (type(error), str(error)) != (type(first), str(first)):  # not the same refusal
                    _logger.warning("%r also failed: %s", logger, error)
        if first is not None:
            raise first

    def log_artifact(
        self, local_path: str | os.PathLike[str], artifact_path: str | None = None
    ) -> None:
        """Upload a file (or a directory's files) to the run of each logger that takes artifacts.

        The console, file and TensorBoard loggers have no ``log_artifact`` and are passed by.

        Raises:
            LoggerClosedError: the logger is closed.
            UploadNotFoundError: ``local_path`` does not exist; no logger had the call.

        Example:
            >>> import io
            >>> from substrax.tracking import ConsoleLogger, MultiLogger
            >>> with MultiLogger([ConsoleLogger("a", stream=io.StringIO())]) as logger:
            ...     logger.log_artifact("/no/such/model.bin")
            Traceback (most recent call last):
            ...
            substrax.tracking.UploadNotFoundError: artifact '/no/such/model.bin' does not exist; ...
        """
        self._check_open()
        if not Path(local_path).exists():
            raise UploadNotFoundError("artifact", Path(local_path).resolve())
        self._each("log_artifact", local_path, artifact_path)

    def _check_names(self, names: Iterable[object], step: int | None) -> None:
        names = tuple(names)
        for logger in self.loggers:
            if logger.active:
                logger._check_names(names, step)

    def _check_params(self, params: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            if logger.active:
                logger._check_params(params)

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        self._check_names(metrics, step)
        self._each("log_scalars", metrics, step)

    def _write_scalar(self, name: str, value: Any, step: int | None) -> None:
        self._check_names((name,), step)
        self._each("log_scalar", name, value, step)

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:  # checked by each first
        self._each("log_hyperparams", params)

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._check_names((name,), step)
        self._each("log_text", name, text, step)

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        self._check_names((name,), step)
        self._each("log_image", name, images, step)

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        self._check_names((name,), step)
        self._each("log_histogram", name, values, step)

    def flush(self) -> None:
        """Flush every logger."""
        self._each("flush")

    def mark_failed(self) -> None:
        """Mark every logger's run failed (see :meth:`Logger.mark_failed`)."""
        super().mark_failed()
        self._each("mark_failed")

    def _close(self) -> None:
        self._each("close")
