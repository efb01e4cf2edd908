"""A train step at hand-written ``jax.jit`` speed: one pure compiled call over split nnx state."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import jax
from flax import nnx
from jax.sharding import Mesh, Sharding

from substrax.support import check_array_variables
from substrax.typing import PyTree

from ._batch_rules import BatchRules
from ._consistency import check_loss_output, check_optimizer_matches
from ._cost import StepCost, abstract, count_program_flops, read_bytes
from ._features import with_loop_features
from ._leaf_names import check_has_rows
from ._live_graph import LiveGraph, check_layout_kept, variable_layout
from ._step_state import StateVariables, place_state, sharding_mesh
from ._trained_by import check_current, ran_on


if TYPE_CHECKING:
    from ._precision import PrecisionPolicy


class TrainStep[M: nnx.Module]:
    """A compiled train step over a model and its optimizer, as fast as hand-written ``jax.jit``.

    The model and optimizer are split once (``nnx.split``); each call runs ``jax.jit(step,
    donate_argnums=0)`` on the flat list of their arrays (no graph traversal, old buffers
    reused), compiled once per batch shape, its output shardings pinned to the input ones.

    The variables differentiated are the ones ``optimizer`` updates (its ``wrt`` filter). An
    array written into the ``model`` or ``optimizer`` objects at any time (a checkpoint
    restored with ``nnx.update``, a callback lowering an ``optax.inject_hyperparams`` learning
    rate) is taken in, onto the same sharding and dtype, before the next step, by
    :attr:`state` and by an :class:`EvalStep` over the step, without a recompile (a Variable
    holding a pytree of arrays too; variables set to one array get a buffer each). The objects
    passed in are stale after the first step (donated or not) until :meth:`sync` writes the
    state back (the :attr:`model` and :attr:`optimizer` properties sync): an EvalStep or another
    TrainStep reading them is refused with :class:`~substrax.spmd.StateChangedError`. Once
    synced, they stay live: every step writes its new arrays into them. A Variable, submodule
    or optimizer state replaced by a new object, a Variable added, or a plain attribute changed
    (``model.eval()``, a temperature: the program was traced with the old one) is refused so at
    the next call: build a new step then.

    Mistakes are refused early: an optimizer whose state was built for another model
    (:class:`~substrax.spmd.OptimizerMismatchError`), one that line-searches (``TypeError``:
    use :func:`substrax.optim.update_with_line_search`), a ``loss_fn`` output that does not match
    ``has_aux`` (``TypeError`` at the first call), and a batch that ``batch_sharding`` cannot
    split (:class:`~substrax.spmd.BatchPlacementError`, naming the leaf and the sizes).

    Args:
        model: The model.
        optimizer: The ``nnx.Optimizer`` over it.
        loss_fn: ``(model, batch) -> loss``, or ``-> (loss, aux)`` with ``has_aux=True``.
        mesh: The mesh; arrays not yet on it are replicated onto it, and the step runs under
            ``jax.set_mesh(mesh)``. Taken from the state's shardings when None, else from a
            ``NamedSharding`` in ``batch_sharding``. A state array, batch sharding or batch array
            over its devices in another order takes its spec on it (jax runs one device order).
        batch_sharding: Where every batch goes: a sharding or a pytree prefix of them, placed
            with ``place_batch_on_shards`` at each call (a ``jax.Array`` already there is kept,
            one on another sharding is resharded). A ``PartitionSpec`` is taken as
            ``NamedSharding(mesh, spec)``; without a mesh it is refused with a ``TypeError``.
        has_aux: Whether ``loss_fn`` returns ``(loss, aux)``.
        donate: Donate the state buffers (the point of the exercise; turn off to debug).
        accumulate_steps: Split each batch into this many microbatches inside the compiled
            step (a ``lax.scan``) and average their gradients in float32: one update, the same
            as on the whole batch for a mean over as many rows in each microbatch (a masked
            mean: give ``mask``), with one microbatch's activations in memory. Every batch leaf
            is split by rows, so its leading dimension must be a multiple of it
            (:class:`~substrax.spmd.BatchSplitError` names the leaf otherwise). The loss and
            each aux leaf are averaged over the microbatches, element by element: right for a
            mean, not a count or a maximum, nor a per-example aux (reduce it in ``loss_fn``).
        mask: With ``accumulate_steps``, the key (in a mapping batch) of the mask the loss's
            mean is over: ``(rows,)``, or ``(rows, tokens)`` for padded tokens. Each
            microbatch's loss, aux and gradients are weighted by what it counts, so a masked
            mean is the whole batch's; a batch counting nothing gives zero gradients.
        steps_per_call: Run this many steps in one call (a ``lax.scan``) on batches stacked on
            a new leading axis; the call returns the per-step losses (and aux) stacked.
            ``batch_sharding`` then describes one batch; the stacked axis is not split.
        precision: A :class:`~substrax.spmd.PrecisionPolicy`: the parameters stay in its
            ``param_dtype``, every layer computes in its ``compute_dtype``; the batch as given.

    :meth:`cost` (and :meth:`flops_per_step`) count what one optimizer step costs per device:
    the matrix FLOPs of the step's program, forward and backward, the figure a
    :class:`~substrax.callbacks.ThroughputMeter` takes for FLOP/s and MFU.

    Example:
        >>> import optax
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from substrax.spmd import TrainStep
        >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
        >>> step = TrainStep(model, optimizer, lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean())
        >>> batch = {"x": jnp.ones((4, 2)), "y": jnp.zeros((4, 1))}
        >>> bool(step(batch) > step(batch))
        True
        >>> int(step.optimizer.step.get_value())
        2
    """

    def __init__(
        self,
        model: M,
        optimizer: nnx.Optimizer[M],
        loss_fn: Callable[[M, Any], Any],
        *,
        mesh: Mesh | None = None,
        batch_sharding: Sharding | PyTree | None = None,
        has_aux: bool = False,
        donate: bool = True,
        accumulate_steps: int = 1,
        steps_per_call: int = 1,
        precision: PrecisionPolicy | None = None,
        mask: str | None = None,
    ) -> None:
        check_current(model, None, "a TrainStep")  # not arrays another step donated
        check_optimizer_matches(model, optimizer)
        self._model = model
        self._optimizer = optimizer
        self._has_aux = has_aux
        check_array_variables(nnx.state(model), "TrainStep")
        check_array_variables(nnx.state(optimizer), "TrainStep (its optimizer)")
        graphdef, state = nnx.split((model, optimizer))
        # the live Variables of both objects (nnx.split keeps them), where a restore is read
        self._variables = StateVariables(state)
        self._graph = LiveGraph((model, optimizer), self._variables.variables)
        layout = variable_layout(state)
        flat, treedef = jax.tree_util.tree_flatten_with_path(state)
        leaves, mesh, metric_sharding = place_state(  # paths: to name leaves left unsplit
            [x for _, x in flat], mesh, sharding_mesh(batch_sharding), paths=[p for p, _ in flat]
        )
        self._mesh = mesh
        self._batches = BatchRules.build(
            batch_sharding, mesh, accumulate_steps=accumulate_steps, steps_per_call=steps_per_call
        )
        self._leaves: list[Any] = leaves
        self._treedef = treedef
        self._live = self._synced = False
        self._write_back()
        shardings = [x.sharding for x in leaves]
        wrt = optimizer.wrt  # what the optimizer updates is what is differentiated

        def pure(leaves: list[PyTree], batch: PyTree) -> tuple[list[PyTree], PyTree]:
            model, optimizer = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))

            def checked_loss(m: M) -> Any:  # noqa: ANN401  (a loss, or (loss, aux))
                out = loss_fn(m, batch)
                check_loss_output(out, has_aux=has_aux)
                return out

            grad_fn = nnx.value_and_grad(
                checked_loss, argnums=nnx.DiffState(0, wrt), has_aux=has_aux
            )
            out, grads = grad_fn(model)
            optimizer.update(model, grads)
            new = nnx.state((model, optimizer))
            check_layout_kept(layout, new)  # a sow left in the model, named
            return jax.tree.leaves(new), out

        loops = functools.partial(
            with_loop_features,
            pure,
            graphdef=graphdef,
            treedef=treedef,
            loss_fn=loss_fn,
            has_aux=has_aux,
            optimizer=optimizer,
            model=model,
            precision=precision,
            mask=mask,
        )
        step = loops(accumulate_steps=accumulate_steps, steps_per_call=steps_per_call)
        self._jitted = jax.jit(
            step,
            donate_argnums=(0,) if donate else (),
            out_shardings=(shardings, metric_sharding),
        )
        self._accumulate_steps = accumulate_steps
        self._steps_per_call = steps_per_call
        self._precision = precision
        self._costs: dict[Any, StepCost] = {}
        self._reference: Any = self._jitted
        if accumulate_steps != 1 or steps_per_call != 1:
            # one optimizer step on one whole batch, without the loops: XLA's cost analysis
            # (the bytes accessed) counts a loop's body once, whatever its trip count
            one = loops(accumulate_steps=1, steps_per_call=1)
            self._reference = jax.jit(one, out_shardings=(shardings, metric_sharding))

    @property
    def jitted(self) -> PyTree:
        """The underlying ``jax.jit`` function ``(state_leaves, batch) -> (state_leaves, out)``."""
        return self._jitted

    @property
    def mesh(self) -> Mesh | None:
        """The mesh the step runs on, if any."""
        return self._mesh

    @property
    def batch_sharding(self) -> Sharding | PyTree | None:
        """Where each batch is placed (one batch's, with ``steps_per_call``), or None.

        A ``PartitionSpec`` given is a ``NamedSharding`` here; an :class:`EvalStep` takes it.
        """
        return self._batches.one_batch

    @property
    def precision(self) -> PrecisionPolicy | None:
        """The step's precision policy, if any (an :class:`EvalStep` over the step takes it)."""
        return self._precision

    def __call__(self, batch: PyTree) -> PyTree:
        """Run one step on ``batch``; returns the loss (or ``(loss, aux)``), before the update."""
        batch = self._batches.place(batch)
        check_has_rows(batch, stacked=self._steps_per_call != 1)
        self._read_back(call=True)
        if self._mesh is None:
            self._leaves, out = self._jitted(self._leaves, batch)
        else:
            with jax.set_mesh(self._mesh):
                self._leaves, out = self._jitted(self._leaves, batch)
        self._synced = False
        if self._live:
            self._write_back()
        ran_on(self._model, self, current=self._synced)
        return out

    def cost(self, batch: PyTree) -> StepCost:
        """What one optimizer step on ``batch`` costs per device: matrix FLOPs and bytes.

        ``batch`` is a batch as this step is called with (only its shapes, dtypes and placement
        are read; a host batch is placed on ``batch_sharding`` as a call would). The FLOPs are
        the matmuls, convolutions and fused attention of the step's own program, forward and
        backward, counted from its jaxpr (the same on every backend; a GPU's cuBLAS calls are
        counted) and divided over the mesh's devices. They are per optimizer step: with
        ``accumulate_steps=N`` all N microbatches and the one update; with
        ``steps_per_call=k`` one k-th of a call. Where they cannot be counted (an opaque
        kernel, a while loop that multiplies) ``flops`` is None and ``flops_reason`` says why.
        ``bytes_accessed`` is XLA's cost analysis of the compiled program for one device
        (read from the step compiled without its loops on one whole batch when it has them,
        since XLA counts a loop's body once: an extra compilation, no run), once per batch
        signature. The batch is checked as a call checks it: one it would refuse is refused.

        Raises:
            BatchPlacementError: A leaf that ``batch_sharding`` cannot split.
            BatchSplitError: With ``steps_per_call=k``, a leaf that does not stack ``k``
                batches; with ``accumulate_steps=N``, a batch whose leading dimension ``N``
                does not divide (the leaf is named either way).

        Example:
            >>> import optax
            >>> import jax.numpy as jnp
            >>> from flax import nnx
            >>> from substrax.spmd import TrainStep
            >>> model = nnx.Linear(16, 4, rngs=nnx.Rngs(0))
            >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
            >>> step = TrainStep(model, optimizer, lambda m, b: (m(b) ** 2).mean())
            >>> cost = step.cost(jnp.ones((32, 16)))
            >>> cost.flops, cost.devices  # forward and the kernel's gradient: 2 * 2*32*16*4
            (8192.0, 1)
        """
        batch = self._batches.place(batch)
        self._batches.check_loops(batch)
        whole = jax.tree.map(abstract, batch)
        leaves, structure = jax.tree.flatten(whole)
        key = (structure, tuple(leaves))
        cached = self._costs.get(key)
        if cached is not None:
            return cached
        state = [abstract(x) for x in self._leaves]
        devices = 1 if self._mesh is None else self._mesh.size
        counted = count_program_flops(self._jitted, (state, whole), mesh=self._mesh)
        if self._steps_per_call != 1:
            whole = jax.tree.map(lambda x: abstract(x, unstack=True), batch)
        flops = None if counted.flops is None else counted.flops / (devices * self._steps_per_call)
        cost = StepCost(
            flops=flops,
            flops_reason=counted.reason,
            bytes_accessed=read_bytes(self._reference, (state, whole), mesh=self._mesh),
            devices=devices,
            accumulate_steps=self._accumulate_steps,
            steps_per_call=self._steps_per_call,
        )
        self._costs[key] = cost
        return cost

    def flops_per_step(self, batch: PyTree) -> float | None:
        """``cost(batch).flops``: one device's FLOPs per optimizer step, as ThroughputMeter takes.

        Example:
            >>> import optax
            >>> import jax.numpy as jnp
            >>> from flax import nnx
            >>> from substrax.spmd import TrainStep
            >>> model = nnx.Linear(16, 4, rngs=nnx.Rngs(0))
            >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
            >>> step = TrainStep(model, optimizer, lambda m, b: (m(b) ** 2).mean(), accumulate_steps=4)
            >>> plain = TrainStep(model, optimizer, lambda m, b: (m(b) ** 2).mean())
            >>> step.flops_per_step(jnp.ones((32, 16))) == plain.flops_per_step(jnp.ones((32, 16)))
            True
        """
        return self.cost(batch).flops

    def _read_back(self, *, call: bool = False) -> None:
        """Take the arrays written into the objects since the step last wrote them, placed alike.

        First refuse objects another TrainStep trained since, and objects whose Variables
        changed (:class:`LiveGraph`: a Variable or submodule replaced, one added to a module).
        """
        check_current(self._model, self, "a TrainStep")
        self._graph.check(statics=call)  # a call runs the program traced with the plain values
        self._variables.read_back(self._leaves)

    @property
    def state(self) -> nnx.State[Any, Any]:
        """The current state of ``(model, optimizer)`` as an ``nnx.State`` (no copy).

        Arrays written into the objects since the step last wrote them are taken in first; a
        Variable replaced or added in them is refused, as by a call.
        """
        self._read_back()
        return jax.tree.unflatten(self._treedef, self._leaves)

    def sync(self) -> None:
        """Write the current state back into the model and optimizer objects, and keep them live.

        What was written into the objects since is taken in first. From then on each step
        writes its new state into them after it runs.

        Raises:
            StateChangedError: The objects no longer hold a Variable the step tracks (it or a
                submodule or optimizer state above it was replaced), or hold one it does not
                (added since), named by its path.
        """
        self._graph.check_full()  # a graph walk (milliseconds): sees every Variable added
        self._read_back()
        self._write_back()
        self._live = True
        ran_on(self._model, self, current=True)

    def _write_back(self) -> None:
        if self._synced:
            return
        self._variables.write_back(self._leaves)
        self._synced = True

    @property
    def model(self) -> M:
        """The model, synced with the latest step."""
        self.sync()
        return self._model

    @property
    def optimizer(self) -> nnx.Optimizer[M]:
        """The optimizer, synced with the latest step."""
        self.sync()
        return self._optimizer


class _Options(TypedDict, total=False):
    """The keyword arguments of :class:`TrainStep`, which :func:`make_train_step` passes on."""

    mesh: Mesh | None
    batch_sharding: Sharding | PyTree | None
    has_aux: bool
    donate: bool
    accumulate_steps: int
    steps_per_call: int
    precision: PrecisionPolicy | None
    mask: str | None


def make_train_step[M: nnx.Module](
    model: M,
    optimizer: nnx.Optimizer[M],
    loss_fn: Callable[[M, Any], Any],
    **options: Unpack[_Options],
) -> TrainStep[M]:
    """Build a :class:`TrainStep`; the same arguments.

    Example:
        >>> import optax
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from substrax.spmd import make_train_step
        >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        >>> step = make_train_step(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param),
        ...                        lambda m, b: (m(b) ** 2).mean())
        >>> step(jnp.ones((4, 2))).shape
        ()
    """
    return TrainStep(model, optimizer, loss_fn, **options)
