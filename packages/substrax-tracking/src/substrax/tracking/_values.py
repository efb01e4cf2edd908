"""The values a logger takes: scalars checked without reading a jax array, read later off the training thread."""

# ruff: noqa: ANN401  (logged values and SDK objects are typed Any on purpose)

from __future__ import annotations

import atexit
import contextlib
import decimal
import functools
import logging
import math
import numbers
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from substrax.support import is_device_array

from ._errors import LoggedTypeError, MetricOverflowError


if TYPE_CHECKING:
    from ._base import Logger

_logger = logging.getLogger(__name__)


def number_kind(dtype: Any) -> str | None:
    """The numpy kind of ``dtype`` (``"f"``, ``"i"``...), ml_dtypes' too, which numpy calls void.

    Example:
        >>> import ml_dtypes, numpy as np
        >>> from substrax.tracking._values import number_kind
        >>> number_kind(np.dtype(ml_dtypes.bfloat16)), number_kind(np.dtype(ml_dtypes.int4))
        ('f', 'i')
        >>> number_kind(np.dtype("uint8")), number_kind(None)
        ('u', None)
    """
    kind = getattr(dtype, "kind", None)
    scalar = getattr(dtype, "type", None)
    if kind == "V" and getattr(scalar, "__module__", None) == "ml_dtypes":  # bfloat16, float8, int4
        return "i" if getattr(dtype, "name", "").startswith(("int", "uint")) else "f"
    return kind


def as_scalar(name: str, value: Any, step: int | None = None) -> float:
    """``value`` as a builtin float: Python and numpy numbers, 0-d and 1-element arrays.

    Example:
        >>> import numpy as np
        >>> from substrax.tracking._values import as_scalar
        >>> as_scalar("loss", 3), as_scalar("loss", np.float64(0.5))
        (3.0, 0.5)
        >>> as_scalar("loss", "2", step=7)
        Traceback (most recent call last):
        ...
        substrax.tracking.LoggedTypeError: scalar 'loss' must be a number, got str '2' (at step 7)
    """
    if isinstance(value, float):  # np.float64 and other subclasses: a builtin float, written as one
        return float(value)
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    size = getattr(value, "size", None)
    expected = "a number"
    if isinstance(value, bool | str | bytes) or value is None:
        got = f"{type(value).__name__} {value!r}"
    elif kind == "b":  # a numpy or jax bool, refused as Python's is
        got = f"a bool {type(value).__name__} {value!r}"
    elif kind == "c":  # float() drops the imaginary part
        got = f"complex {type(value).__name__} {value!r}"
    elif kind in ("U", "S", "V") and number_kind(value.dtype) not in ("f", "i"):
        # float() parses np.array("1") as it would the string
        got = f"an array of {value.dtype} {value!r}"
    elif isinstance(value, numbers.Real | decimal.Decimal) or size == 1:
        try:
            array: Any = value  # a 1-d array of one element: float() refuses it, item() does not
            number = float(array.item() if size == 1 and getattr(array, "ndim", 0) else array)
        except OverflowError:
            raise MetricOverflowError(name, value, step) from None
        except (TypeError, ValueError):  # one string, one object
            got = f"{type(value).__name__} {value!r}"
        else:
            if math.isinf(number) and isinstance(value, decimal.Decimal) and value.is_finite():
                raise MetricOverflowError(name, value, step)  # float() made it infinite
            return number
    else:
        expected = "a number or a one-element array"
        of_size = "" if size is None else f" of size {size}"
        got = f"{type(value).__name__}{of_size}; log arrays with log_histogram or log_image"
    at_step = "" if step is None else f" (at step {step})"
    raise LoggedTypeError(f"scalar {name!r}", value, expected, got=got + at_step)


@functools.cache  # once per dtype: a jax scalar is logged every step
def _real_dtype(dtype: Any) -> bool:
    """Whether a jax scalar of ``dtype`` reads as a float: integer or real (bfloat16 too)."""
    import jax.numpy as jnp  # noqa: PLC0415  (imported already: a jax array was logged)

    return any(bool(jnp.issubdtype(dtype, kind)) for kind in (jnp.floating, jnp.integer))


def checked_scalar(name: str, value: Any, step: int | None) -> Any:
    """``value`` as :func:`as_scalar` makes it, except a jax scalar: checked but returned unread."""
    if type(value) is float:
        return value
    if is_device_array(value):
        with contextlib.suppress(Exception):  # jax cannot describe it: as_scalar says why
            real = value.size == 1 and _real_dtype(value.dtype)
            if real and value.is_fully_addressable and not value.is_deleted():
                return value
    return as_scalar(name, value, step)


def checked_scalars(metrics: Mapping[str, Any], step: int | None) -> list[tuple[str, Any]]:
    """Each ``(key, value)`` of ``metrics`` through :func:`checked_scalar`, all before any is kept."""
    return [(key, checked_scalar(key, value, step)) for key, value in metrics.items()]


def value_ready(value: Any) -> bool:
    """Whether a value :func:`checked_scalar` returned reads without waiting (a deleted one does)."""
    if type(value) is float:
        return True
    try:  # deleted (a donated buffer): reading it fails without waiting; jax 0.11's is_ready crashes
        return bool(value.is_deleted() or value.is_ready())
    except Exception:
        return True


