"""substrax.rng: keys from an explicit owner, and streams derived from a seed by name.

Imports jax but not flax; ``rngs_from_seed`` needs the ``substrax-runtime[nnx]`` extra.

Example:
    >>> import jax
    >>> from substrax.rng import fold_in_name, key_from, split_key
    >>> key = key_from(jax.random.key(0), streams=("params",), context="init")
    >>> split_key(fold_in_name(key, "params"), 4).shape
    (4,)
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read),
# and loads now.
lazy_exports(__name__, eager=True)
