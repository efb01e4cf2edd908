"""Telling a jax array apart from a host number without importing jax.

A logger or callback given a ``jax.Array`` must not read it on the training thread (that waits
for the step computing it); a process that never imported jax holds no jax arrays, so the
check must not import it either.
"""

from __future__ import annotations


# Each type of value seen: whether it is a jax array, told once per type.
_DEVICE_TYPES: dict[type, bool] = {}


def is_device_array(value: object) -> bool:
    """Whether ``value`` is a jax array (its computation may still run), without importing jax.

    Told by its type's module (``jax``/``jaxlib``) and its ``block_until_ready`` method, once per
    type, so a call costs one dictionary look-up: a jax array or key array is one; a tracer, a
    numpy array or a Python number is not.

    Example:
        >>> import numpy as np
        >>> from substrax.support import is_device_array
        >>> is_device_array(0.5), is_device_array(np.float32(0.5))
        (False, False)
        >>> import jax.numpy as jnp
        >>> is_device_array(jnp.ones(()))
        True
    """
    kind = type(value)
    known = _DEVICE_TYPES.get(kind)
    if known is None:
        module = str(getattr(kind, "__module__", "") or "")
        known = _DEVICE_TYPES[kind] = module.partition(".")[0] in {"jax", "jaxlib"} and callable(
            getattr(kind, "block_until_ready", None)
        )
    return known
