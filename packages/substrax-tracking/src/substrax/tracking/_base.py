"""Logger: the one surface every tracking backend offers."""

# ruff: noqa: ANN401  (logged values and SDK objects are typed Any on purpose)

from __future__ import annotations

import abc
import logging
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from substrax.support import Closeable, check_int

from . import _failure
from ._errors import (
    EmptyMetricNameError,
    ImageShapeError,
    InvalidStepError,
    LoggedTypeError,
    LoggerClosedError,
)
from ._hparams import check_hyperparams
from ._log_files import json_ready
from ._paths import check_logger_name
from ._process import current_process_index
from ._values import histogram_summary, histogram_values, number_kind


_CHECKED: set[str] = set()  # metric names that passed check_metric_name
_CHECKED_MOST = 100_000


def check_metric_name(name: object, value: object) -> None:
    """Refuse an empty or non-string metric name, or one no log file can hold on one line.

    Example:
        >>> from substrax.tracking._base import check_metric_name
        >>> check_metric_name("loss", 0.5)
        >>> check_metric_name("", 0.5)
        Traceback (most recent call last):
        ...
        substrax.tracking.EmptyMetricNameError: metric name '' (value 0.5) must be a non-empty string; give the metric a name such as 'loss' or 'train/loss'
    """
    if type(name) is str and name in _CHECKED:
        return
    if not name or not isinstance(name, str):
        raise EmptyMetricNameError(name, value)
    if not (name.isascii() and name.isprintable()):
        bad = next((char for char in "\n\r" if char in name), None)
        if bad is None and (at := _unencodable(name)) is not None:
            bad = name[at]
        if bad is not None:
            raise LoggedTypeError(
                f"metric name {name!r}",
                name,
                "a str that a UTF-8 file holds on one line (no lone surrogate, newline or "
                "carriage return)",
                f"one holding {bad!r}",
            )
    if type(name) is str and len(_CHECKED) < _CHECKED_MOST:
        _CHECKED.add(name)


