"""The one path every batch of a compiled step takes: placement on its sharding, loop checks."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, Sharding

from substrax.typing import PyTree

from ._accumulate import check_microbatches
from ._multi_step import check_stacked, stacked_sharding
from ._placement import place_batch_on_shards, resolve_batch_sharding


def _one_of_stack(x: PyTree) -> PyTree:
    """One batch of a stack, as shapes: what each step of a ``steps_per_call`` scan sees."""
    dtype = x.dtype if hasattr(x, "dtype") else np.result_type(x)
    return jax.ShapeDtypeStruct(tuple(np.shape(x))[1:], dtype)


@dataclass(frozen=True, kw_only=True)
class BatchRules:
    """What a step requires of every batch: where it goes and how its loops split it.

    :class:`~substrax.spmd.TrainStep` and :class:`~substrax.spmd.EvalStep` place every batch
    with :meth:`place` (a ``jax.Array`` batch as much as a host one, so a batch the data axis
    does not divide is refused either way), and ``TrainStep.cost`` runs :meth:`check_loops`, the
    checks the compiled loops run when traced.

    Attributes:
        sharding: The resolved batch sharding (a pytree prefix of shardings; with
            ``steps_per_call`` above 1, that of the stack), or None to leave batches as given.
        one_batch: The resolved sharding of one batch (``sharding`` but for the stack).
        accumulate_steps: Microbatches per optimizer step.
        steps_per_call: Optimizer steps per call, on batches stacked on a leading axis.
    """

    sharding: Sharding | PyTree | None
    one_batch: Sharding | PyTree | None = None
    accumulate_steps: int = 1
    steps_per_call: int = 1

    @classmethod
    def build(
        cls,
        batch_sharding: Sharding | PyTree | None,
        mesh: Mesh | None,
        *,
        accumulate_steps: int = 1,
        steps_per_call: int = 1,
    ) -> BatchRules:
        """Resolve ``batch_sharding`` (a ``PartitionSpec`` on ``mesh``; stacked for several steps).

        Raises:
            TypeError: A ``PartitionSpec`` without a mesh, or a leaf that is not a sharding.
        """
        sharding = one_batch = None
        if batch_sharding is not None:
            sharding = one_batch = resolve_batch_sharding(batch_sharding, mesh)
            if steps_per_call != 1:
                sharding = stacked_sharding(sharding)
        return cls(
            sharding=sharding,
            one_batch=one_batch,
            accumulate_steps=accumulate_steps,
            steps_per_call=steps_per_call,
        )

    def place(self, batch: PyTree) -> PyTree:
        """``batch`` with every array leaf on its sharding (checked against it), or as given.

        With ``steps_per_call`` above 1 the stack is checked first, so a batch given unstacked
        is refused as such, not for the rows of its stacked axis.

        Raises:
            BatchSplitError: With ``steps_per_call=k``, a leaf that does not stack ``k``
                batches, named by its path.
            BatchPlacementError: A leaf its sharding cannot split, named by its path.
        """
        if self.steps_per_call != 1:
            check_stacked(batch, self.steps_per_call)
        if self.sharding is None:
            return batch
        return place_batch_on_shards(batch, self.sharding)

    def check_loops(self, batch: PyTree) -> None:
        """Run the checks of the step's loops on ``batch`` (only its shapes are read).

        Raises:
            BatchSplitError: A leaf that does not stack ``steps_per_call`` batches, or whose
                batch ``accumulate_steps`` does not divide, named by its path.
        """
        if self.steps_per_call != 1:
            check_stacked(batch, self.steps_per_call)
            batch = jax.tree.map(_one_of_stack, batch)
        if self.accumulate_steps != 1:
            check_microbatches(batch, self.accumulate_steps)
