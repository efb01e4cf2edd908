"""substrax.rng: keys from an explicit owner, and streams derived from a seed by name.

Imports jax but not flax; ``rngs_from_seed`` needs the ``substrax-runtime[nnx]`` extra.

Example:
    >>> import jax
    >>> from substrax.rng import fold_in_name, key_from, split_key
    >>> key = key_from(jax.random.key(0), streams=("params",), context="init")
    >>> split_key(fold_in_name(key, "params"), 4).shape
    (4,)
"""

from ._errors import MissingRngStreamError as MissingRngStreamError
from ._keys import (
    NNX_EXTRA as NNX_EXTRA,
    fold_in_name as fold_in_name,
    key_from as key_from,
    rngs_from_seed as rngs_from_seed,
    split_key as split_key,
)


__all__ = [
    "NNX_EXTRA",
    "MissingRngStreamError",
    "fold_in_name",
    "key_from",
    "rngs_from_seed",
    "split_key",
]
