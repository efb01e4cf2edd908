"""Building the optax transformation and the nnx optimizer from a config."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
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


def _base(model: nnx.Module, config: OptimizerConfig) -> optax.GradientTransformation:  # noqa: PLR0911
    kind, lr = config.optimizer_type, config.learning_rate
    moments = {"b1": config.b1, "b2": config.b2, "eps": config.eps}
    inject = optax.inject_hyperparams
    if kind in DECOUPLED_DECAY_TYPES:
        alias = optax.adamw if kind == "adamw" else optax.lamb
        return inject(alias, static_args=("mask",))(
            learning_rate=lr,
            weight_decay=config.weight_decay,
            mask=mask_callable(config, model),
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
        TypeError: If ``model`` is not an ``nnx.Module`` or ``config`` not an OptimizerConfig.
        OptimizerConfigError: If ``config.wrt`` selects no array of ``model`` (an optimizer
            that updates nothing), or the optimizer is adamw or lamb and the weight-decay filter
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
    params = nnx.state(model, config.wrt)
    if not jax.tree.leaves(params):
        msg = (
            f"wrt={config.wrt!r} selects no array of the {type(model).__name__} model, so the "
            "optimizer would update nothing; pass the model it trains, or a wrt filter that "
            "selects its parameters (nnx.Param)"
        )
        raise OptimizerConfigError(msg, field="wrt", value=config.wrt)
    if config.optimizer_type in DECOUPLED_DECAY_TYPES and config.weight_decay_filter is not None:
        mask = mask_from_filter(params, config.weight_decay_filter)
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
    base = _base(model, config)
    if config.gradient_clip_norm is not None:
        return optax.chain(optax.clip_by_global_norm(config.gradient_clip_norm), base)
    if config.gradient_clip_value is not None:
        return optax.chain(optax.clip(config.gradient_clip_value), base)
    return base


def create_optimizer[M: nnx.Module](model: M, config: OptimizerConfig) -> nnx.Optimizer[M]:
    """An ``nnx.Optimizer`` over ``model`` built from ``config``.

    Raises:
        TypeError: If ``model`` is not an ``nnx.Module`` or ``config`` not an OptimizerConfig.
        OptimizerConfigError: As :func:`create_transformation`.

    Example:
        >>> from flax import nnx
        >>> from substrax.optim import OptimizerConfig, create_optimizer
        >>> model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> create_optimizer(model, OptimizerConfig(learning_rate=1e-3)).wrt is nnx.Param
        True
    """
    check_type("model", model, nnx.Module, "an nnx.Module")
    check_type("config", config, OptimizerConfig, "an OptimizerConfig(...)")
    # optax.inject_hyperparams reads each parameter's dtype: a jax.Ref has none to give
    check_array_variables(nnx.state(model, config.wrt), "create_optimizer", hijax=False)
    return nnx.Optimizer(model, create_transformation(model, config), wrt=config.wrt)


def _state_children(node: PyTree, *, dicts: bool) -> list[Any]:
    """The states inside an optimizer state ``node``: a tuple's items and an ``inner_state``.

    A dict's values only with ``dicts``: the param-shaped trees (moments) are dicts, whose walk
    costs a visit per parameter.
    """
    children: list[Any] = []
    if dicts and isinstance(node, dict):
        children = list(node.values())  # pyright: ignore[reportUnknownArgumentType]
    elif isinstance(node, (tuple, list)):
        children = list(node)  # pyright: ignore[reportUnknownArgumentType]
    if (inner := getattr(node, "inner_state", None)) is not None:
        children.append(inner)
    return children


def _find_learning_rate(node: PyTree) -> PyTree:
    hyper = getattr(node, "hyperparams", None)
    if isinstance(hyper, dict) and "learning_rate" in hyper:
        return hyper["learning_rate"]
    for child in _state_children(node, dicts=True):
        found = _find_learning_rate(child)
        if found is not None:
            return found
    return None


def _switched_rates(node: PyTree) -> int:
    """How many ``optax.conditionally_transform`` states under ``node`` hold a learning rate."""
    if isinstance(node, optax.ConditionallyTransformState):
        return int(_find_learning_rate(node.inner_state) is not None)
    return sum(_switched_rates(child) for child in _state_children(node, dicts=False))


def current_learning_rate(optimizer: nnx.Optimizer[Any]) -> jax.Array:
    """The learning rate of the latest update (the schedule at step 0 before any update).

    For a :func:`switch_at` transformation it is the rate of the optimizer that ran the latest
    update (before any update, of the first one).

    Raises:
        LearningRateNotFoundError: (a ``LookupError``) If the optimizer state, or the state of
            the optimizer :func:`switch_at` ran last, holds no injected ``learning_rate``
            (build the transformation with ``optax.inject_hyperparams`` or
            :func:`create_transformation`). Under a trace that case gives NaN instead.
        ValueError: A :func:`switch_at` sits inside another transformation (``optax.chain``):
            its state holds both optimizers' rates, and which ran last is not known from it.

    Example:
        >>> from flax import nnx
        >>> from substrax.optim import OptimizerConfig, create_optimizer, current_learning_rate
        >>> model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> float(current_learning_rate(create_optimizer(model, OptimizerConfig(learning_rate=0.5))))
        0.5
    """
    check_type("optimizer", optimizer, nnx.Optimizer, "an nnx.Optimizer")
    branches = switch_branches(optimizer.tx, nnx.as_pure(optimizer.opt_state), latest=True)
    if any(_switched_rates(state) > 1 for _, state, _ in branches):
        raise ValueError(
            "current_learning_rate reads a switch_at only at the top of the optimizer (or of "
            "a switch_at's branch), not inside optax.chain or another transformation, whose "
            "state holds the rates of both its optimizers; write switch_at(optax.chain(clip, "
            "first), optax.chain(clip, second), step=N) instead of optax.chain(clip, "
            "switch_at(first, second, step=N))"
        )
    rates = [(_find_learning_rate(state), ran) for _, state, ran in branches]
    if all(rate is None for rate, _ in rates):
        raise LearningRateNotFoundError
    if len(rates) == 1:
        return jnp.asarray(rates[0][0])
    chosen, found = jnp.asarray(jnp.nan), jnp.asarray(False)
    for rate, ran in rates:
        if rate is not None:
            chosen, found = jnp.where(ran, rate, chosen), jnp.logical_or(found, ran)
    try:
        missing = not bool(found)
    except jax.errors.ConcretizationTypeError:  # traced: the NaN stands for the missing rate
        missing = False
    if missing:
        raise LearningRateNotFoundError(
            where="the state of the optimizer switch_at ran last (it has a learning rate only in "
            "the other one)"
        )
    return chosen


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


@dataclass(frozen=True, slots=True)
class _Switch:
    step: int
    first: optax.GradientTransformation
    second: optax.GradientTransformation


# switch_at's parts by its update function (a function is never copied, not even by deepcopy),
# so current_learning_rate and update_with_line_search can tell which optimizer runs
_SWITCHES: weakref.WeakKeyDictionary[Callable[..., Any], _Switch] = weakref.WeakKeyDictionary()


def switch_branches(
    tx: optax.GradientTransformation, state: PyTree, *, latest: bool
) -> list[tuple[optax.GradientTransformation, PyTree, jax.Array | bool]]:
    """The optimizers inside ``tx``, each with its state and whether it runs.

    One ``(tx, state, True)`` unless ``tx`` is a :func:`switch_at` (nested ones are followed);
    then each branch's flag says whether it ran the latest update (``latest``; before any
    update, the first branch) or runs the next one. ``state`` holds arrays (``nnx.as_pure``).
    """
    switch = _SWITCHES.get(tx.update)
    if switch is None:
        return [(tx, state, True)]
    found: list[tuple[optax.GradientTransformation, PyTree, jax.Array | bool]] = []
    for index, (inner, branch) in enumerate(zip((switch.first, switch.second), state, strict=True)):
        updates = jnp.asarray(branch.step)  # the updates run so far
        update = jnp.maximum(updates - 1, 0) if latest else updates
        runs = jnp.less(update, switch.step) if index == 0 else update >= switch.step
        found.extend(
            (leaf, leaf_state, jnp.logical_and(runs, leaf_runs))
            for leaf, leaf_state, leaf_runs in switch_branches(
                inner, branch.inner_state, latest=latest
            )
        )
    return found


def switch_at(
    first: optax.GradientTransformation, second: optax.GradientTransformation, *, step: int
) -> optax.GradientTransformationExtraArgs:
    """Run ``first`` for the first ``step`` updates and ``second`` from then on.

    Both keep their state from the start (``optax.conditionally_transform``), so ``second``
    starts with fresh statistics at the switch. The initial state has no weakly typed leaves
    (:func:`with_strong_state_types` is applied), so a jitted step compiles once across the
    switch, and ``second`` may be a line search: ``switch_at(optax.adam(1e-3), optax.lbfgs(),
    step=100)`` goes straight to :func:`update_with_line_search`, which forwards ``value``,
    ``grad`` and ``value_fn`` to it. :func:`current_learning_rate` reads the rate of the
    optimizer that ran the latest update.

    Raises:
        TypeError: If ``first`` or ``second`` is not an optax transformation, or ``step`` is
            not an int.
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
    wanted = "an optax transformation (optax.adam(...))"
    check_type("first", first, optax.GradientTransformation, wanted)
    check_type("second", second, optax.GradientTransformation, wanted)
    switch = check_int("step", step, minimum=1)

    def before(step: jax.typing.ArrayLike, **_: object) -> jax.Array:
        return jnp.less(step, switch)

    def after(step: jax.typing.ArrayLike, **_: object) -> jax.Array:
        return jnp.greater_equal(step, switch)

    strong = with_strong_state_types(
        optax.chain(
            optax.conditionally_transform(first, before),
            optax.conditionally_transform(second, after),
        )
    )

    def update(
        updates: optax.Updates, state: PyTree, params: optax.Params | None = None, **extra: object
    ) -> tuple[optax.Updates, PyTree]:
        return strong.update(updates, state, params, **extra)

    _SWITCHES[update] = _Switch(switch, first, second)
    return optax.GradientTransformationExtraArgs(strong.init, update)
