"""Validated numbers for configs and arguments: one wording for every part."""

import math
from numbers import Real
from typing import cast


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum``.

    Raises:
        TypeError: ``value`` is not an int (a bool, a float, a string, a numpy scalar).
        ValueError: ``value`` is below ``minimum``.

    Example:
        >>> from substrax.support import check_int
        >>> check_int("patience", 3, minimum=1)
        3
        >>> check_int("patience", 0, minimum=1)
        Traceback (most recent call last):
        ...
        ValueError: patience=0 must be an integer >= 1
        >>> check_int("patience", True)
        Traceback (most recent call last):
        ...
        TypeError: patience=True must be an integer, not bool
    """
    bound = "" if minimum is None else f" >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an integer{bound}, not {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer{bound}")
    return value


def check_float(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
    unit: str = "",
) -> float:
    """``value`` as a float if it is a finite real number (not a bool) within the bounds.

    Args:
        name: the argument's name, for the message.
        value: what was given.
        minimum: the lowest value allowed (excluded with ``exclusive_minimum``).
        maximum: the highest value allowed (excluded with ``exclusive_maximum``).
        exclusive_minimum: ``minimum`` itself is refused.
        exclusive_maximum: ``maximum`` itself is refused.
        unit: what the number counts, for the message (``"seconds"``).

    Raises:
        TypeError: ``value`` is not a real number.
        ValueError: ``value`` is NaN, infinite (an int too large for a float too) or out of
            bounds.

    Example:
        >>> from substrax.support import check_float
        >>> check_float("timeout", 5, minimum=0, exclusive_minimum=True, unit="seconds")
        5.0
        >>> check_float("timeout", float("inf"), minimum=0, unit="seconds")
        Traceback (most recent call last):
        ...
        ValueError: timeout=inf must be a finite number of seconds >= 0
        >>> check_float("b1", 1.5, minimum=0, maximum=1, exclusive_maximum=True)
        Traceback (most recent call last):
        ...
        ValueError: b1=1.5 must be a finite number >= 0 and < 1
    """
    bounds = [
        f"{'>' if exclusive_minimum else '>='} {minimum:g}" if minimum is not None else "",
        f"{'<' if exclusive_maximum else '<='} {maximum:g}" if maximum is not None else "",
    ]
    wanted = " ".join(
        filter(
            None,
            ["a finite number", f"of {unit}" if unit else "", " and ".join(filter(None, bounds))],
        )
    )
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name}={value!r} must be {wanted}, not {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int past the largest float (~1.8e308)
        digits = int(abs(cast("int", value)).bit_length() * math.log10(2)) + 1
        raise ValueError(f"{name}=<an int of about {digits} digits> must be {wanted}") from None
    too_low = minimum is not None and (
        number < minimum or (exclusive_minimum and number == minimum)
    )
    too_high = maximum is not None and (
        number > maximum or (exclusive_maximum and number == maximum)
    )
    if not math.isfinite(number) or too_low or too_high:
        raise ValueError(f"{name}={value!r} must be {wanted}")
    return number


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """``value`` as a float if it is a finite number of seconds (> 0 with ``positive``, else >= 0).

    Example:
        >>> from substrax.support import check_seconds
        >>> check_seconds("close_timeout", 5)
        5.0
        >>> check_seconds("poll_interval", 0, positive=True)
        Traceback (most recent call last):
        ...
        ValueError: poll_interval=0 must be a finite number of seconds > 0
    """
    return check_float(name, value, minimum=0, exclusive_minimum=positive, unit="seconds")
