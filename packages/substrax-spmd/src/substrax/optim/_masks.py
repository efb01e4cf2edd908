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


def mask_from_filter(params: PyTree, filter_: PyTree) -> PyTree:
    """A tree of bools over ``params``: whether each parameter matches the nnx ``filter_``.

    ``params`` may be an ``nnx.State`` of variables or any pytree of arrays; a trailing
    ``.value`` attribute is dropped from each path, so paths read like nnx paths.

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
        parts = tuple(_key_name(k) for k in path)
        if parts and parts[-1] == "value":
            parts = parts[:-1]
        return bool(predicate(parts, leaf))

    return jax.tree_util.tree_map_with_path(
        one, params, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )


def mask_callable(config: OptimizerConfig) -> Callable[[Any], Any]:
    """The mask optax's decoupled decay takes: ``params -> tree of bools``.

    Without a ``weight_decay_filter`` the mask selects every parameter (``...``) rather than
    being None, so the optimizer state has the same tree (optax's ``MaskedState``) whatever the
    filter: a checkpoint of the state restores after the filter is added, changed or removed.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.optim import OptimizerConfig, mask_callable
        >>> mask_callable(OptimizerConfig(learning_rate=1e-3))({"w": jnp.ones(2)})
        {'w': True}
    """
    filter_ = config.weight_decay_filter
    selected = ... if filter_ is None else filter_
    return lambda params: mask_from_filter(params, selected)


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
    params = nnx.state(model, config.wrt)
    filter_ = config.weight_decay_filter
    mask = mask_from_filter(params, filter_ if filter_ is not None else ...)
    return nnx.to_pure_dict(mask) if isinstance(mask, nnx.State) else mask
