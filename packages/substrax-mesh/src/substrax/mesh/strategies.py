"""The sharding strategies and their configs, at the import path the Mesh API documents.

This module's path is an interface: ``substrax.mesh.strategies`` is where the Mesh API document
(and substrax 0.1.22) puts the strategies. It holds no logic; every name is also in
:mod:`substrax.mesh`, and the implementation lives in ``substrax.mesh._strategies`` and
``substrax.mesh._config``.

Example:
    >>> from substrax.mesh.strategies import FSDPStrategy, ShardingConfig
    >>> config = ShardingConfig(data_parallel_size=2, tensor_parallel_size=4, fsdp_enabled=True)
    >>> strategy = FSDPStrategy("model", mesh_axis=1, min_weight_size=config.fsdp_min_weight_size)
    >>> strategy.get_partition_spec(("embed", "mlp"))
    P('model', None)
"""

from ._config import ParallelismConfig, ShardingConfig
from ._strategies import (
    FSDP_DIMENSION_NAMES,
    DataParallelStrategy,
    FSDPStrategy,
    MultiDimensionalStrategy,
    PipelineParallelStrategy,
    ShardingStrategy,
    TensorParallelStrategy,
)


__all__ = [
    "FSDP_DIMENSION_NAMES",
    "DataParallelStrategy",
    "FSDPStrategy",
    "MultiDimensionalStrategy",
    "ParallelismConfig",
    "PipelineParallelStrategy",
    "ShardingConfig",
    "ShardingStrategy",
    "TensorParallelStrategy",
]
