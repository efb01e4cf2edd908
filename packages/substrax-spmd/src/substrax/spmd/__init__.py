"""Data-parallel placement, the SPMD train step, a fast compiled step, and collectives.

Importing this package imports nothing else, not even jax: each name is loaded from its module
when first used (PEP 562).

Example:
    >>> import jax, numpy as np, optax
    >>> from flax import nnx
    >>> from substrax.mesh import DeviceMeshManager
    >>> from substrax.spmd import TrainStep, create_data_parallel_sharding, place_batch_on_shards
    >>> mesh = DeviceMeshManager.create_device_mesh({"data": 2})
    >>> sharding = create_data_parallel_sharding(mesh)
    >>> model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    >>> optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    >>> step = TrainStep(model, optimizer, lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(), mesh=mesh)
    >>> batch = place_batch_on_shards({"x": np.ones((8, 3)), "y": np.zeros((8, 1))}, sharding)
    >>> loss = step(batch)
    >>> step.model.kernel.get_value().shape
    (3, 1)
"""

from typing import TYPE_CHECKING

from substrax.support import lazy_exports


if TYPE_CHECKING:
    from ._cost import StepCost as StepCost
    from ._errors import (
        BatchPlacementError as BatchPlacementError,
        BatchSplitError as BatchSplitError,
        OptimizerMismatchError as OptimizerMismatchError,
        UnknownAxisError as UnknownAxisError,
        UnknownReductionError as UnknownReductionError,
    )
    from ._eval_step import EvalStep as EvalStep
    from ._placement import (
        create_data_parallel_sharding as create_data_parallel_sharding,
        place_batch_on_shards as place_batch_on_shards,
        place_nnx_state_on_shards as place_nnx_state_on_shards,
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
    from ._step import spmd_train_step as spmd_train_step
    from ._train_step import TrainStep as TrainStep, make_train_step as make_train_step


# Each public name and the private module that defines it.
_HOMES: dict[str, str] = {
    **dict.fromkeys(("BatchPlacementError", "BatchSplitError", "UnknownReductionError"), "_errors"),
    **dict.fromkeys(("OptimizerMismatchError", "UnknownAxisError"), "_errors"),
    "EvalStep": "_eval_step",
    "StepCost": "_cost",
    "PrecisionPolicy": "_precision",
    **dict.fromkeys(
        ("create_data_parallel_sharding", "place_batch_on_shards", "place_nnx_state_on_shards"),
        "_placement",
    ),
    **dict.fromkeys(
        (
            "REDUCTIONS",
            "Reduction",
            "all_gather",
            "collect_from_devices",
            "reduce_custom",
            "reduce_gradient_tree",
            "reduce_max",
            "reduce_mean",
            "reduce_mean_collective",
            "reduce_min",
            "reduce_sum",
            "reduce_sum_collective",
        ),
        "_reductions",
    ),
    "spmd_train_step": "_step",
    **dict.fromkeys(("TrainStep", "make_train_step"), "_train_step"),
}

__all__ = [
    "REDUCTIONS",
    "BatchPlacementError",
    "BatchSplitError",
    "EvalStep",
    "OptimizerMismatchError",
    "PrecisionPolicy",
    "Reduction",
    "StepCost",
    "TrainStep",
    "UnknownAxisError",
    "UnknownReductionError",
    "all_gather",
    "collect_from_devices",
    "create_data_parallel_sharding",
    "make_train_step",
    "place_batch_on_shards",
    "place_nnx_state_on_shards",
    "reduce_custom",
    "reduce_gradient_tree",
    "reduce_max",
    "reduce_mean",
    "reduce_mean_collective",
    "reduce_min",
    "reduce_sum",
    "reduce_sum_collective",
    "spmd_train_step",
]


# Each name is loaded from its module on first use (PEP 562), then kept here.
lazy_exports(__name__, _HOMES, __all__)
