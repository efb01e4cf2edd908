"""A compiled evaluation step: metrics of a model on a batch, no update, no donation.

The metrics are means over the global batch. Under data-parallel sharding each device holds
some rows; the mean is one program over the sharded batch, so XLA reduces across devices and
every device (and process) gets the same value, equal to the mean computed on one device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from substrax.support import check_array_variables
from substrax.typing import PyTree

from ._batch_rules import BatchRules
from ._precision import PrecisionPolicy
from ._row_weights import check_mask_key, row_weights
from ._step_state import mesh_of, reordered_onto
from ._train_step import TrainStep
from ._trained_by import check_current


def _weighted(metric: jax.Array, *, count: float) -> np.ndarray[Any, Any]:
    return np.asarray(metric, np.float64) * count


def _rows(batch: PyTree) -> int:
    """The rows of a placed batch: the leading dimension its non-scalar leaves share (global).

    A scalar leaf (a count such as ``n_valid``) has no rows and is passed over; leaves that
    disagree are refused, since the mean would be weighted by a count that is not the batch's.
    """
    rows: dict[int, str] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
        if shape := getattr(leaf, "shape", ()):
            rows.setdefault(int(shape[0]), jax.tree_util.keystr(path) or "the batch")
    if not rows:
        raise ValueError("evaluate needs batches with a leaf that has a leading (row) dimension")
    if len(rows) > 1:
        seen = ", ".join(f"{name} has {count}" for count, name in rows.items())
        msg = (
            f"evaluate weights each batch by its rows, but the batch's leaves disagree on their "
            f"leading dimension ({seen}); give every array leaf the batch's rows first, and pass "
            "a value shared by all rows (class weights, say) through metric_fn, not in the batch"
        )
        raise ValueError(msg)
    return next(iter(rows))


def _masked_mean(metric: jax.Array, *, weights: jax.Array, key: str) -> jax.Array:
    """``metric``'s mean over the rows ``weights`` counts; a scalar (reduced already) as it is."""
    metric = jnp.asarray(metric)
    if metric.ndim == 0:
        return metric
    if metric.shape[0] != weights.shape[0]:
        raise ValueError(
            f"EvalStep(mask={key!r}): a metric of shape {metric.shape} has no row per mask "
            f"entry (the mask has {weights.shape[0]}); give the mask one weight per row of the "
            "batch, and return per-row values (leading dimension the rows) or a scalar"
        )
    per_row = weights.reshape(weights.shape + (1,) * (metric.ndim - 1))
    total = jnp.sum(metric.astype(jnp.float32) * per_row)
    mean = total / (jnp.sum(weights) * (metric.size // metric.shape[0]))
    return mean.astype(metric.dtype) if jnp.issubdtype(metric.dtype, jnp.floating) else mean


class EvalStep[M: nnx.Module]:
    """A compiled evaluation step: ``metric_fn(model, batch)`` reduced to global means.

    ``metric_fn`` returns a pytree (usually a dict) of arrays: per-example values (such as
    ``argmax(logits) == labels``) or scalars. Each leaf is averaged over all its elements inside
    the compiled step, so with a batch sharded over a data axis the result is the mean over the
    global batch, reduced across devices, and replicated. The model's state is read on each call
    (never donated, never updated); the step compiles once per batch shape.

    Args:
        model: The model, or a :class:`TrainStep` whose current state is evaluated (without a
            sync) on each call.
        metric_fn: ``(model, batch) -> pytree of arrays``.
        mesh: The mesh; taken from the state's shardings when None. A batch sharding or a
            batch array over its devices in another order takes its spec on it, as for
            :class:`TrainStep` (jax runs a call over one device order); so does a state array
            given ``mesh=`` (read and moved at each call: build the model on ``mesh``).
        batch_sharding: Where every batch goes, as for :class:`TrainStep` and by the same
            code: a host batch is placed on it, a ``jax.Array`` batch already there is kept
            and one elsewhere is resharded, and a batch it cannot split (a 12-row batch on an
            8-way data axis) is refused with :class:`~substrax.spmd.BatchPlacementError`,
            naming the leaf. A ``PartitionSpec`` is taken on the mesh. Taken from a
            :class:`TrainStep` given as ``model`` when None (one batch's, with its
            ``steps_per_call``), so that each process's rows make one global batch, and then
            fitted to each eval batch: a part of the train step's prefix that the batch lacks
            is ignored, a leaf no part covers takes the prefix's split of the leading (row)
            dimension (the first such split in it; replicated if it has none), and a 0-d leaf
            is replicated (on several processes it must be the same on each). A batch the data
            axis does not divide (a last batch of 12 rows on 8 ways) is still refused: pad it
            (and give ``mask``, so the padding counts for nothing), drop the remainder, or pass ``batch_sharding`` here, e.g. ``NamedSharding(mesh,
            PartitionSpec())`` to take each batch replicated (whole on every process). A
            ``batch_sharding`` passed here is applied as given.
        precision: A :class:`PrecisionPolicy`: the model's floating state is cast to its
            compute dtype and its layers compute in it, metrics come out in its output dtype.
            Taken from a :class:`TrainStep` given as ``model`` when None.
        eval_mode: Run the model in evaluation mode (``Module.eval()``: dropout off, batch
            norm on its running averages) inside the step; the model object is not changed.
        mask: The key (in a mapping batch) of per-row weights: 1 for a row that counts, 0 for
            padding (a last batch padded to what the data axis divides). A metric leaf whose
            leading dimension is the batch's rows is read per row and averaged over the rows
            the weights count (NaN on a batch they count none of; :meth:`evaluate` skips it);
            :meth:`evaluate` weights each batch by the weights' sum. A scalar leaf is taken as
            it is: reduce it over the counted rows yourself (``jnp.sum(x * m) / jnp.sum(m)``),
            or padded rows count in it. A batch without the key is refused, naming it.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from substrax.spmd import EvalStep
        >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        >>> def metrics(m, b):
        ...     return {"mse": (m(b["x"]) - b["y"]) ** 2, "zero": jnp.zeros(())}
        >>> evaluate = EvalStep(model, metrics)
        >>> batch = {"x": jnp.zeros((4, 2)), "y": jnp.ones((4, 1))}
        >>> {k: float(v) for k, v in evaluate(batch).items()}
        {'mse': 1.0, 'zero': 0.0}
        >>> evaluate.evaluate([batch, batch])
        {'mse': 1.0, 'zero': 0.0}
    """

    def __init__(
        self,
        model: M | TrainStep[M],
        metric_fn: Callable[[M, Any], PyTree],
        *,
        mesh: Mesh | None = None,
        batch_sharding: Sharding | PyTree | None = None,
        precision: PrecisionPolicy | None = None,
        eval_mode: bool = True,
        mask: str | None = None,
    ) -> None:
        check_mask_key("EvalStep", mask)
        self._source = model
        self._mask = mask
        # a TrainStep's own model object, unsynced: syncing would make every step write back
        module = model._model if isinstance(model, TrainStep) else model  # pyright: ignore[reportPrivateUsage]
        graphdef = nnx.graphdef(module)
        inherited = isinstance(model, TrainStep) and batch_sharding is None
        if isinstance(model, TrainStep):
            mesh = model.mesh if mesh is None else mesh
            precision = model.precision if precision is None else precision
            if batch_sharding is None:  # its batches take the train step's path
                batch_sharding = model.batch_sharding
        # a model given with mesh= is read each call, and taken onto it from another order
        self._reorder = mesh is not None and not (
            isinstance(model, TrainStep) and mesh is model.mesh
        )
        if mesh is not None:  # without a mesh jax.jit takes a Variable's jax.Ref
            check_array_variables(nnx.state(module), "EvalStep with a mesh", hijax=False)
        self._mesh = mesh
        runs_on = mesh
        if mesh is None and not isinstance(model, TrainStep):
            runs_on = mesh_of(jax.tree.leaves(nnx.state(module)))
        self._batches = BatchRules.build(batch_sharding, runs_on, inherited=inherited)

        def pure(state: PyTree, batch: PyTree) -> PyTree:
            if precision is not None:
                state = precision.cast_to_compute(state)
            model = nnx.merge(graphdef, state)
            if precision is not None:
                precision.set_compute_dtype(model)
            if eval_mode:
                model.eval()
            metrics = metric_fn(model, batch)
            if precision is not None:  # before the mean: a bfloat16 mean keeps 3 digits
                metrics = precision.cast_to_output(metrics)
            if mask is None:
                return jax.tree.map(jnp.mean, metrics)
            weights = row_weights(batch, mask, "EvalStep")
            mean = partial(_masked_mean, weights=weights, key=mask)
            return jax.tree.map(mean, metrics), jnp.sum(weights)

        if mesh is None:
            self._jitted = jax.jit(pure)
        else:  # every device (and process) gets the whole reduced value
            self._jitted = jax.jit(pure, out_shardings=NamedSharding(mesh, PartitionSpec()))

    @property
    def jitted(self) -> PyTree:
        """The underlying ``jax.jit`` function ``(model_state, batch) -> metrics`` (with ``mask``: ``(metrics, weight sum)``)."""
        return self._jitted

    def _state(self) -> PyTree:
        if isinstance(self._source, TrainStep):
            state = self._source.state[0]
        else:
            check_current(self._source, None, "an EvalStep")
            state = nnx.state(self._source)
        if self._reorder and self._mesh is not None:
            return reordered_onto(state, self._mesh)
        return state

    def __call__(self, batch: PyTree) -> PyTree:
        """The metrics on ``batch``, each a replicated scalar: its mean over the global batch.

        Raises:
            BatchPlacementError: A leaf that ``batch_sharding`` cannot split, named by its path.
        """
        out = self._run(self._batches.place(batch))
        return out if self._mask is None else out[0]

    def _run(self, batch: PyTree) -> PyTree:
        if self._mesh is None:
            return self._jitted(self._state(), batch)
        with jax.set_mesh(self._mesh):
            return self._jitted(self._state(), batch)

    def evaluate(self, batches: Iterable[PyTree]) -> PyTree:
        """The metrics over several batches, each batch weighted by its number of rows.

        The result is the mean over every row of every batch (for per-example metrics; with
        ``mask``, over the rows it counts), as Python floats in the structure ``metric_fn``
        returns. A batch's rows are the leading
        dimension its non-scalar leaves share, counted once the batch is placed (the global count
        on every process). An empty batch (0 rows, such as a last batch a loader left empty) adds
        nothing and is skipped without being run: its mean would be NaN.

        Raises:
            ValueError: If ``batches`` holds no batch with rows, a batch whose leaves are all
                scalars, or one whose array leaves disagree on their leading dimension.
            BatchPlacementError: A leaf that ``batch_sharding`` cannot split.

        Example:
            >>> import numpy as np
            >>> from flax import nnx
            >>> from substrax.spmd import EvalStep
            >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
            >>> evaluate = EvalStep(model, lambda m, b: {"mse": (m(b["x"]) - b["y"]) ** 2})
            >>> rows = {"x": np.zeros((4, 2), np.float32), "y": np.ones((4, 1), np.float32)}
            >>> empty = {"x": np.zeros((0, 2), np.float32), "y": np.ones((0, 1), np.float32)}
            >>> evaluate.evaluate([rows, empty])  # the empty batch is skipped, not a NaN
            {'mse': 1.0}
        """
        total: PyTree = None
        rows = 0.0
        seen = False
        for batch in batches:
            seen = True
            placed = self._batches.place(batch)
            count: float = _rows(placed)
            if count == 0:
                continue
            metrics = self._run(placed)
            if self._mask is not None:  # weighted by the rows the mask counts
                metrics, count = metrics[0], float(metrics[1])
                if count == 0:
                    continue
            metrics = jax.tree.map(partial(_weighted, count=count), metrics)
            total = metrics if total is None else jax.tree.map(np.add, total, metrics)
            rows += count
        if total is None:
            what = "only empty batches (0 rows, or a mask counting none)" if seen else "no batches"
            msg = f"evaluate got {what}; give at least one batch with rows"
            raise ValueError(msg)
        return jax.tree.map(lambda x: float(x / rows), total)
