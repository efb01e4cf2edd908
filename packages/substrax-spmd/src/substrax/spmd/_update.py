"""The pure update of a train step with gradient accumulation or a precision policy.

:class:`TrainStep` uses its own plain update when none of these is asked for; this module
builds the one that handles them, as a function of the flat state leaves and a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from flax.nnx.filterlib import Filter

from substrax.typing import PyTree

from ._accumulate import accumulate_gradients
from ._consistency import check_loss_output
from ._live_graph import check_layout_kept, variable_layout
from ._precision import PrecisionPolicy


type PureStep = Callable[[list[Any], PyTree], tuple[list[Any], PyTree]]


def _like(new: PyTree, old: PyTree) -> PyTree:
    """``new``'s leaves in ``old``'s structure and dtypes, so the carried state keeps its form.

    A model merged inside the step may hold empty sub-states where ``old`` has none, and an
    update computed in the compute dtype must not change a stored dtype.
    """
    old_leaves, treedef = jax.tree.flatten(old)
    leaves = [
        n if n.dtype == o.dtype else n.astype(o.dtype)
        for n, o in zip(jax.tree.leaves(new), old_leaves, strict=True)
    ]
    return jax.tree.unflatten(treedef, leaves)


def build_update(
    graphdef: nnx.GraphDef[Any],
    treedef: PyTree,
    loss_fn: Callable[[Any, Any], Any],
    *,
    has_aux: bool,
    accumulate_steps: int,
    precision: PrecisionPolicy | None,
    wrt: Filter,
    mask: str | None = None,
) -> PureStep:
    """The step ``(state_leaves, batch) -> (state_leaves, loss or (loss, aux))``.

    The model's ``wrt`` variables are differentiated with ``jax.value_and_grad``; under a
    precision policy they are cast to the compute dtype inside the differentiated function, so
    the gradient comes back in the stored dtype and no second copy outlives the step, and the
    model's layers compute in it (they cast their inputs; the batch itself is left as given,
    so float targets keep their precision). ``mask`` weights the microbatches
    (:func:`accumulate_gradients`).
    """

    def grad_fn(
        params: PyTree,
        rest: PyTree,
        batch: PyTree,
        model_def: nnx.GraphDef[Any],
        layout: dict[tuple[Any, ...], int],
    ) -> tuple[tuple[Any, Any], PyTree, PyTree]:
        def loss_of(params: PyTree, rest: PyTree) -> tuple[Any, tuple[Any, PyTree]]:
            if precision is not None:
                params = precision.cast_to_compute(params)
            model = nnx.merge(model_def, params, rest)
            if precision is not None:
                precision.set_compute_dtype(model)
            out = loss_fn(model, batch)
            check_loss_output(out, has_aux=has_aux)
            loss, aux = out if has_aux else (out, None)
            if precision is not None:
                loss, aux = precision.cast_to_output((loss, aux))
            _, _, new_rest = nnx.split(model, wrt, ...)
            check_layout_kept(layout, new_rest, (0,))  # a sow left in the model, named
            return loss, (aux, _like(new_rest, rest))

        (loss, (aux, rest)), grads = jax.value_and_grad(loss_of, has_aux=True)(params, rest)
        return (loss, aux), grads, rest

    def update(leaves: list[Any], batch: PyTree) -> tuple[list[Any], PyTree]:
        model, optimizer = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
        model_def, variables, rest = nnx.split(model, wrt, ...)
        layout = variable_layout(rest)
        # plain arrays cross the transforms: a Variable carries the trace it was made in, and
        # nnx refuses to mutate it (batch statistics, RNG counts) under another
        params, rest = nnx.as_pure(variables), nnx.as_pure(rest)

        def bound(
            params: PyTree, rest: PyTree, batch: PyTree
        ) -> tuple[tuple[Any, Any], PyTree, PyTree]:
            return grad_fn(params, rest, batch, model_def, layout)

        if accumulate_steps > 1:
            (loss, aux), grads, rest = accumulate_gradients(
                bound, params, rest, batch, accumulate_steps, mask=mask
            )
        else:
            (loss, aux), grads, rest = bound(params, rest, batch)
        nnx.update(model, rest)
        # the optimizer picks its gradients by Variable type: wrap the arrays again
        optimizer.update(model, _like(grads, variables))
        return jax.tree.leaves(nnx.state((model, optimizer))), (loss, aux) if has_aux else loss

    return update
