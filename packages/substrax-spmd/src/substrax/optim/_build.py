"""Building the optax transformation and the nnx optimizer from a config."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from substrax.support import check_array_variables, check_int, check_type
from substrax.typing import PyTree

from ._config import DECOUPLED_DECAY_TYPES, OptimizerConfig
from ._errors import LearningRateNotFoundError, OptimizerConfigError
from ._masks import mask_callable, mask_from_filter


def _base(config: OptimizerConfig) -> optax.GradientTransformation:  # noqa: PLR0911
    kind, lr = config.optimizer_type, config.learning_rate
    moments = {"b1": config.b1, "b2": config.b2, "eps": config.eps}
    inject = optax.inject_hyperparams
    if kind in DECOUPLED_DECAY_TYPES:
        alias = optax.adamw if kind == "adamw" else optax.lamb
        return inject(alias, static_args=("mask",))(
            learning_rate=lr,
            weight_decay=config.weight_decay,
            mask=mask_callable(config),
            **moments,
        )
    if kind == "sgd":
        return inject(optax.sgd)(learning_rate=lr, momentum=config.momentum)
    if kind == "rmsprop":
        return inject(optax.rmsprop)(
            learning_rate=lr, eps=config.eps, momentum=config.momentum or 0.0
        )
    if kind == "adagrad":
        return inject(optax.adagrad)(learning_rate=lr, eps=config.eps)
    if kind == "radam":
        return inject(optax.radam)(learning_rate=lr, **moments)
    if kind == "nadam":
        return inject(optax.adam, static_args=("nesterov",))(
            learning_rate=lr, nesterov=True, **moments
        )
    return inject(optax.adam)(learning_rate=lr, **moments)


def create_transformation(
    model: nnx.Module, config: OptimizerConfig
) -> optax.GradientTransformation:
    """The optax transformation for ``config``: an optional clip chained before the optimizer.

    The optimizer is wrapped in ``optax.inject_hyperparams`` so its learning rate can be read
    (:func:`current_learning_rate`) and changed. adamw and lamb decay only the parameters
    ``config.weight_decay_filter`` selects; their state is masked whether or not a filter is
    set, so its tree does not depend on the filter (see :func:`mask_callable`).

    Raises:
        OptimizerConfigError: If the optimizer is adamw or lamb and the weight-decay filter
            selects no parameter of ``model`` (a misspelt path would silently decay nothing).

    Example:
        >>> import optax
        >>> from flax import nnx
        >>> from substrax.optim import OptimizerConfig, create_transformation
        >>> model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> tx = create_transformation(model, OptimizerConfig(learning_rate=1e-3, gradient_clip_norm=1.0))
        >>> isinstance(tx, optax.GradientTransformation)
        True
    """
    check_type("model", model, nnx.Module, "an nnx.Module")
    check_type("config", config, OptimizerConfig, "an OptimizerConfig(...)")
    if config.optimizer_type in DECOUPLED_DECAY_TYPES and config.weight_decay_filter is not None:
        mask = mask_from_filter(nnx.state(model, config.wrt), config.weight_decay_filter)
        if not any(jax.tree.leaves(mask)):
            msg = (
                f"weight_decay_filter {config.weight_decay_filter!r} selects none of the model's "
                f"parameters, so {config.optimizer_type} would decay nothing; fix the filter "
                "(nnx.PathContains('kernel'), EXCLUDE_BIAS_AND_NORM_SCALE, ...) or pass "
                "weight_decay_filter=None to decay every parameter"
            )
            raise OptimizerConfigError(
                msg, field="weight_decay_filter", value=config.weight_decay_filter
            )
    base = _base(config)
    if config.gradient_clip_norm is not None:
        return optax.chain(optax.clip_by_global_norm(config.gradient_clip_norm), base)
    if config.gradient_clip_value is not None:
        return optax.chain(optax.clip(config.gradient_clip_value), base)
    return base


def create_optimizer[M: nnx.Module](model: M, config: OptimizerConfig) -> nnx.Optimizer[M]:
    """An ``nnx.Optimizer`` over ``model`` built from ``config``.

    Example:
        >>> from flax import nnx
        >>> from substrax.optim import OptimizerConfig, create_optimizer
        >>> model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> create_optimizer(model, OptimizerConfig(learning_rate=1e-3)).wrt is nnx.Param
        True
    """
    # optax.inject_hyperparams reads each parameter's dtype: a jax.Ref has none to give
    check_array_variables(nnx.state(model, config.wrt), "create_optimizer", hijax=False)
    return nnx.Optimizer(model, create_transformation(model, config), wrt=config.wrt)


def _find_learning_rate(node: PyTree) -> PyTree:
    hyper = getattr(node, "hyperparams", None)
    if isinstance(hyper, dict) and "learning_rate" in hyper:
        return hyper["learning_rate"]
    children: list[Any] = []
    if isinstance(node, dict):
        children = list(node.values())  # pyright: ignore[reportUnknownArgumentType]
    elif isinstance(node, (tuple, list)):
        children = list(node)  # pyright: ignore[reportUnknownArgumentType]
    inner = getattr(node, "inner_state", None)
    if inner is not None:
        children.append(inner)
    for child in children:
        found = _find_learning_rate(child)
        if found is not None:
            return found
    return None


def current_learning_rate(optimizer: nnx.Optimizer[Any]) -> jax.Array:
    """The learning rate of the latest update (the schedule at step 0 before any update).

    Raises:
        LearningRateNotFoundError: (a ``LookupError``) If the optimizer state holds no injected
            ``learning_rate`` (build the transformation with ``optax.inject_hyperparams`` or
            :func:`create_transformation`).

    Example:
        >>> from flax import nnx
        >>> from substrax.optim import OptimizerConfig, create_optimizer, current_learning_rate
        >>> model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> float(current_learning_rate(create_optimizer(model, OptimizerConfig(learning_rate=0.5))))
        0.5
    """
    check_type("optimizer", optimizer, nnx.Optimizer, "an nnx.Optimizer")
    found = _find_learning_rate(optimizer.opt_state)
    if found is None:
        raise LearningRateNotFoundError
    value = found.get_value() if isinstance(found, nnx.Variable) else found
    return jnp.asarray(value)


def with_strong_state_types(
    tx: optax.GradientTransformation,
) -> optax.GradientTransformationExtraArgs:
    """``tx`` with weak types removed from its initial state, so a jitted step compiles once.

    Example:
        >>> import jax.numpy as jnp
        >>> import optax
        >>> from substrax.optim import with_strong_state_types
        >>> tx = with_strong_state_types(optax.inject_hyperparams(optax.sgd)(learning_rate=0.1))
        >>> tx.init({"w": jnp.ones(2)}).hyperparams["learning_rate"].weak_type
        False
    """
    check_type("tx", tx, optax.GradientTransformation, "an optax transformation (optax.adam(...))")

    def strong(x: PyTree) -> PyTree:
        if isinstance(x, jax.Array) and getattr(x, "weak_type", False):  # key arrays have none
            return jnp.array(x, dtype=x.dtype)
        return x

    def init(params: PyTree) -> PyTree:
        return jax.tree.map(strong, tx.init(params))

    return optax.GradientTransformationExtraArgs(init, optax.with_extra_args_support(tx).update)


def switch_at(
    first: optax.GradientTransformation, second: optax.GradientTransformation, *, step: int
) -> optax.GradientTransformationExtraArgs:
    """Run ``first`` for the first ``step`` updates and ``second`` from then on.

    Both keep their state from the start (``optax.conditionally_transform``), so ``second``
    starts with fresh statistics at the switch. The initial state has no weakly typed leaves
    (:func:`with_strong_state_types` is applied), so a jitted step compiles once across the
    switch, and ``second`` may be a line search: ``switch_at(optax.adam(1e-3), optax.lbfgs(),
    step=100)`` goes straight to :func:`update_with_line_search`, which forwards ``value``,
    ``grad`` and ``value_fn`` to it.

    Raises:
        TypeError: If ``step`` is not an int.
        ValueError: If ``step`` is below 1.

    Example:
        >>> import jax.numpy as jnp
        >>> import optax
        >>> from substrax.optim import switch_at
        >>> tx = switch_at(optax.sgd(1.0), optax.sgd(0.1), step=1)
        >>> params = {"w": jnp.zeros(1)}
        >>> state = tx.init(params)
        >>> first, state = tx.update({"w": jnp.ones(1)}, state, params)
        >>> second, state = tx.update({"w": jnp.ones(1)}, state, params)
        >>> float(first["w"][0]), round(float(second["w"][0]), 6)
        (-1.0, -0.1)
    """
    switch = check_int("step", step, minimum=1)

    def before(step: jax.typing.ArrayLike, **_: object) -> jax.Array:
        return jnp.less(step, switch)

    def after(step: jax.typing.ArrayLike, **_: object) -> jax.Array:
        return jnp.greater_equal(step, switch)

    return with_strong_state_types(
        optax.chain(
            optax.conditionally_transform(first, before),
            optax.conditionally_transform(second, after),
        )
    )
