"""Logger: the one surface every tracking backend offers."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import abc
import logging
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

from substrax.support import Closeable

from . import _failure
from ._errors import (
    EmptyMetricNameError,
    ImageShapeError,
    InvalidLoggerNameError,
    LoggedTypeError,
    LoggerClosedError,
    MetricOverflowError,
)
from ._process import current_process_index


__all__ = [
    "Logger",
    "as_scalar",
    "check_metric_name",
    "histogram_summary",
    "python_logger_name",
    "safe_name",
]

_GRAY, _COLOR = 2, 3
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


def check_metric_name(name: object, value: object) -> None:
    """Refuse an empty metric name (or one that is not a string).

    Raises:
        EmptyMetricNameError: ``name`` is empty or not a string.

    Example:
        >>> from substrax.tracking._base import check_metric_name
        >>> check_metric_name("loss", 0.5)
        >>> check_metric_name("", 0.5)
        Traceback (most recent call last):
        ...
        substrax.tracking.EmptyMetricNameError: metric name '' (value 0.5) must be a non-empty string; give the metric a name such as 'loss' or 'train/loss'
    """
    if not name or not isinstance(name, str):
        raise EmptyMetricNameError(name, value)


def python_logger_name(name: str) -> str:
    """The name of the stdlib ``logging`` logger of the substrax logger ``name``.

    Example:
        >>> from substrax.tracking._base import python_logger_name
        >>> python_logger_name("demo")
        'substrax.tracking.run.demo'
    """
    return f"substrax.tracking.run.{name}"


def safe_name(name: str) -> str:
    """``name`` made safe for a file name (``train/loss`` -> ``train_loss``).

    Example:
        >>> from substrax.tracking._base import safe_name
        >>> safe_name("train/loss")
        'train_loss'
    """
    return _UNSAFE.sub("_", name).strip("_") or "_"


def as_scalar(name: str, value: Any) -> float:
    """``value`` as a builtin float: Python and numpy numbers, 0-d and 1-element arrays.

    Raises:
        LoggedTypeError: ``value`` is not a number (a string, a bool, an array of several
            values); a ``TypeError``.
        MetricOverflowError: ``value`` is too large for a float.

    Example:
        >>> import numpy as np
        >>> from substrax.tracking._base import as_scalar
        >>> as_scalar("loss", 3), as_scalar("loss", np.float64(0.5))
        (3.0, 0.5)
    """
    if type(value) is float:
        return value
    if isinstance(value, float):  # np.float64 and other subclasses: a builtin float, written as one
        return float(value)
    if isinstance(value, bool | str | bytes) or value is None:
        raise LoggedTypeError(
            f"scalar {name!r}", value, "a number", got=f"{type(value).__name__} {value!r}"
        )
    size = getattr(value, "size", None)
    if isinstance(value, numbers.Real) or size == 1:
        try:
            return float(value)
        except OverflowError:
            raise MetricOverflowError(name, value) from None
    raise LoggedTypeError(
        f"scalar {name!r}",
        value,
        "a number or a one-element array",
        got=type(value).__name__
        + (f" of size {size}" if size is not None else "")
        + "; log arrays with log_histogram or log_image",
    )


class Logger(Closeable):
    """The logging surface shared by every backend.

    Subclasses implement the ``_write_*`` methods; the public methods check that the logger
    is open and that this process logs (only process 0, unless ``all_processes``).

    Messages: :meth:`log`, :meth:`debug`, :meth:`info`, :meth:`warning`, :meth:`error` and
    :meth:`critical` go to :attr:`python_logger`, the stdlib ``logging`` logger
    ``substrax.tracking.run.<name>``, so an application's handlers and filters (and pytest's
    ``caplog``) see them. substrax adds no handler to it, except :class:`ConsoleLogger`'s own.

    A failed run ends as failed (W&B: exit code 1; MLflow: status ``FAILED``): when the ``with``
    block raises (anything but a clean ``SystemExit``), when :meth:`mark_failed` is called, or
    when the process dies of an uncaught exception while the logger is open (a chained
    :func:`sys.excepthook`, restored when the last logger closes).

    Args:
        name: the run or logger name.
        process_index: this process's index; default: see :func:`current_process_index`.
        all_processes: log on every process, not only process 0.

    Example:
        >>> from substrax.tracking import ConsoleLogger
        >>> import io
        >>> with ConsoleLogger("demo", stream=io.StringIO()) as logger:
        ...     logger.log_scalar("loss", 0.5, step=1)
        ...     logger.info("epoch %d done", 1)
    """

    def __init__(
        self, name: str, *, process_index: int | None = None, all_processes: bool = False
    ) -> None:
        checked: object = name
        if not isinstance(checked, str) or not checked:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InvalidLoggerNameError(name)
        self.name = name
        self.process_index = current_process_index(process_index)
        self.active = all_processes or self.process_index == 0
        self.closed = False
        self.failed = False
        self.python_logger = logging.getLogger(python_logger_name(name))
        _failure.watch(self)

    # --- the public surface -------------------------------------------------------------
    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one scalar ``value`` under ``name`` at ``step``.

        Raises:
            LoggerClosedError: the logger is closed.
            EmptyMetricNameError: ``name`` is empty or not a string (on every process).
            LoggedTypeError: ``value`` is not a number (a bool, a string, None, an array).
            MetricOverflowError: ``value`` is too large for a float.
        """
        if self.closed:
            raise LoggerClosedError(self.name)
        check_metric_name(name, value)
        if self.active:
            self._write_scalar(name, value, step)

    def log_scalars(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log several scalars at ``step``.

        Raises:
            EmptyMetricNameError: a name is empty.
        """
        if self.closed:
            raise LoggerClosedError(self.name)
        for key, value in metrics.items():
            check_metric_name(key, value)
        if self.active:
            self._write_scalars(metrics, step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Alias of :meth:`log_scalars` (Lightning's name)."""
        self.log_scalars(metrics, step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Log the run's hyperparameters (merged with those logged before)."""
        if self.closed:
            raise LoggerClosedError(self.name)
        checked: object = params
        if not isinstance(checked, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise LoggedTypeError("hyperparameters", params, "a mapping of names to values")
        if self.active:
            self._write_hyperparams(params)

    def log_text(self, name: str, text: str, step: int | None = None) -> None:
        """Log a piece of text."""
        if self.closed:
            raise LoggerClosedError(self.name)
        checked: object = text
        if not isinstance(checked, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise LoggedTypeError(f"text {name!r}", text, "a str")
        if self.active:
            self._write_text(name, text, step)

    def log_image(self, name: str, image: Any, step: int | None = None) -> None:
        """Log an image: an ``(H, W)``, ``(H, W, 3)`` or ``(H, W, 4)`` array, or a list of them."""
        if self.closed:
            raise LoggerClosedError(self.name)
        if self.active:
            images = (
                list(image)
                if isinstance(image, Sequence) and not hasattr(image, "shape")
                else [image]
            )
            for one in images:
                _check_image(name, one)
            self._write_images(name, images, step)

    def log_histogram(self, name: str, values: Any, step: int | None = None) -> None:
        """Log the distribution of ``values`` (any array-like of numbers)."""
        if self.closed:
            raise LoggerClosedError(self.name)
        if self.active:
            self._write_histogram(name, values, step)

    def flush(self) -> None:
        """Write out whatever is buffered."""

    def close(self) -> None:
        """Flush and release the backend; later calls raise :class:`LoggerClosedError`."""
        if not self.closed:
            self.closed = True
            _failure.forget(self)
            if self.active:
                self._close()

    def mark_failed(self) -> None:
        """Record that the run failed: closing ends it as failed (after :meth:`close`: nothing).

        Leaving a ``with`` block by an exception, or an uncaught exception, calls it for you.
        """
        self.failed = True

    def _block_failed(self, error: BaseException) -> None:
        if _failure.failed_by(error):
            self.mark_failed()

    # --- messages, through stdlib logging -------------------------------------------------
    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        """Log ``msg % args`` at ``level`` to :attr:`python_logger` (as ``logging.Logger.log``).

        On a process that does not log (see ``all_processes``) this does nothing.
        """
        self._message(level, msg, args, kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        """:meth:`log` at ``DEBUG``."""
        self._message(logging.DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        """:meth:`log` at ``INFO``."""
        self._message(logging.INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        """:meth:`log` at ``WARNING``."""
        self._message(logging.WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        """:meth:`log` at ``ERROR``."""
        self._message(logging.ERROR, msg, args, kwargs)

    def critical(self, msg: object, *args: object, **kwargs: Any) -> None:
        """:meth:`log` at ``CRITICAL``."""
        self._message(logging.CRITICAL, msg, args, kwargs)

    def _message(
        self, level: int, msg: object, args: tuple[object, ...], kwargs: dict[str, Any]
    ) -> None:
        if self.active:
            kwargs.setdefault("stacklevel", 3)  # the record names the caller of info() & co.
            self.python_logger.log(level, msg, *args, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    # --- what a backend implements ------------------------------------------------------
    @abc.abstractmethod
    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None: ...

    def _write_scalar(self, name: str, value: Any, step: int | None) -> None:
        """Write one scalar: :meth:`_write_scalars` of one, unless a backend has a cheaper way.

        A logging call right after a training step runs on cold caches, several times slower
        than the same call idle, so every object a per-step call touches counts: the backends
        that log every step (the file log and the remote ones) write one scalar without the
        mapping. A subclass that changes how scalars are written overrides this hook as well as
        :meth:`_write_scalars` (``log_scalar`` calls only this one).
        """
        self._write_scalars({name: value}, step)

    @abc.abstractmethod
    def _write_hyperparams(self, params: Mapping[str, Any]) -> None: ...

    @abc.abstractmethod
    def _write_text(self, name: str, text: str, step: int | None) -> None: ...

    @abc.abstractmethod
    def _write_images(self, name: str, images: list[Any], step: int | None) -> None: ...

    @abc.abstractmethod
    def _write_histogram(self, name: str, values: Any, step: int | None) -> None: ...

    def _close(self) -> None:
        """Release the backend (called once, on the logging process)."""


def _check_image(name: str, image: Any) -> None:
    shape = getattr(image, "shape", None)
    if shape is None:
        raise LoggedTypeError(f"image {name!r}", image, "an array (H, W[, C])")
    ok = len(shape) == _GRAY or (len(shape) == _COLOR and shape[-1] in (1, 3, 4))
    if not ok:
        raise ImageShapeError(name, tuple(shape))


def histogram_summary(values: Any, bins: int = 64) -> dict[str, Any]:
    """Counts, bin edges and summary statistics of ``values`` (numpy), JSON-ready.

    Example:
        >>> from substrax.tracking._base import histogram_summary
        >>> histogram_summary([1.0, 2.0, 3.0], bins=2)["count"]
        3
    """
    import numpy as np  # noqa: PLC0415

    array = np.asarray(values, dtype=np.float64).ravel()
    finite = array[np.isfinite(array)]
    if finite.size == 0:
        return {
            "count": int(array.size),
            "min": math.nan,
            "max": math.nan,
            "mean": math.nan,
            "std": math.nan,
            "counts": [],
            "edges": [],
        }
    counts, edges = np.histogram(finite, bins=bins)
    return {
        "count": int(array.size),
        "min": float(finite.min()),
        "max": float(finite.max()),
        "mean": float(finite.mean()),
        "std": float(finite.std()),
        "counts": counts.tolist(),
        "edges": edges.tolist(),
    }
