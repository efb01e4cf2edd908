"""Logger: the one surface every tracking backend offers."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import abc
import atexit
import logging
import math
import numbers
import operator
import os
import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from substrax.support import Closeable, is_device_array

from . import _failure
from ._errors import (
    EmptyMetricNameError,
    ImageShapeError,
    InvalidLoggerNameError,
    InvalidStepError,
    LoggedTypeError,
    LoggerClosedError,
    MetricOverflowError,
)
from ._process import current_process_index


__all__ = [
    "Logger",
    "as_scalar",
    "check_metric_name",
    "check_step",
    "drain_at_exit",
    "histogram_summary",
    "is_device_array",
    "prefetch",
    "python_logger_name",
    "read_scalar",
    "safe_name",
    "unread_scalar",
    "value_ready",
]

_logger = logging.getLogger(__name__)

_GRAY, _COLOR = 2, 3
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
# Each dtype of a jax scalar logged: whether it is read as a float (a bool, integer or real dtype).
_REAL_DTYPES: dict[Any, bool] = {}


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


def check_step(step: object) -> int:
    """``step`` as a plain int, refused unless it is an integer in ``[0, 2**63 - 1]``.

    A numpy (or jax) integer becomes the builtin int it holds. The logging calls check a plain
    int in range themselves, inline (the per-step cost is a type and a range test), and call
    this only for anything else.

    Raises:
        InvalidStepError: ``step`` is not an integer (a bool, a float, a string), is negative,
            or is past ``2**63 - 1``, the largest step a backend stores.

    Example:
        >>> import numpy as np
        >>> from substrax.tracking._base import check_step
        >>> check_step(np.int64(3)), check_step(2**63 - 1)
        (3, 9223372036854775807)
        >>> check_step(2**64 - 1)
        Traceback (most recent call last):
        ...
        substrax.tracking.InvalidStepError: step 18446744073709551615 is past the largest step, 2**63 - 1; ...
    """
    if isinstance(step, bool):
        raise InvalidStepError(step, "is a bool, not an integer")
    try:
        number = operator.index(step)  # pyright: ignore[reportArgumentType]
    except TypeError:
        raise InvalidStepError(step, f"is a {type(step).__name__}, not an integer") from None
    if number < 0:
        raise InvalidStepError(step, "is negative")
    if number >= 2**63:
        raise InvalidStepError(step, "is past the largest step, 2**63 - 1")
    return number


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


def _real_dtype(dtype: Any) -> bool:
    """Whether a jax scalar of ``dtype`` reads as a float: bool, integer or real (bfloat16 too)."""
    known = _REAL_DTYPES.get(dtype)
    if known is None:
        import jax.numpy as jnp  # noqa: PLC0415  (imported already: a jax array was logged)

        known = _REAL_DTYPES[dtype] = any(
            bool(jnp.issubdtype(dtype, kind)) for kind in (jnp.floating, jnp.integer, jnp.bool_)
        )
    return known


def unread_scalar(name: str, value: Any) -> Any:
    """``value`` as :func:`as_scalar` makes it, except a jax scalar, which is checked but not read.

    A jax array's value is read only once its computation has finished: reading it here would
    wait for the step that computes it, and stall jax's asynchronous dispatch. A 0-d jax array of
    a bool, integer or real dtype, on devices of this process and not deleted, is returned
    unread (checked by its dtype and shape, which need no wait); its reader reads it later with
    :func:`read_scalar`. Anything else goes through :func:`as_scalar`, with its errors (a jax
    array of several values raises the same :class:`LoggedTypeError` as a numpy one).

    Raises:
        LoggedTypeError: ``value`` is not a number (see :func:`as_scalar`).
        MetricOverflowError: ``value`` is too large for a float.

    Example:
        >>> from substrax.tracking._base import unread_scalar
        >>> unread_scalar("loss", 3)
        3.0
    """
    if is_device_array(value):
        try:
            unread = (
                not value.shape
                and _real_dtype(value.dtype)
                and value.is_fully_addressable
                and not value.is_deleted()
            )
        except Exception:  # an array jax cannot describe: as_scalar says what is wrong with it
            unread = False
        if unread:
            return value
    return as_scalar(name, value)


def value_ready(value: Any) -> bool:
    """Whether a value :func:`unread_scalar` returned can be read without waiting (never blocks).

    A float is; a jax array is once its computation has finished. A deleted one counts as
    ready: reading it fails at once (:func:`read_scalar` skips it).
    """
    if type(value) is float:
        return True
    try:
        return bool(value.is_ready())
    except Exception:  # deleted (a donated buffer): reading it fails without waiting
        return True


def prefetch(values: Iterable[Any]) -> None:
    """Start copying jax ``values`` to the host, all at once, before they are read one by one.

    On an accelerator each read of a computed value is a device-to-host copy: started together,
    the copies overlap rather than each waiting for the one before. Never blocks.
    """
    for value in values:
        try:
            value.copy_to_host_async()
        except Exception:  # noqa: S112  (deleted: its read fails and says so)
            continue


def read_scalar(
    label: str, name: str, value: Any, step: int | None, warned: set[str]
) -> float | None:
    """The float of a value :func:`unread_scalar` returned, waiting for its computation if need be.

    A jax array that cannot be read any more (deleted, as a buffer donated to a later step is) is
    skipped: None, with a warning naming the metric and step, once per metric name in
    ``warned`` (the logger's set; later ones are logged at DEBUG).
    """
    if type(value) is float:
        return value
    try:
        return float(value)
    except Exception as error:
        if name in warned:
            _logger.debug("%s: %r at step %s could not be read: %s", label, name, step, error)
        else:
            warned.add(name)
            _logger.warning(
                "%s: the value of %r logged at step %s could not be read (%s: %s), so it is "
                "skipped; log arrays the step does not donate (a buffer donated to the next step "
                "is deleted before the logger reads it). Later values of %r that cannot be read "
                "are skipped without this warning",
                label,
                name,
                step,
                type(error).__name__,
                error,
                name,
            )
        return None


# Loggers holding jax values not read yet: at exit, each one's flush() writes them.
_HOLDING: weakref.WeakSet[Logger] = weakref.WeakSet()


def _drain_holding() -> None:
    """At exit, write what open loggers hold unread (a SystemExit raised at SIGTERM included)."""
    for logger in list(_HOLDING):
        if not logger.closed:
            try:
                logger.flush()
            except Exception as error:
                _logger.warning("%r could not write what it held at exit: %s", logger, error)
    _HOLDING.clear()


def drain_at_exit(logger: Logger) -> None:
    """Have :meth:`Logger.flush` of ``logger`` run at interpreter exit if it is still open then.

    A logger that holds jax values unread writes them at its ``flush`` (waiting for them).

    Called when a logger first holds a jax value unread. The hook is registered again each time
    (atexit runs the last registered first), so that it runs before jax's own exit hooks, which
    jax registered when it was imported, before any jax value existed.
    """
    if logger not in _HOLDING:
        _HOLDING.add(logger)
        atexit.unregister(_drain_holding)
        atexit.register(_drain_holding)


# A forked child does not write its parent's held values at its own exit (the parent does).
os.register_at_fork(after_in_child=_HOLDING.clear)


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

        ``value`` is a Python or numpy number, a one-element array, or a jax array: a 0-d jax
        array is not read here (reading it waits for the step that computes it); each backend
        reads it once it is computed, and :meth:`flush` and :meth:`close` wait for it. It must
        not be a buffer donated to a later step, which deletes it (it is then skipped, with a
        warning).

        ``step`` is an int in ``[0, 2**63 - 1]`` (a numpy or jax integer too), or None.

        Raises:
            LoggerClosedError: the logger is closed.
            EmptyMetricNameError: ``name`` is empty or not a string (on every process).
            InvalidStepError: ``step`` is not an integer in ``[0, 2**63 - 1]`` (on every
                process).
            LoggedTypeError: ``value`` is not a number (a bool, a string, None, an array).
            MetricOverflowError: ``value`` is too large for a float.
        """
        if self.closed:
            raise LoggerClosedError(self.name)
        check_metric_name(name, value)
        if step is not None and not (type(step) is int and 0 <= step < 2**63):
            step = check_step(step)
        if self.active:
            self._write_scalar(name, value, step)

    def log_scalars(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log several scalars at ``step``.

        Raises:
            EmptyMetricNameError: a name is empty.
            InvalidStepError: ``step`` is not an integer in ``[0, 2**63 - 1]``.
        """
        if self.closed:
            raise LoggerClosedError(self.name)
        for key, value in metrics.items():
            check_metric_name(key, value)
        if step is not None and not (type(step) is int and 0 <= step < 2**63):
            step = check_step(step)
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
        if step is not None and not (type(step) is int and 0 <= step < 2**63):
            step = check_step(step)
        if self.active:
            self._write_text(name, text, step)

    def log_image(self, name: str, image: Any, step: int | None = None) -> None:
        """Log an image: an ``(H, W)``, ``(H, W, 3)`` or ``(H, W, 4)`` array, or a list of them."""
        if self.closed:
            raise LoggerClosedError(self.name)
        if step is not None and not (type(step) is int and 0 <= step < 2**63):
            step = check_step(step)
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
        if step is not None and not (type(step) is int and 0 <= step < 2**63):
            step = check_step(step)
        if self.active:
            self._write_histogram(name, values, step)

    def flush(self) -> None:
        """Make every record logged so far durable: written (and fsynced), delivered or spooled.

        After it returns, a kill of the process (SIGKILL included) loses nothing logged before
        the call, so call it before saving a checkpoint (``CheckpointCallback(flush=...)`` and
        ``PreemptionHandler(flush=...)`` do): a run resumed from the checkpoint then finds every
        step up to it. Each backend says what it writes; a remote one returns within a bound.
        """

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
