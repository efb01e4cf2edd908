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
from ._row_weights import row_weights


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
        if not shape:  # every leaf is split by rows, a replicated one too
            return (
                f"is a scalar, which cannot be split into accumulate_steps={count} microbatches; "
                "pass what is not a row of examples (a scale, a per-class table) to loss_fn by "
                "closing over it, not in the batch"
            )
        return (
            f"is {shape[0]} rows, which cannot be split into {count} equal microbatches; give a "
            f"batch whose leading dimension is a multiple of accumulate_steps={count}"
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


def accumulate_gradients(
    grad_fn: GradFn,
    params: PyTree,
    rest: PyTree,
    batch: PyTree,
    count: int,
    *,
    mask: str | None = None,
) -> tuple[tuple[Any, Any], PyTree, PyTree]:
    """Run ``grad_fn`` on each of ``count`` microbatches of ``batch`` and average the results.

    The gradients are summed in float32 (float64 ones in float64) and divided by ``count`` (so a
    mean loss gives the gradient of the whole batch), then cast to each parameter's dtype. The
    loss and every auxiliary leaf are averaged over the microbatches, element by element: right
    for a mean (a scalar or per-class mean or fraction; a count, sum or maximum comes out
    changed), but a per-example aux (one value a row) would be
    averaged across microbatches (``count`` times fewer rows, each the mean of rows of
    different examples), so it should be reduced in ``loss_fn``. ``rest`` (batch statistics,
    RNG counts) is threaded through the microbatches in order.

    With ``mask`` (the batch's key of per-row weights, or of each row's items: a ``(rows,
    tokens)`` mask weighs a row by its tokens), each microbatch's loss, aux and gradients are
    weighted by the sum of its weights, and the sums divided by the batch's: a loss that is a
    mean over what the mask counts (padded tokens left out) then gives the whole batch's. A
    microbatch that counts nothing adds nothing; a batch that counts nothing gives zero
    gradients and a NaN loss (0/0), as an ``EvalStep`` gives NaN.
    """
    microbatches = split_microbatches(batch, count)
    weights = None
    if mask is not None:  # each microbatch's share of the rows counted
        rows = row_weights(batch, mask, "TrainStep", items=True)
        weights = jnp.sum(split_microbatches(rows, count), 1)

    def body(
        carry: tuple[PyTree, PyTree], xs: tuple[PyTree, jax.Array | None]
    ) -> tuple[tuple[PyTree, PyTree], tuple[Any, Any]]:
        total, state = carry
        microbatch, weight = xs
        out, grads, state = grad_fn(params, state, microbatch)
        if weight is not None:
            out, grads = jax.tree.map(lambda x: jnp.where(weight > 0, x * weight, 0), (out, grads))
        total = jax.tree.map(lambda t, g: t + g.astype(t.dtype), total, grads)
        return (total, state), out

    zeros = jax.tree.map(_zeros_wide, params)
    (total, rest), (losses, aux) = jax.lax.scan(body, (zeros, rest), (microbatches, weights))
    if weights is None:
        grads = jax.tree.map(lambda t, p: (t / count).astype(p.dtype), total, params)
        return jax.tree.map(lambda x: jnp.mean(x, axis=0), (losses, aux)), grads, rest
    counted = jnp.sum(weights)  # the rows the batch counts; none: no gradient (the loss NaN)
    grads = jax.tree.map(
        lambda t, p: jnp.where(counted > 0, t / counted, 0).astype(p.dtype), total, params
    )
    return jax.tree.map(lambda x: jnp.sum(x, axis=0) / counted, (losses, aux)), grads, rest
