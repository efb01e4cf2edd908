"""Refusing a 64-bit NumPy leaf whose values jax would change as it narrows it to 32 bits.

With ``jax_enable_x64`` off (jax's default) ``jax.device_put`` turns int64, uint64 and float64
into their 32-bit types without a word: ``2**40`` becomes ``0``, ``1e300`` becomes ``inf``.
Reading a host array's minimum and maximum is cheap; device arrays are never read.
"""

from typing import Any, cast

import numpy as np

from ._errors import BatchDtypeError


_WIDE = 8  # bytes: the item size jax narrows to 4 while x64 is off


def check_fits_32_bits(path: str, leaf: "np.ndarray[Any, Any] | np.generic") -> None:
    """Refuse ``leaf`` if jax would narrow it to 32 bits and its values do not fit.

    A float's precision is float32's once placed; only values beyond float32's range (which
    would become ``inf``) are refused. NaN and infinities are kept as they are.

    Raises:
        BatchDtypeError: x64 is off and an int64, uint64 or float64 leaf holds a value the
            32-bit type cannot; the message names the leaf, its value range and the fix.

    Example:
        >>> import numpy as np
        >>> from substrax.devices import check_fits_32_bits
        >>> check_fits_32_bits("['ids']", np.arange(4, dtype=np.int64))  # fits: nothing to say
        >>> check_fits_32_bits("['ids']", np.arange(4, dtype=np.int64) + 2**40)
        Traceback (most recent call last):
        ...
        substrax.devices.BatchDtypeError: batch leaf ['ids'] is int64 with values from 1099511627776 ...
    """
    import jax  # noqa: PLC0415  (only where a leaf is placed)

    dtype = cast("np.dtype[Any]", leaf.dtype)
    if dtype.itemsize != _WIDE or dtype.kind not in "iuf" or jax.config.jax_enable_x64:
        return
    array = cast("np.ndarray[Any, Any]", np.asarray(leaf))
    if array.size == 0:
        return
    low, high = array.min(), array.max()
    narrow = np.dtype(f"{dtype.kind}4")
    if dtype.kind == "f":
        if not (np.isfinite(low) and np.isfinite(high)):  # NaN or inf: read the finite values
            finite = array[np.isfinite(array)]
            if finite.size == 0:
                return
            low, high = finite.min(), finite.max()
        with np.errstate(over="ignore"):
            fits = bool(np.isfinite(np.float32(low)) and np.isfinite(np.float32(high)))
    else:
        info = np.iinfo(narrow)
        fits = info.min <= int(low) and int(high) <= info.max
    if not fits:
        raise BatchDtypeError(
            path=path, dtype=str(dtype), low=low.item(), high=high.item(), narrow=str(narrow)
        )
