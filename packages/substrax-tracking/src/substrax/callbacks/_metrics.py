"""Reading a metric out of the logs: one number, or an error naming the metric."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

from ._errors import MetricValueError


__all__ = ["as_metric_names", "metric_value", "warn_missing_metric"]

_logger = logging.getLogger(__name__)


def metric_value(name: str, value: object, *, who: str) -> float:
    """``value`` as a float if it is one number (a Python, numpy or jax scalar).

    Raises:
        MetricValueError: ``value`` is None, a string, a vector or anything else that is not
            one number; the message names the metric and ``who`` read it.
    """
    shape = getattr(value, "shape", ())
    if value is None or isinstance(value, (str, bytes)) or shape != ():
        raise MetricValueError(name, value, who=who)
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
