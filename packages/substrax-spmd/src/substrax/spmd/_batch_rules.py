"""The one path every batch of a compiled step takes: placement on its sharding, loop checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from substrax.typing import PyTree

from ._accumulate import check_microbatches
from ._device_order import batch_leaf_onto, batch_on_mesh, in_other_order
from ._errors import BatchPlacementError
from ._leaf_names import leaf_name
from ._multi_step import check_stacked, stacked_sharding
from ._placement import place_batch_on_shards, resolve_batch_sharding


_INHERITED_FIX = (
    "; or, as this EvalStep took its batch_sharding from its TrainStep, pass "
    "EvalStep(..., batch_sharding=...) explicitly (NamedSharding(mesh, PartitionSpec()) takes "
    "each batch replicated: on several processes, each passes the whole batch)"
)


def _unsplit(shard: Sharding) -> Sharding:
    """``shard`` splitting nothing: a ``NamedSharding`` replicated on its mesh, else as is."""
    if isinstance(shard, NamedSharding):
        return NamedSharding(shard.mesh, PartitionSpec())
    return shard


def _leading_split(shardings: list[Sharding]) -> Sharding:
    """The first split of a leading (row) dimension among ``shardings``, else none."""
    for shard in shardings:
        if isinstance(shard, NamedSharding) and shard.spec and shard.spec[0] is not None:
            return NamedSharding(shard.mesh, PartitionSpec(shard.spec[0]))
    return _unsplit(shardings[0])


def fit_inherited(batch: PyTree, sharding: Sharding | PyTree) -> PyTree:
    """A sharding for each leaf of ``batch`` (a tree of its structure) from a train step's prefix.

    A leaf takes the sharding of the part of the prefix that covers it; a leaf none covers
    takes the prefix's split of the leading dimension (that of the first sharding in it that
    splits dimension 0, replicated if none does); a 0-d leaf is replicated. Parts of the prefix
    that ``batch`` lacks are ignored. An empty prefix is returned as it is.
    """
    covers: list[tuple[tuple[Any, ...], Sharding]] = list(
        jax.tree_util.tree_leaves_with_path(sharding, is_leaf=lambda x: isinstance(x, Sharding))
    )
    if not covers:
        return sharding
    rows = _leading_split([shard for _, shard in covers])

    def choose(path: tuple[Any, ...], leaf: object) -> Sharding:
        shard = next((s for p, s in covers if path[: len(p)] == p), rows)
        return _unsplit(shard) if getattr(leaf, "shape", None) == () else shard

    # a None in the batch is a leaf here, so that its part of the tree is a sharding too
    return jax.tree_util.tree_map_with_path(choose, batch, is_leaf=lambda x: x is None)


def _one_of_stack(x: PyTree) -> PyTree:
    """One batch of a stack, as shapes: what each step of a ``steps_per_call`` scan sees."""
    dtype = x.dtype if hasattr(x, "dtype") else np.result_type(x)
    return jax.ShapeDtypeStruct(tuple(np.shape(x))[1:], dtype)


def _moved(batch: PyTree, moves: list[tuple[int, Sharding]]) -> PyTree:
    """``batch`` with its leaf number ``i`` put on ``target`` for each ``(i, target)``."""
    leaves, treedef = jax.tree.flatten(batch)
    placed = jax.device_put([leaves[i] for i, _ in moves], [target for _, target in moves])
    for (i, _), array in zip(moves, placed, strict=True):
        leaves[i] = array
    return jax.tree.unflatten(treedef, leaves)


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
        inherited: Whether ``sharding`` is another step's, fitted to each batch
            (:func:`fit_inherited`) rather than required of it.
        mesh: The step's mesh: without ``sharding``, a ``jax.Array`` leaf over its devices in
            another order is put on it with its spec (a compiled call runs on one order).
    """

    sharding: Sharding | PyTree | None
    one_batch: Sharding | PyTree | None = None
    accumulate_steps: int = 1
    steps_per_call: int = 1
    inherited: bool = False
    mesh: Mesh | None = None

    @classmethod
    def build(
        cls,
        batch_sharding: Sharding | PyTree | None,
        mesh: Mesh | None,
        *,
        accumulate_steps: int = 1,
        steps_per_call: int = 1,
        inherited: bool = False,
    ) -> BatchRules:
        """Resolve ``batch_sharding`` (a ``PartitionSpec`` on ``mesh``; stacked for several steps).

        A ``NamedSharding`` over ``mesh``'s devices in another order is taken with its spec on
        ``mesh`` (a compiled call runs over one order of devices).

        Raises:
            TypeError: A ``PartitionSpec`` without a mesh, or a leaf that is not a sharding.
            ValueError: A sharding over ``mesh``'s devices in another order whose spec names
                an axis ``mesh`` lacks (both orders named).
        """
        sharding = one_batch = None
        if batch_sharding is not None:
            sharding = one_batch = resolve_batch_sharding(batch_sharding, mesh)
            if mesh is not None:
                sharding = one_batch = batch_on_mesh(sharding, mesh)
            if steps_per_call != 1:
                sharding = stacked_sharding(sharding)
        loops: dict[str, Any] = {
            "accumulate_steps": accumulate_steps,
            "steps_per_call": steps_per_call,
        }
        return cls(sharding=sharding, one_batch=one_batch, inherited=inherited, mesh=mesh, **loops)

    def place(self, batch: PyTree) -> PyTree:
        """``batch`` with every array leaf on its sharding (checked against it), or as given.

        With ``steps_per_call`` above 1 the stack is checked first, so a batch given unstacked
        is refused as such, not for the rows of its stacked axis. An ``inherited`` sharding is
        fitted to the batch first (:func:`fit_inherited`). Without a sharding, a ``jax.Array``
        leaf over the step's devices in another order is put on the step's mesh with its spec.

        Raises:
            BatchSplitError: With ``steps_per_call=k``, a leaf that does not stack ``k``
                batches, named by its path.
            BatchPlacementError: A leaf its sharding cannot split, named by its path (for an
                ``inherited`` sharding, with how to pass another); without a sharding, a leaf
                over the step's devices in another order whose spec the step's mesh cannot take.
            TypeError: A text leaf (``"split": "train"``), which no compiled step takes.
        """
        mesh = self.mesh if self.sharding is None else None  # a sharding places every leaf
        reordered: list[tuple[int, Sharding]] = []
        for i, (path, leaf) in enumerate(jax.tree_util.tree_leaves_with_path(batch)):
            if mesh is not None and isinstance(leaf, jax.Array):
                if in_other_order(leaf.sharding, mesh):  # `is` on the mesh before anything
                    reordered.append((i, batch_leaf_onto(path, leaf, mesh)))
            elif isinstance(leaf, str | bytes):
                raise TypeError(
                    f"{leaf_name(path)} is the {type(leaf).__name__} {leaf!r:.40}; a compiled "
                    "step takes arrays and numbers only: leave it out of the batch (or let "
                    "the loss or metric function close over it)"
                )
        if self.steps_per_call != 1:
            check_stacked(batch, self.steps_per_call)
        if reordered:
            batch = _moved(batch, reordered)
        if self.sharding is None:
            return batch
        if not self.inherited:
            return place_batch_on_shards(batch, self.sharding)
        try:
            return place_batch_on_shards(batch, fit_inherited(batch, self.sharding))
        except BatchPlacementError as error:
            raise BatchPlacementError(
                error.message + _INHERITED_FIX, path=error.path, shape=error.shape, spec=error.spec
            ) from None

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
