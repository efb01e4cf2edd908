"""check_seconds: a time limit given as an argument must be a finite number of seconds."""

from __future__ import annotations

import math


__all__ = ["check_seconds"]


def check_seconds(name: str, value: float, *, positive: bool = False) -> float:
    """``value`` as a float if it is a finite number of seconds (> 0 with ``positive``, else >= 0).

    Raises:
        ValueError: ``value`` is NaN, infinite, negative (or 0 with ``positive``); the message
            names the argument ``name``.

    Example:
        >>> check_seconds("close_timeout", 5)
        5.0
        >>> check_seconds("close_timeout", float("inf"))
        Traceback (most recent call last):
        ...
        ValueError: close_timeout=inf must be a finite number of seconds >= 0
    """
    bound = "> 0" if positive else ">= 0"
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ValueError(f"{name}={value!r} must be a finite number of seconds {bound}")
    return number
