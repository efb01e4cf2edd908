"""Weight-decay masks from nnx filters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from substrax.typing import PyTree

from ._config import OptimizerConfig


def _exclude_bias_and_norm_scale(path: tuple[Any, ...], _value: object) -> bool:
    return bool(path) and path[-1] not in ("bias", "scale")


EXCLUDE_BIAS_AND_NORM_SCALE: Callable[[tuple[Any, ...], object], bool] = (
    _exclude_bias_and_norm_scale
)
"""A filter that decays every parameter except biases and normalisation scales."""


def _key_name(key: PyTree) -> PyTree:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return key


def _nnx_path(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pytree key path as an nnx path: key names, without a trailing ``.value``."""
    parts = tuple(_key_name(k) for k in path)
    return parts[:-1] if parts and parts[-1] == "value" else parts


def _is_variable(x: object) -> bool:
    return isinstance(x, nnx.Variable)


def mask_from_filter(params: PyTree, filter_: PyTree) -> PyTree:
    """A tree of bools over ``params``: whether each parameter matches the nnx ``filter_``.

    ``params`` may be an ``nnx.State`` of variables or any pytree of arrays; a trailing
    ``.value`` attribute is dropped from each path, so paths read like nnx paths. A filter on
    variable types (``nnx.Param``, ``nnx.OfType(...)``) needs the variables: over plain arrays
    it matches nothing.

    Example:
        >>> from flax import nnx
        >>> from substrax.optim import EXCLUDE_BIAS_AND_NORM_SCALE, mask_from_filter
        >>> params = nnx.state(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Param)
        >>> mask_from_filter(params, EXCLUDE_BIAS_AND_NORM_SCALE)
        State({
          'bias': False,
          'kernel': True
        })
    """
    predicate = nnx.filterlib.to_predicate(filter_)

    def one(path: tuple[Any, ...], leaf: object) -> bool:
        return bool(predicate(_nnx_path(path), leaf))

    return jax.tree_util.tree_map_with_path(one, params, is_leaf=_is_variable)


def mask_callable(config: OptimizerConfig, model: nnx.Module | None = None) -> Callable[[Any], Any]:
    """The mask optax's decoupled decay takes: ``params -> tree of bools``.

    Without a ``weight_decay_filter`` the mask selects every parameter (``...``) rather than
    being None, so the optimizer state has the same tree (optax's ``MaskedState``) whatever the
    filter: a checkpoint of the state restores after the filter is added, changed or removed.

    With ``model``, the mask is decided once, from the model's variables
    (``nnx.state(model, config.wrt)``), and the callable returns it by path for any tree of the
    same paths: optax calls it on the variables at ``init`` but on plain arrays at ``update``,
    where a filter on variable types (``nnx.Param``, ``nnx.OfType(...)``) would match nothing.
    Without ``model`` the filter is applied to whatever tree the callable is given.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from substrax.optim import OptimizerConfig, mask_callable
        >>> mask_callable(OptimizerConfig(learning_rate=1e-3))({"w": jnp.ones(2)})
        {'w': True}
        >>> config = OptimizerConfig(optimizer_type="adamw", learning_rate=1e-3,
        ...                          weight_decay=0.1, weight_decay_filter=nnx.Param)
        >>> model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> mask_callable(config, model)({"bias": jnp.ones(2), "kernel": jnp.ones((2, 2))})
        {'bias': True, 'kernel': True}
    """
    filter_ = config.weight_decay_filter
    selected = ... if filter_ is None else filter_
    if model is None:
        return lambda params: mask_from_filter(params, selected)
    decided = mask_from_filter(nnx.state(model, config.wrt), selected)
    decisions: dict[tuple[Any, ...], bool] = {
        _nnx_path(path): bool(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(decided)
    }

    def one(path: tuple[Any, ...], _leaf: object) -> bool:
        key = _nnx_path(path)
        if key not in decisions:
            known = sorted("/".join(map(str, k)) for k in decisions)
            msg = (
                f"the weight-decay mask was decided from the model's parameters {known}, which "
                f"have no {'/'.join(map(str, key))!r}; build the transformation from the model "
                "it updates: create_transformation(model, config)"
            )
            raise ValueError(msg)
        return decisions[key]

    return lambda params: jax.tree_util.tree_map_with_path(one, params, is_leaf=_is_variable)


def weight_decay_mask(model: nnx.Module, config: OptimizerConfig) -> dict[str, Any]:
    """The weight-decay mask of ``model`` as a nested dict of Python bools.

    Example:
        >>> from flax import nnx
        >>> from substrax.optim import EXCLUDE_BIAS_AND_NORM_SCALE, OptimizerConfig, weight_decay_mask
        >>> config = OptimizerConfig(optimizer_type="adamw", learning_rate=1e-3,
        ...                          weight_decay=0.1, weight_decay_filter=EXCLUDE_BIAS_AND_NORM_SCALE)
        >>> weight_decay_mask(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), config)
        {'bias': False, 'kernel': True}
    """
    mask = mask_callable(config, model)(nnx.state(model, config.wrt))
    return nnx.to_pure_dict(mask) if isinstance(mask, nnx.State) else mask
