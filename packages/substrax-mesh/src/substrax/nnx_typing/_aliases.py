"""The aliases: an nnx state's recursive shape, and the entries of a jax key path."""

import jax
from flax import nnx
from flax.typing import Key
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey


type NnxState = nnx.State[Key, NnxState | nnx.Variable[jax.Array]]
"""An ``nnx.State`` whose values are nested states or array variables (``nnx.state(model)``)."""

PathEntry = DictKey | SequenceKey | GetAttrKey | FlattenedIndexKey
"""One entry of a jax key path (``jax.tree_util.tree_flatten_with_path``); a union that
``isinstance`` accepts."""

type KeyPath = tuple[PathEntry, ...]
"""A whole jax key path, root first."""


def path_entry_key(entry: PathEntry) -> str | int:
    """The name or index an entry of a key path stands for.

    Args:
        entry: A ``DictKey``, ``SequenceKey``, ``GetAttrKey`` or ``FlattenedIndexKey``.

    Returns:
        The dict key (as a string, or an int when it is one), the sequence index, the
        attribute name, or the flattened index.

    Raises:
        TypeError: ``entry`` is not one of the four entry types.

    Example:
        >>> import jax
        >>> from substrax.nnx_typing import path_entry_key
        >>> [path_entry_key(e) for e in jax.tree_util.tree_flatten_with_path({"w": [0, 1]})[0][1][0]]
        ['w', 1]
    """
    match entry:
        case DictKey():
            key: object = entry.key
            return key if isinstance(key, int) else str(key)
        case SequenceKey():
            return entry.idx
        case GetAttrKey():
            return entry.name
        case FlattenedIndexKey():
            return entry.key
        case _:  # pyright: ignore[reportUnnecessaryComparison]
            msg = f"{entry!r} is not a jax key-path entry; expected one of DictKey, SequenceKey, GetAttrKey, FlattenedIndexKey"
            raise TypeError(msg)
