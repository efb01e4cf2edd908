"""Several train steps in one dispatch: a ``lax.scan`` over batches stacked on a leading axis."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from substrax.typing import PyTree

from ._errors import BatchSplitError
from ._leaf_names import leaf_name, leaf_shapes
from ._update import PureStep


def stacked_sharding(batch_sharding: PyTree) -> PyTree:
    """The sharding of ``k`` batches stacked on a new leading axis: that axis is not split.

    Each ``NamedSharding`` in the prefix tree ``batch_sharding`` gains a leading ``None`` in
    its partition spec, so the data axis still splits each batch's rows.
    """

    def stack(sharding: PyTree) -> PyTree:
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))
        return sharding

    return jax.tree.map(stack, batch_sharding, is_leaf=lambda x: isinstance(x, NamedSharding))


def check_stacked(batches: PyTree, steps: int) -> None:
    """Refuse ``batches`` unless every leaf stacks ``steps`` batches on its leading axis.

    Only shapes are read, so arrays, tracers and ``ShapeDtypeStruct`` all work; the compiled
    step and :meth:`TrainStep.cost` run this same check.

    Raises:
        BatchSplitError: A leaf whose leading dimension is not ``steps``, named by its path.
    """
    for path, shape in leaf_shapes(batches):
        if not shape or shape[0] != steps:
            raise BatchSplitError(
                f"{leaf_name(path)} of shape {shape} does not hold "
                f"steps_per_call={steps} batches; stack {steps} batches on a new leading axis "
                f"(e.g. np.stack) so that every leaf has shape ({steps}, batch, ...)",
                path=path,
                shape=shape,
                parts=steps,
            )


def repeat_steps(update: PureStep, steps: int) -> PureStep:
    """Run ``update`` over ``steps`` batches stacked on a leading axis, in one ``lax.scan``.

    The outputs (losses, aux) come back stacked, one row per step.

    Raises:
        BatchSplitError: A leaf whose leading dimension is not ``steps``, named by its path.
    """

    def many(leaves: list[Any], batches: PyTree) -> tuple[list[Any], PyTree]:
        check_stacked(batches, steps)
        return jax.lax.scan(update, leaves, batches)

    return many
