"""How error messages name a batch leaf: by its key path, or as the batch itself."""

from __future__ import annotations

from typing import Any

import jax


def leaf_name(path: tuple[Any, ...] | str) -> str:
    """``"batch leaf ['x']"`` for a leaf at ``path``; ``"the batch"`` for a batch that is one array.

    ``path`` is a key path or the ``jax.tree_util.keystr`` of one.
    """
    where = path if isinstance(path, str) else jax.tree_util.keystr(path)
    return f"batch leaf {where}" if where else "the batch"
