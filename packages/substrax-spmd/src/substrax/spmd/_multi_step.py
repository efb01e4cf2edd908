"""Several train steps in one dispatch: a ``lax.scan`` over batches stacked on a leading axis."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from substrax.typing import PyTree

from ._leaf_names import check_leading_rows
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

    The compiled step and :meth:`TrainStep.cost` run this same check (on shapes only).

    Raises:
        BatchSplitError: A leaf whose leading dimension is not ``steps``, named by its path.
    """
    check_leading_rows(
        batches,
        steps,
        lambda rows: rows == steps,
        lambda _: (
            f"does not hold steps_per_call={steps} batches; stack {steps} batches on a new "
            f"leading axis (e.g. np.stack) so that every leaf has shape ({steps}, batch, ...)"
        ),
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
