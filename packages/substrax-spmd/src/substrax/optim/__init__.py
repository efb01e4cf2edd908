"""Optax transformations and nnx optimizers from one validated config.

Importing this package imports nothing else, not even optax: each name is loaded from its
module when first used (PEP 562).

Example:
    >>> from flax import nnx
    >>> from substrax.optim import EXCLUDE_BIAS_AND_NORM_SCALE, OptimizerConfig, create_optimizer, current_learning_rate
    >>> model = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
    >>> config = OptimizerConfig(optimizer_type="adamw", learning_rate=3e-4, weight_decay=0.01,
    ...                          weight_decay_filter=EXCLUDE_BIAS_AND_NORM_SCALE, gradient_clip_norm=1.0)
    >>> optimizer = create_optimizer(model, config)
    >>> round(float(current_learning_rate(optimizer)), 6)
    0.0003
"""

from typing import TYPE_CHECKING

from substrax.support import lazy_exports


if TYPE_CHECKING:
    from ._build import (
        create_optimizer as create_optimizer,
        create_transformation as create_transformation,
        current_learning_rate as current_learning_rate,
        switch_at as switch_at,
        with_strong_state_types as with_strong_state_types,
    )
    from ._config import (
        DECOUPLED_DECAY_TYPES as DECOUPLED_DECAY_TYPES,
        MOMENTUM_TYPES as MOMENTUM_TYPES,
        OPTIMIZER_TYPES as OPTIMIZER_TYPES,
        OptimizerConfig as OptimizerConfig,
        OptimizerType as OptimizerType,
    )
    from ._errors import (
        LearningRateNotFoundError as LearningRateNotFoundError,
        LineSearchStateError as LineSearchStateError,
        OptimizerConfigError as OptimizerConfigError,
    )
    from ._line_search import update_with_line_search as update_with_line_search
    from ._masks import (
        EXCLUDE_BIAS_AND_NORM_SCALE as EXCLUDE_BIAS_AND_NORM_SCALE,
        mask_callable as mask_callable,
        mask_from_filter as mask_from_filter,
        weight_decay_mask as weight_decay_mask,
    )


# Each public name and the private module that defines it.
_HOMES: dict[str, str] = {
    **dict.fromkeys(
        (
            "create_optimizer",
            "create_transformation",
            "current_learning_rate",
            "switch_at",
            "with_strong_state_types",
        ),
        "_build",
    ),
    **dict.fromkeys(
        (
            "DECOUPLED_DECAY_TYPES",
            "MOMENTUM_TYPES",
            "OPTIMIZER_TYPES",
            "OptimizerConfig",
            "OptimizerType",
        ),
        "_config",
    ),
    **dict.fromkeys(
        ("LearningRateNotFoundError", "LineSearchStateError", "OptimizerConfigError"), "_errors"
    ),
    "update_with_line_search": "_line_search",
    **dict.fromkeys(
        ("EXCLUDE_BIAS_AND_NORM_SCALE", "mask_callable", "mask_from_filter", "weight_decay_mask"),
        "_masks",
    ),
}

__all__ = [
    "DECOUPLED_DECAY_TYPES",
    "EXCLUDE_BIAS_AND_NORM_SCALE",
    "MOMENTUM_TYPES",
    "OPTIMIZER_TYPES",
    "LearningRateNotFoundError",
    "LineSearchStateError",
    "OptimizerConfig",
    "OptimizerConfigError",
    "OptimizerType",
    "create_optimizer",
    "create_transformation",
    "current_learning_rate",
    "mask_callable",
    "mask_from_filter",
    "switch_at",
    "update_with_line_search",
    "weight_decay_mask",
    "with_strong_state_types",
]


# Each name is loaded from its module on first use (PEP 562), then kept here.
lazy_exports(__name__, _HOMES, __all__)
