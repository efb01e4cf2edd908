"""Reading a watched metric: one number, or an error naming it; a jax array kept to read later."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from typing import Any

from substrax.support import is_device_array

from ._errors import MetricValueError, MissingMetricError
from ._protocol import Logs


_logger = logging.getLogger(__name__)


def check_monitor(monitor: object) -> str:
    """``monitor`` if it is a non-empty metric name, else a ValueError."""
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(f"monitor={monitor!r} must be a non-empty metric name")
    return monitor


def monitored(monitor: str, logs: Logs, hook: str, *, strict: bool) -> bool:
    """Whether ``logs`` hold ``monitor``; if not and ``strict``, a :class:`MissingMetricError`."""
    if monitor not in logs and strict:
        raise MissingMetricError(monitor, tuple(logs), hook)
    return monitor in logs


def check_metric(name: str, value: object, *, who: str) -> None:
    """A MetricValueError unless ``value`` is one number (a ``()`` or ``(1,)`` array too), not a bool."""
    dtype = getattr(value, "dtype", None)
    kind = getattr(dtype, "kind", "f")
    if kind == "V" and getattr(getattr(dtype, "type", None), "__module__", "") == "ml_dtypes":
        kind = "f"  # bfloat16, float8_*: numpy calls ml_dtypes' numbers void
    if (
        value is None
        or isinstance(value, (str, bytes, bool))
        or kind in "bcOSUV"  # a numpy or jax bool, complex, object, text or record
        or getattr(value, "size", 1) != 1
    ):
        raise MetricValueError(name, value, who=who)


def metric_value(name: str, value: object, *, who: str) -> float:
    """``value`` as a float (a jax array waits for its step), or a MetricValueError."""
    check_metric(name, value, who=who)
    try:
        if getattr(value, "ndim", 0):  # float() refuses a (1,) array; item() reads its element
            return float(value.item())  # pyright: ignore[reportAttributeAccessIssue]
        return float(value)  # pyright: ignore[reportArgumentType]
    except (TypeError, ValueError, OverflowError):  # an int too large for a float too
        raise MetricValueError(name, value, who=who) from None


def kept_alive(who: str, metric: str, batch: int, value: object, warned: set[str]) -> bool:
    """Whether a jax array kept from step ``batch`` is readable (not donated); warns once per metric."""
    if not value.is_deleted():  # pyright: ignore[reportAttributeAccessIssue]
        return True
    if metric not in warned:
        warned.add(metric)
        message = (
            "%s skips %r of step %d: its jax array was deleted before it was read, one step "
            "later (donated to the next step's call?); log a value the step returns apart from "
            "its donated state, such as its loss (this warning is given once per metric)"
        )
        _logger.warning(message, who, metric, batch)
    return False


def wait_for(values: Iterable[Any]) -> None:
    """Wait for the jax arrays among ``values`` but those deleted (donated to a later step)."""
    arrays = [v for v in values if is_device_array(v) and not v.is_deleted()]
    if arrays:
        import jax  # noqa: PLC0415  (holding jax arrays, the process has jax loaded)

        jax.block_until_ready(arrays)


def warn_missing_metric(who: str, metric: str, logged: Collection[str]) -> None:
    """Warn that ``metric`` is not among the ``logged`` metrics (a misspelled name?)."""
    message = (
        "%s watches metric %r, but the logs it was given hold %s; check the spelling "
        "(it does nothing until that metric is logged)"
    )
    _logger.warning(message, who, metric, sorted(logged))
