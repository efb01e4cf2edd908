"""Refusing a train step's mistaken parts early: a foreign optimizer, a loss of the wrong form."""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from ._errors import OptimizerMismatchError
from ._leaf_names import leaf_shapes


def check_optimizer_matches(model: nnx.Module, optimizer: nnx.Optimizer[Any]) -> None:
    """Refuse an optimizer whose state was built for another model's parameters, or that line-searches.

    The state ``optimizer.tx`` would build for ``model`` (traced with ``jax.eval_shape``, no
    arrays made) is compared, path by path and shape by shape, with the state it holds.

    Raises:
        OptimizerMismatchError: A ValueError naming the first leaf that differs.
        TypeError: The optimizer's update needs ``value=`` or others (a line search).
    """
    expected = leaf_shapes(jax.eval_shape(optimizer.tx.init, nnx.state(model, optimizer.wrt)))
    actual = leaf_shapes(optimizer.opt_state)
    if expected == actual:
        _check_update_takes_no_extra_arguments(model, optimizer)
        return
    for i in range(max(len(expected), len(actual))):
        want = expected[i] if i < len(expected) else None
        have = actual[i] if i < len(actual) else None
        if want == have:
            continue
        path = (have or want or ("", ()))[0]
        if want is not None and have is not None and want[0] != have[0]:
            path = f"{have[0]} (the model needs {want[0]} there)"
        model_shape = None if want is None else want[1]
        optimizer_shape = None if have is None else have[1]
        msg = (
            f"the optimizer was built for another model: its state at {path} has shape "
            f"{optimizer_shape}, where this model's parameters need {model_shape}; build it from "
            "this model, nnx.Optimizer(model, tx, wrt=nnx.Param)"
        )
        raise OptimizerMismatchError(
            msg, path=path, model_shape=model_shape, optimizer_shape=optimizer_shape
        )


def _check_update_takes_no_extra_arguments(
    model: nnx.Module, optimizer: nnx.Optimizer[Any]
) -> None:
    """Refuse a transformation whose update needs arguments a step does not pass (``value=``).

    Its update is traced on shapes alone (``jax.eval_shape``), as a step calls it.
    """
    params = nnx.as_pure(nnx.state(model, optimizer.wrt))
    state = nnx.as_pure(optimizer.opt_state)
    try:
        jax.eval_shape(lambda p, s: optimizer.tx.update(p, s, p), params, state)
    except TypeError as error:
        if "required keyword-only argument" not in str(error):
            raise
        msg = (
            f"the optimizer's update needs arguments a train step does not pass ({error}): a line "
            "search (optax.lbfgs, a *_linesearch) needs the loss function, optax.polyak_sgd and "
            "optax.contrib.reduce_on_plateau the loss; update with "
            "substrax.optim.update_with_line_search(model, optimizer, loss_fn) in an nnx.jit step, "
            "or lower the learning rate on plateaus with ReduceLROnPlateauCallback"
        )
        raise TypeError(msg) from None


def check_loss_output(out: Any, *, has_aux: bool) -> None:  # noqa: ANN401  (what loss_fn returned)
    """Refuse a ``loss_fn`` output that does not match ``has_aux``, at trace time.

    Raises:
        TypeError: With ``has_aux=True``, if ``out`` is not a ``(loss, aux)`` pair; without it, if
            ``out`` is a tuple.
    """
    is_pair = isinstance(out, tuple | list) and len(out) == 2  # noqa: PLR2004  (loss, aux)
    if has_aux and not is_pair:
        shape = getattr(out, "shape", None)
        got = f"an array of shape {shape}" if shape is not None else type(out).__name__
        msg = (
            f"has_aux=True, so loss_fn must return a pair (loss, aux), but it returned {got}; "
            "return (loss, aux), or drop has_aux=True"
        )
        raise TypeError(msg)
    if not has_aux and isinstance(out, tuple | list):
        msg = (
            f"loss_fn returned a {type(out).__name__} of {len(out)} items, not a scalar loss; "
            "for (loss, aux) pass has_aux=True"
        )
        raise TypeError(msg)
