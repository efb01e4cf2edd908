"""Gradient accumulation: one batch split into microbatches inside one compiled step.

A ``jax.lax.scan`` runs the forward and backward pass on one microbatch at a time and adds the
gradients into float32 accumulators, so the step holds one microbatch's activations and one
gradient buffer at a time, however many microbatches there are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from substrax.typing import PyTree

from ._leaf_names import check_leading_rows


# (params, rest, microbatch) -> ((loss, aux), grads, rest)
type GradFn = Callable[[PyTree, PyTree, PyTree], tuple[tuple[Any, Any], PyTree, PyTree]]


def check_microbatches(batch: PyTree, count: int) -> None:
    """Refuse ``batch`` unless ``count`` divides every leaf's leading dimension.

    The compiled step and :meth:`TrainStep.cost` run this same check (on shapes only).

    Raises:
        BatchSplitError: A leaf that is a scalar or whose leading dimension ``count`` does not
            divide, named by its key path.
    """

    def problem(shape: tuple[int, ...]) -> str:
        rows = f"{shape[0]} rows" if shape else "a scalar"
        return (
            f"is {rows}, which cannot be split into {count} equal microbatches; give a batch "
            f"whose leading dimension is a multiple of accumulate_steps={count}"
        )

    check_leading_rows(batch, count, lambda rows: rows % count == 0, problem)


def split_microbatches(batch: PyTree, count: int) -> PyTree:
    """Split every leaf's leading dimension into ``count`` microbatches, stacked on axis 0.

    Microbatch ``i`` takes rows ``i, i + count, i + 2 * count, ...``: under data-parallel
    sharding each device's block of rows splits into its own share of every microbatch, so no
    rows move between devices. The mean over microbatches of a mean loss is the mean loss of
    the batch whatever rows each microbatch takes.

    Raises:
        BatchSplitError: A leaf that is a scalar or whose leading dimension ``count`` does not
            divide, named by its key path (:func:`check_microbatches`).
    """
    check_microbatches(batch, count)

    def split(x: jax.Array) -> jax.Array:
        rows = x.shape[0]
        return jnp.swapaxes(x.reshape(rows // count, count, *x.shape[1:]), 0, 1)

    return jax.tree.map(split, batch)


def _zeros_wide(x: jax.Array) -> jax.Array:
    """Zeros to sum ``x``'s gradients in: at least float32 (a float64 one stays float64)."""
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    return jnp.zeros(x.shape, jnp.promote_types(x.dtype, jnp.float32) if floating else x.dtype)


def check_scalar_aux(aux: PyTree, count: int) -> None:
    """Refuse an auxiliary output that is not scalars: ``aux`` is stacked, one row a microbatch.

    A microbatch's per-example values (one per row) cannot be averaged with another
    microbatch's, which holds other examples; a scalar can.

    Raises:
        ValueError: An aux leaf with dimensions, named by its key path, with its shape.
    """
    for path, leaf in jax.tree_util.tree_leaves_with_path(aux):
        shape = tuple(jnp.shape(leaf))[1:]
        if shape:
            msg = (
                f"aux{jax.tree_util.keystr(path)} has shape {shape}, but with "
                f"accumulate_steps={count} every aux leaf is averaged over the microbatches, "
                "which would mix their examples; reduce it to a scalar in loss_fn (e.g. its "
                "mean), or return it from an EvalStep instead"
            )
            raise ValueError(msg)


def accumulate_gradients(
    grad_fn: GradFn, params: PyTree, rest: PyTree, batch: PyTree, count: int
) -> tuple[tuple[Any, Any], PyTree, PyTree]:
    """Run ``grad_fn`` on each of ``count`` microbatches of ``batch`` and average the results.

    The gradients are summed in float32 (float64 ones in float64) and divided by ``count`` (so a
    mean loss gives the gradient of the whole batch), then cast to each parameter's dtype. The loss and every
    auxiliary leaf (each a scalar: :func:`check_scalar_aux`) are averaged over the microbatches. ``rest`` (batch statistics, RNG counts)
    is threaded through the microbatches in order.
    """
    microbatches = split_microbatches(batch, count)

    def body(
        carry: tuple[PyTree, PyTree], microbatch: PyTree
    ) -> tuple[tuple[PyTree, PyTree], tuple[Any, Any]]:
        total, state = carry
        out, grads, state = grad_fn(params, state, microbatch)
        total = jax.tree.map(lambda t, g: t + g.astype(t.dtype), total, grads)
        return (total, state), out

    zeros = jax.tree.map(_zeros_wide, params)
    (total, rest), (losses, aux) = jax.lax.scan(body, (zeros, rest), microbatches)
    grads = jax.tree.map(lambda t, p: (t / count).astype(p.dtype), total, params)
    check_scalar_aux(aux, count)
    loss = jnp.mean(losses, axis=0)
    aux = jax.tree.map(lambda x: jnp.mean(x, axis=0), aux)
    return (loss, aux), grads, rest
