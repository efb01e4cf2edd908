# The public names of substrax.optim, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

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
