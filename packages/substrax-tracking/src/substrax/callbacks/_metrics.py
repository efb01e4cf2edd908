"""Reading a metric out of the logs: one number, or an error naming the metric.

A metric logged as a jax array is the output of a step that may still be running: reading it
(``float``) waits for that step. :func:`check_metric` refuses a value that is not one number
from its type and shape alone, which waits for nothing; :func:`is_device_array` tells the
callbacks which values to keep and read one step later, once the next step is dispatched.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from substrax.support import is_device_array

from ._errors import MetricValueError


__all__ = [
    "all_ready",
    "as_metric_names",
    "check_metric",
    "device_arrays",
    "is_device_array",
    "metric_value",
    "wait_for",
    "warn_deleted",
    "warn_missing_metric",
    "was_deleted",
]

_logger = logging.getLogger(__name__)


def was_deleted(value: object) -> bool:
    """Whether ``value`` is a jax array deleted since it was logged (donated to a later call)."""
    return is_device_array(value) and bool(value.is_deleted())  # pyright: ignore[reportAttributeAccessIssue]


def warn_deleted(who: str, metric: str, batch: int) -> None:
    """Warn that a kept value of ``metric`` was deleted before it could be read, and is skipped."""
    _logger.warning(
        "%s skips %r of step %d: its jax array was deleted before it was read, one step "
        "later (donated to the next step's call?); log a value the step returns apart from "
        "its donated state, such as its loss (this warning is given once per metric)",
        who,
        metric,
        batch,
    )


def device_arrays(values: Iterable[object]) -> tuple[Any, ...]:
    """The jax arrays among ``values``, in order."""
    return tuple(value for value in values if is_device_array(value))


def all_ready(arrays: Iterable[Any]) -> bool:
    """Whether every one of ``arrays`` is computed (``jax.Array.is_ready``), without waiting.

    An array whose step failed (or that was deleted) reads as not ready: the error is raised
    by :func:`wait_for`, where a caller expects to wait.
    """
    try:
        return all(array.is_ready() for array in arrays)
    except RuntimeError:  # jax.errors.JaxRuntimeError
        return False


def wait_for(arrays: Sequence[Any]) -> None:
    """Block until ``arrays`` are computed; raises the error of a step that failed."""
    if arrays:
        import jax  # noqa: PLC0415  (holding jax arrays, the process has jax loaded)

        jax.block_until_ready(list(arrays))


def check_metric(name: str, value: object, *, who: str) -> None:
    """Refuse ``value`` unless it may be one number, from its type and shape alone (no wait).

    Raises:
        MetricValueError: ``value`` is None, a string, or has a shape other than ``()``.
    """
    shape = getattr(value, "shape", ())
    if value is None or isinstance(value, (str, bytes)) or shape != ():
        raise MetricValueError(name, value, who=who)


def metric_value(name: str, value: object, *, who: str) -> float:
    """``value`` as a float if it is one number (a Python, numpy or jax scalar).

    A jax array is read from the device: this waits for the step that computes it.

    Raises:
        MetricValueError: ``value`` is None, a string, a vector or anything else that is not
            one number; the message names the metric and ``who`` read it.
    """
    check_metric(name, value, who=who)
    try:
        return float(value)  # pyright: ignore[reportArgumentType]
    except (TypeError, ValueError):
        raise MetricValueError(name, value, who=who) from None


def as_metric_names(name: str, metrics: str | Sequence[str]) -> tuple[str, ...]:
    """One metric name (a string) or several, as a tuple; a string is never split into letters.

    Raises:
        TypeError: an entry is not a non-empty string.
    """
    names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    for entry in names:
        if not isinstance(entry, str) or not entry:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"{name}={metrics!r} must be metric names (strings); got {entry!r}")
    return names


def warn_missing_metric(who: str, metric: str, logged: Collection[str]) -> None:
    """Warn (on logger ``substrax.callbacks``) that ``metric`` is not among the logged metrics."""
    _logger.warning(
        "%s watches metric %r, but the logs it was given hold %s; check the spelling "
        "(it does nothing until that metric is logged)",
        who,
        metric,
        sorted(logged),
    )
