"""Integer arguments that may come from NumPy or jax (``np.int64(64)``), checked like ints."""

import operator
from typing import SupportsIndex, cast

from substrax.support import check_int


def check_index(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` as a Python int: an int or any integer with ``__index__``; never a bool.

    Raises:
        TypeError: ``value`` is a bool or not an integer (a float, a string).
        ValueError: ``value`` is below ``minimum``.
    """
    if isinstance(value, bool):
        return check_int(name, value, minimum=minimum)  # raises: a bool is not a count
    try:
        index = operator.index(cast("SupportsIndex", value))
    except TypeError:
        return check_int(name, value, minimum=minimum)  # raises, naming the type
    return check_int(name, index, minimum=minimum)