def prefetch(values: Iterable[Any]) -> None:
    """Start the device-to-host copies of jax ``values`` together, so that they overlap."""
    for value in values:
        with contextlib.suppress(Exception):  # deleted: its read fails and says so
            value.copy_to_host_async()


def read_scalar(
    label: str, name: str, value: Any, step: int | None, warned: set[str]
) -> float | None:
    """The float of a value :func:`checked_scalar` returned, waiting for its computation.

    A jax array deleted since (a donated buffer) is None, warned about once per name in ``warned``.
    """
    if type(value) is float:
        return value
    try:
        return float(value.item())  # item(): float() refuses an array of shape (1,)
    except Exception as error:
        if name in warned:
            _logger.debug("%s: %r at step %s could not be read: %s", label, name, step, error)
        else:
            warned.add(name)
            _logger.warning(
                f"{label}: the value of {name!r} logged at step {step} could not be read "
                f"({type(error).__name__}: {error}), so it is skipped; log arrays the step does "
                "not donate (a buffer donated to the next step is deleted before the logger reads "
                f"it). Later values of {name!r} that cannot be read are skipped without this warning"
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


def drain_at_exit(logger: Logger, *, again: bool = False) -> None:
    """Have ``logger.flush()`` write what it holds at exit (jax values too), if still open then.

    Registered again for each new logger, or ``again`` (a logger's first jax value): atexit runs
    the last registered first, and this must run before jax's own handler.
    """
    if again or logger not in _HOLDING:
        _HOLDING.add(logger)
        atexit.unregister(_drain_holding)
        atexit.register(_drain_holding)


def _forget_in_child() -> None:
    """A forked child does not write its parent's held values, at its exit or ever (the parent does)."""
    for logger in list(_HOLDING):
        forget = getattr(logger, "_forget_after_fork", None)
        if callable(forget):
            forget()
    _HOLDING.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def histogram_summary(values: Any, bins: int = 64) -> dict[str, Any]:
    """Counts, bin edges and summary statistics of ``values`` (numpy), JSON-ready.

    Example:
        >>> from substrax.tracking._values import histogram_summary
        >>> histogram_summary([1.0, 2.0, 3.0], bins=2)["count"]
        3
    """
    import numpy as np  # noqa: PLC0415

    array = np.asarray(values, dtype=np.float64).ravel()
    stats = ("min", "max", "mean", "std")
    count = int(array.size)
    if count == 0:
        return {"count": 0, **dict.fromkeys(stats, math.nan), "counts": [], "edges": []}
    # the statistics of every value: a NaN or an infinity shows in them; the bins hold the finite
    with np.errstate(over="ignore", invalid="ignore"):  # a mean of -1e308 and 1e308 overflows
        summary = {stat: float(getattr(array, stat)()) for stat in stats}
    finite = array[np.isfinite(array)]
    if finite.size == 0:
        return {"count": count, **summary, "counts": [], "edges": []}
    counts, edges = histogram_counts(finite, bins)
    return {"count": count, **summary, "counts": counts.tolist(), "edges": edges.tolist()}


def histogram_values(values: Any) -> tuple[Any, str | None]:
    """``values`` as the array every logger reads, and why they are not real numbers, or None.

    A host array-like becomes numpy's array once; a jax array stays as it is, judged by its
    dtype alone (nothing is read from the device).

    Example:
        >>> from substrax.tracking._values import histogram_values
        >>> histogram_values([1, 2.5])[1], histogram_values(None)[1], histogram_values([1j])[1]
        (None, 'its values are of the dtype object', 'its values are of the dtype complex128')
    """
    import numpy as np  # noqa: PLC0415

    if not is_device_array(values):
        try:
            values = np.asarray(values)
        except (TypeError, ValueError) as error:  # a ragged list
            return values, str(error)
    if (number_kind(values.dtype) or "O") not in "biuf":  # complex, objects, strings, dates
        return values, f"its values are of the dtype {values.dtype}"
    return values, None


def histogram_counts(finite: Any, bins: int) -> tuple[Any, Any]:
    """``np.histogram`` of finite values in ``bins`` equal bins, or in one bin over their range.

    One bin where the range is too narrow or too wide (-1e308 to 1e308) for equal bins.

    Example:
        >>> from substrax.tracking._values import histogram_counts
        >>> counts, edges = histogram_counts([1.0, 1.0000000000000002], 64)
        >>> counts.tolist(), len(edges)
        ([2], 2)
        >>> histogram_counts([2.0**64, 2.0**64], 64)[0].tolist()
        [2]
    """
    import numpy as np  # noqa: PLC0415

    finite = np.asarray(finite, dtype=np.float64)
    low, high = finite.min(), finite.max()
    with np.errstate(over="ignore", invalid="ignore"):  # a step of (1e308 + 1e308) / bins
        edges = np.linspace(low, high, bins + 1)
    if low == high and low + 0.5 == low:  # numpy's own +-0.5 around one value is lost (2**64)
        return np.histogram(finite, bins=np.array([low, np.nextafter(high, np.inf)]))
    if low < high and not (np.isfinite(edges).all() and (edges[:-1] < edges[1:]).all()):
        return np.histogram(finite, bins=np.array([low, high]))  # numpy's own check differs
    return np.histogram(finite, bins=bins)  # by version: it may index out of its bins instead
