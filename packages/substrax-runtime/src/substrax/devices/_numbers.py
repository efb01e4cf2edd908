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
    if isinstance(value, bool) or _is_numpy_bool(value):
        return check_int(name, value, minimum=minimum)  # raises: a bool is not a count
    try:
        index = operator.index(cast("SupportsIndex", value))
    except TypeError:
        return check_int(name, value, minimum=minimum)  # raises, naming the type
    return check_int(name, index, minimum=minimum)


def _is_numpy_bool(value: object) -> bool:
    # before numpy 2.?, operator.index(np.True_) only warns (and the warning is an error here)
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")
