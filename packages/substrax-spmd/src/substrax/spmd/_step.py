"""The data-parallel step as a plain function for ``nnx.jit``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from substrax.typing import PyTree

from ._consistency import check_optimizer_matches


def spmd_train_step[M: nnx.Module](
    model: M,
    optimizer: nnx.Optimizer[M],
    loss_fn: Callable[[M, Any], jax.Array],
    batch: PyTree,
) -> jax.Array:
    """One training step: differentiate ``loss_fn`` with ``nnx.value_and_grad`` and update.

    The variables differentiated are the ones the optimizer updates (its ``wrt`` filter).

    Call it inside ``nnx.jit`` under ``jax.set_mesh(mesh)`` with a batch placed by
    ``place_batch_on_shards``; XLA inserts the gradient all-reduce. For a step at the speed
    of hand-written ``jax.jit``, use :class:`TrainStep`.

    Args:
        model: The model.
        optimizer: The ``nnx.Optimizer`` over the model's parameters (those its ``wrt`` picks).
        loss_fn: ``(model, batch) -> scalar loss``.
        batch: The (placed) batch.

    Returns:
        The loss before the update.

    Raises:
        OptimizerMismatchError: ``optimizer`` holds state built for another model's parameters.

    Example:
        >>> import optax
        >>> import jax
        >>> from flax import nnx
        >>> from substrax.spmd import spmd_train_step
        >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
        >>> loss_fn = lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean()
        >>> step = nnx.jit(lambda m, o, b: spmd_train_step(m, o, loss_fn, b))
        >>> batch = {"x": jax.numpy.ones((4, 2)), "y": jax.numpy.zeros((4, 1))}
        >>> bool(step(model, optimizer, batch) > step(model, optimizer, batch))
        True
    """
    check_optimizer_matches(model, optimizer)  # at trace time: once per compilation
    grad_fn = nnx.value_and_grad(
        lambda m: loss_fn(m, batch), argnums=nnx.DiffState(0, optimizer.wrt)
    )
    loss, grads = grad_fn(model)
    optimizer.update(model, grads)
    return loss
