"""Leaves as error messages name them: by key path (or as the batch itself), with their shapes."""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx


def leaf_name(path: tuple[Any, ...] | str) -> str:
    """``"batch leaf ['x']"`` for a leaf at ``path``; ``"the batch"`` for a batch that is one array.

    ``path`` is a key path or the ``jax.tree_util.keystr`` of one.
    """
    where = path if isinstance(path, str) else jax.tree_util.keystr(path)
    return f"batch leaf {where}" if where else "the batch"


def _shape(leaf: Any) -> tuple[int, ...]:  # noqa: ANN401  (a Variable or an array-like)
    value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
    return tuple(getattr(value, "shape", ()))


def leaf_shapes(tree: Any) -> list[tuple[str, tuple[int, ...]]]:  # noqa: ANN401  (any pytree)
    """Each leaf's ``keystr`` path and shape, in order; an ``nnx.Variable`` counts as one leaf.

    Only shapes are read, so arrays, tracers and ``ShapeDtypeStruct`` all work.
    """
    leaves = jax.tree_util.tree_leaves_with_path(
        tree, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    return [(jax.tree_util.keystr(path), _shape(leaf)) for path, leaf in leaves]
