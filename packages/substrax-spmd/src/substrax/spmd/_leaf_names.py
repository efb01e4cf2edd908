"""Leaves as error messages name them: by key path (or as the batch itself), with their shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from ._errors import BatchSplitError


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


def check_leading_rows(
    batch: Any,  # noqa: ANN401  (any pytree)
    parts: int,
    fits: Callable[[int], bool],
    problem: Callable[[tuple[int, ...]], str],
) -> None:
    """Refuse ``batch`` unless every leaf has a leading dimension that ``fits``.

    Only shapes are read (:func:`leaf_shapes`), so the compiled step and :meth:`TrainStep.cost`
    run the same check.

    Raises:
        BatchSplitError: The first leaf that is a scalar or whose leading dimension does not
            fit, named by its key path; the message goes on with ``problem(shape)``.
    """
    for path, shape in leaf_shapes(batch):
        if not shape or not fits(shape[0]):
            message = f"{leaf_name(path)} of shape {shape} {problem(shape)}"
            raise BatchSplitError(message, path=path, shape=shape, parts=parts)


def check_has_rows(batch: Any, *, stacked: bool = False) -> None:  # noqa: ANN401  (any pytree)
    """Refuse a batch with a leaf of 0 rows (axis 0; axis 1 of a ``stacked`` one).

    A train step on no rows has a NaN mean loss, and its update would still be applied.

    Raises:
        ValueError: Naming the first such leaf and its shape.
    """
    axis = 1 if stacked else 0
    if all(getattr(x, "shape", (1, 1))[axis : axis + 1] != (0,) for x in jax.tree.leaves(batch)):
        return
    for path, shape in leaf_shapes(batch):
        if shape[axis : axis + 1] == (0,):
            msg = (
                f"{leaf_name(path)} of shape {shape} has no rows: a train step on an empty "
                "batch has a NaN loss and would still apply its update; skip empty batches "
                "(or drop the loader's empty last batch)"
            )
            raise ValueError(msg)