def _unencodable(text: str) -> int | None:
    """Where ``text`` holds a character UTF-8 cannot encode (a lone surrogate), if anywhere."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def histogram_of(name: str, values: Any) -> dict[str, Any]:
    """:func:`histogram_summary` of ``values``; LoggedTypeError if they are not real numbers."""
    try:
        return histogram_summary(values)
    except (TypeError, ValueError) as error:
        what = f"histogram {name!r}"
        got = f"{type(values).__name__} ({error})"
        raise LoggedTypeError(what, values, "an array-like of real numbers", got) from None


def check_resume_step(resume_step: int | None) -> int | None:
    """``resume_step``: None, or the restored checkpoint's step, an int in ``[0, 2**63 - 1]``.

    Raises:
        TypeError: it is not an int.
        ValueError: it is negative, or past the largest step a backend stores.
    """
    if resume_step is not None and check_int("resume_step", resume_step, minimum=0) >= 2**63:
        raise ValueError(
            f"resume_step={resume_step} is past the largest step, 2**63 - 1 (every backend stores "
            "a step as a signed 64-bit integer); pass the step of the checkpoint the run restored"
        )
    return resume_step


def check_step(step: object, logged: str = "", name: object = None) -> int | None:
    """``step`` as a plain int (a numpy or jax integer too), or None; refused outside ``[0, 2**63 - 1]``.

    Example:
        >>> import numpy as np
        >>> from substrax.tracking._base import check_step
        >>> check_step(np.int64(3)), check_step(2**63 - 1)
        (3, 9223372036854775807)
        >>> check_step(2**64 - 1, "scalar", "loss")
        Traceback (most recent call last):
        ...
        substrax.tracking.InvalidStepError: step 18446744073709551615 is past the largest step, 2**63 - 1 (logging scalar 'loss'); ...
    """
    if step is None or (type(step) is int and 0 <= step < 2**63):
        return step
    keys = list(cast("Mapping[object, object]", name)) if isinstance(name, Mapping) else [name]
    what = f"{logged} " + ", ".join(map(repr, keys)) if logged else ""
    if isinstance(step, bool):
        raise InvalidStepError(step, "is a bool, not an integer", what)
    try:
        number = operator.index(step)  # pyright: ignore[reportArgumentType]
    except TypeError:
        raise InvalidStepError(step, f"is a {type(step).__name__}, not an integer", what) from None
    if number < 0:
        raise InvalidStepError(step, "is negative", what)
    if number >= 2**63:
        raise InvalidStepError(step, "is past the largest step, 2**63 - 1", what)
    return number


class Logger(Closeable):
    """The logging surface shared by every backend.

    Only process 0 logs, unless ``all_processes``. :meth:`info` and its siblings go to
    :attr:`python_logger`, the stdlib logger ``substrax.tracking.run.<name>``. The run ends as
    failed (W&B: exit code 1; MLflow: status ``FAILED``) when the ``with`` block raises (anything
    but a clean ``SystemExit``), after :meth:`mark_failed`, or when the process dies of an
    uncaught exception while the logger is open.

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
        self.name = check_logger_name(name)  # before anything is made on disk
        self.process_index = current_process_index(process_index)
        self.active = all_processes or self.process_index == 0
        self.closed = False
        self.failed = False
        self.python_logger = logging.getLogger(f"substrax.tracking.run.{name}")
        _failure.watch(self)

    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one scalar ``value`` under ``name`` at ``step`` (an int in ``[0, 2**63 - 1]``, or None).

        A jax array is read once computed (:meth:`flush` and :meth:`close` wait for it); one
        donated to a later step before it is read is skipped, with a warning.

        Raises:
            LoggerClosedError: the logger is closed.
            EmptyMetricNameError: ``name`` is empty or not a string (on every process).
            InvalidStepError: ``step`` is out of range or not an integer (on every process).
            LoggedTypeError: ``value`` is not a number (a bool, a string, None, an array).
            MetricOverflowError: ``value`` is too large for a float.
        """
        self._check_open()
        check_metric_name(name, value)
        step = check_step(step, "scalar", name)
        if self.active:
            self._write_scalar(name, value, step)

    def log_scalars(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log several scalars at ``step``.

        Raises:
            EmptyMetricNameError: a name is empty.
            InvalidStepError: ``step`` is not an integer in ``[0, 2**63 - 1]``.
        """
        self._check_open()
        for key, value in metrics.items():
            check_metric_name(key, value)
        step = check_step(step, "scalars", metrics)
        if self.active:
            self._write_scalars(metrics, step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Alias of :meth:`log_scalars` (Lightning's name)."""
        self.log_scalars(metrics, step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Log the run's hyperparameters, merged with those logged before (mappings key by key).

        Raises:
            LoggedTypeError: ``params`` is not a mapping, or a key or string of it holds a lone
                surrogate (UTF-8 cannot encode it).
            ValueError: it holds itself, or two keys that are one name once written.
        """
        self._check_open()
        if not isinstance(params, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise LoggedTypeError("hyperparameters", params, "a mapping of names to values")
        # a cycle, colliding keys, a lone surrogate: refused on every process, by every logger
        check_hyperparams(json_ready(params))
        if self.active:
            self._check_params(params)  # what this backend refuses, before anything is written
            self._write_hyperparams(params)

    def log_text(self, name: str, text: str, step: int | None = None) -> None:
        """Log a piece of text (any str UTF-8 can encode: a lone surrogate is refused)."""
        self._check_open()
        check_metric_name(name, text)
        if not isinstance(text, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise LoggedTypeError(f"text {name!r}", text, "a str")
        if not text.isascii() and (at := _unencodable(text)) is not None:
            got = f"one holding {text[at]!r} at {at}"
            raise LoggedTypeError(f"text {name!r}", text, "a str that UTF-8 can encode", got)
        step = check_step(step, "text", name)
        if self.active:
            self._write_text(name, text, step)

    def log_image(self, name: str, image: Any, step: int | None = None) -> None:
        """Log an image: an ``(H, W)``, ``(H, W, 3)`` or ``(H, W, 4)`` array, or a list of them."""
        self._check_open()
        check_metric_name(name, image)
        step = check_step(step, "image", name)
        if self.active:
            many = isinstance(image, Sequence) and not hasattr(image, "shape")
            images = list(image) if many else [image]
            if not images:
                got = f"an empty {type(image).__name__}"
                raise LoggedTypeError(f"image {name!r}", image, "an array or a list of them", got)
            for one in images:
                _check_image(name, one)
            self._write_images(name, images, step)

    def log_histogram(self, name: str, values: Any, step: int | None = None) -> None:
        """Log the distribution of ``values`` (any array-like of numbers)."""
        self._check_open()
        check_metric_name(name, values)
        step = check_step(step, "histogram", name)
        array, problem = histogram_values(values)  # a host array-like read once, for all
        if problem is not None:
            expected = "an array-like of real numbers"
            got = f"{type(values).__name__} ({problem})"
            raise LoggedTypeError(f"histogram {name!r}", values, expected, got)
        if self.active:
            self._write_histogram(name, array, step)

    def flush(self) -> None:
        """Make every record logged so far durable: written (and fsynced), delivered or spooled.

        Call it before saving a checkpoint, so a run resumed from it finds every step up to it.
        """

    def close(self) -> None:
        """Flush and release the backend; later calls raise :class:`LoggerClosedError`."""
        if not self.closed:
            self.closed = True
            _failure.forget(self)
            if self.active:
                self._close()

    def mark_failed(self) -> None:
        """Record that the run failed: closing ends it as failed (after :meth:`close`: nothing)."""
        self.failed = True

    def _check_open(self) -> None:
        if self.closed:
            raise LoggerClosedError(self.name)

    def _block_failed(self, error: BaseException) -> None:
        if _failure.failed_by(error):
            self.mark_failed()

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        """Log ``msg % args`` at ``level`` to :attr:`python_logger` (on a logging process only)."""
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

    @abc.abstractmethod
    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None: ...

    def _write_scalar(self, name: str, value: Any, step: int | None) -> None:
        """Write one scalar (a backend may override it to skip building the mapping)."""
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

    def _check_names(self, names: Iterable[object], step: int | None) -> None:
        """Refuse a name this backend never takes (a :class:`MultiLogger` asks each one first)."""

    def _check_params(self, params: Mapping[str, Any]) -> None:
        """Refuse hyperparameters this backend never takes (asked first, as names are)."""


def _check_image(name: str, image: Any) -> None:
    shape = getattr(image, "shape", None)
    if shape is None:
        raise LoggedTypeError(f"image {name!r}", image, "an array (H, W[, C])")
    ok = len(shape) in (2, 3) and tuple(shape)[2:] in ((), (1,), (3,), (4,))
    if not ok or not all(shape):  # an image of no pixels too
        raise ImageShapeError(name, tuple(shape))
    dtype = getattr(image, "dtype", None)
    if (number_kind(dtype) or "f") not in "biuf":  # strings, objects, complex numbers
        expected = "an array of numbers (bool, int or float, bfloat16 too)"
        raise LoggedTypeError(f"image {name!r}", image, expected, f"dtype {dtype}")
