"""substrax.nnx_typing: type aliases for nnx states and jax key paths. Imports jax and flax.

Annotate a function over a model's state with :data:`NnxState`, and the entries of the paths
``jax.tree_util.tree_flatten_with_path`` yields with :data:`PathEntry` (a union ``isinstance``
accepts) or a whole path with :data:`KeyPath`.

Example:
    >>> import jax
    >>> from flax import nnx
    >>> from substrax.nnx_typing import KeyPath, NnxState, PathEntry, path_entry_key
    >>> state: NnxState = nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
    >>> paths: list[KeyPath] = [path for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    >>> all(isinstance(entry, PathEntry) for path in paths for entry in path)
    True
    >>> sorted(".".join(str(path_entry_key(e)) for e in path) for path in paths)
    ['bias.value', 'kernel.value']
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read),
# and loads now.
lazy_exports(__name__, eager=True)
