# The public names of substrax.spmd, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._cost import StepCost as StepCost
from ._errors import (
    BatchPlacementError as BatchPlacementError,
    BatchSplitError as BatchSplitError,
    OptimizerMismatchError as OptimizerMismatchError,
    StateChangedError as StateChangedError,
    UnknownAxisError as UnknownAxisError,
    UnknownReductionError as UnknownReductionError,
)
from ._eval_step import EvalStep as EvalStep
from ._placement import (
    create_data_parallel_sharding as create_data_parallel_sharding,
    place_batch_on_shards as place_batch_on_shards,
)
from ._precision import PrecisionPolicy as PrecisionPolicy
from ._reductions import (
    REDUCTIONS as REDUCTIONS,
    Reduction as Reduction,
    all_gather as all_gather,
    collect_from_devices as collect_from_devices,
    reduce_custom as reduce_custom,
    reduce_gradient_tree as reduce_gradient_tree,
    reduce_max as reduce_max,
    reduce_mean as reduce_mean,
    reduce_mean_collective as reduce_mean_collective,
    reduce_min as reduce_min,
    reduce_sum as reduce_sum,
    reduce_sum_collective as reduce_sum_collective,
)
from ._state_placement import place_nnx_state_on_shards as place_nnx_state_on_shards
from ._step import spmd_train_step as spmd_train_step
from ._train_step import TrainStep as TrainStep, make_train_step as make_train_step
