"""One optimizer update for line-search methods (L-BFGS and friends) on an nnx model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ._build import switch_branches
from ._errors import LineSearchStateError


def _check(model: nnx.Module, optimizer: nnx.Optimizer[Any]) -> jnp.dtype | None:
    """Refuse a state or model a line search cannot run on; return the parameters' float dtype."""
    state = nnx.as_pure(optimizer.opt_state)
    weak = [
        jax.tree_util.keystr(path)
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
        if getattr(leaf, "weak_type", False)
    ]
    if weak:
        msg = (
            f"the optimizer state has weakly typed leaves {weak}; every step would recompile. "
            "Build the transformation with substrax.optim.with_strong_state_types(tx)"
        )
        raise LineSearchStateError(msg, paths=tuple(weak))
    dtypes = sorted(
        {
            str(leaf.dtype)
            for leaf in jax.tree.leaves(nnx.as_pure(nnx.state(model, optimizer.wrt)))
            if jnp.issubdtype(leaf.dtype, jnp.floating)
        }
    )
    if len(dtypes) > 1:
        msg = (
            f"the parameters mix floating dtypes {dtypes}; a line search needs one, cast them first"
        )
        raise LineSearchStateError(msg, paths=tuple(dtypes))
    return jnp.dtype(dtypes[0]) if dtypes else None


def _is_conditional(node: object) -> bool:
    return isinstance(node, (optax.ConditionallyTransformState, optax.ConditionallyMaskState))


def _stored(optimizer: nnx.Optimizer[Any]) -> list[tuple[jax.Array, Any, jax.Array | bool]]:
    """Each line search's stored ``(value, grad)`` with whether it runs the next update.

    The optimizers of a :func:`switch_at` are told apart; a line search under any other
    condition may not be the one running (its stored gradient may be stale), so it is left out.
    """
    state = nnx.as_pure(optimizer.opt_state)
    found: list[tuple[jax.Array, Any, jax.Array | bool]] = []
    for _, branch, runs in switch_branches(optimizer.tx, state, latest=False):
        values = optax.tree.get_all_with_path(branch, "value")
        grads = optax.tree.get_all_with_path(branch, "grad")
        if len(values) > 1 or len(grads) > 1:
            paths = tuple(jax.tree_util.keystr(path) for path, _ in [*values, *grads])
            msg = (
                f"the optimizer state stores a line search's value or grad at several places "
                f"{list(paths)}, so the one to reuse is unknown; run one line search at a time, "
                "or several in turn with substrax.optim.switch_at(first, second, step=...)"
            )
            raise LineSearchStateError(msg, paths=paths)
        conditional = jax.tree.leaves(branch, is_leaf=_is_conditional)
        if values and grads and not any(_is_conditional(node) for node in conditional):
            found.append((values[0][1], grads[0][1], runs))
    return found


def update_with_line_search[M: nnx.Module](
    model: M,
    optimizer: nnx.Optimizer[M],
    loss_fn: Callable[[M], jax.Array],
    *,
    objective_changed: bool | jax.Array = True,
) -> jax.Array:
    """Update ``model`` with a line-search optimizer, passing ``value``, ``grad`` and ``value_fn``.

    Line searches (``optax.lbfgs``, ``scale_by_zoom_linesearch``, ...) evaluate the loss at the
    accepted point and store its value and gradient. When the objective is unchanged (same
    batch), the stored value is finite and the line search that stored it runs this update
    (for :func:`switch_at`, the branch whose turn it is), they are reused (``lax.cond``)
    instead of differentiating again.

    Args:
        model: The model.
        optimizer: An ``nnx.Optimizer`` whose transformation takes ``value``, ``grad`` and
            ``value_fn`` (wrap it in :func:`with_strong_state_types`).
        loss_fn: ``model -> scalar loss`` (close over the batch).
        objective_changed: Whether ``loss_fn`` differs from the previous call's (a new batch);
            a traced bool is allowed.

    Returns:
        The loss at the parameters before the update, in the parameters' floating dtype: the
        line search stores values in it, so a float64 loss over float32 parameters (with
        ``jax_enable_x64`` on) is cast to float32 rather than changing the state's type.

    Raises:
        LineSearchStateError: A ValueError, if the optimizer state has weakly typed leaves,
            the parameters mix floating dtypes, or the state stores several line searches'
            values outside :func:`switch_at` branches.

    Example:
        >>> import optax
        >>> from flax import nnx
        >>> from substrax.optim import with_strong_state_types, update_with_line_search
        >>> import jax.numpy as jnp
        >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        >>> optimizer = nnx.Optimizer(model, with_strong_state_types(optax.lbfgs()), wrt=nnx.Param)
        >>> x, y = jnp.ones((4, 2)), jnp.zeros((4, 1))
        >>> loss = lambda m: ((m(x) - y) ** 2).mean()
        >>> step = nnx.jit(lambda m, o: update_with_line_search(m, o, loss, objective_changed=False))
        >>> first = step(model, optimizer)
        >>> bool(step(model, optimizer) < first)
        True
    """
    dtype = _check(model, optimizer)
    graphdef, params, rest = nnx.split(model, optimizer.wrt, ...)

    def value_fn(pure_params: Any) -> jax.Array:  # noqa: ANN401  (optax passes a pure state)
        candidate = nnx.merge(graphdef, params, rest, copy=True)
        nnx.update(candidate, pure_params)
        value = loss_fn(candidate)
        # The line search keeps the value in its state in the parameters' dtype; a float64 loss
        # over float32 parameters (x64 on) would change the state's type at every step.
        return value if dtype is None else jnp.asarray(value, dtype=dtype)

    def fresh() -> tuple[jax.Array, Any]:
        return jax.value_and_grad(value_fn)(nnx.as_pure(params))

    stored = _stored(optimizer)
    if not stored or objective_changed is True:
        value, grad = fresh()
    else:
        reuse = jnp.asarray(False)
        stored_value, stored_grad = stored[0][0], stored[0][1]
        for one_value, one_grad, runs in stored:
            usable = jnp.logical_and(runs, jnp.isfinite(one_value))
            reuse = jnp.logical_or(reuse, usable)
            stored_value = jnp.where(usable, one_value, stored_value)
            stored_grad = jax.tree.map(
                lambda a, b, usable=usable: jnp.where(usable, a, b), one_grad, stored_grad
            )
        reuse = jnp.logical_and(jnp.logical_not(objective_changed), reuse)
        value, grad = jax.lax.cond(reuse, lambda: (stored_value, stored_grad), fresh)
    grads = jax.tree.map(
        lambda var, g: var.replace(g), params, grad, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    optimizer.update(model, grads, value=value, grad=grad, value_fn=value_fn)
    return value
