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

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read);
# each loads from its module on first use (PEP 562), then is kept here.
lazy_exports(__name__)
