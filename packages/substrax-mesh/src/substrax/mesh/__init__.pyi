# The public names of substrax.mesh, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._config import ParallelismConfig as ParallelismConfig, ShardingConfig as ShardingConfig
from ._errors import (
    MeshShapeError as MeshShapeError,
    ShardingAnnotationError as ShardingAnnotationError,
    UnknownLogicalAxisError as UnknownLogicalAxisError,
    UnknownStrategyError as UnknownStrategyError,
)
from ._logical import (
    create_sharded_model as create_sharded_model,
    logical_to_mesh_spec as logical_to_mesh_spec,
    shard_model as shard_model,
    state_shardings as state_shardings,
)
from ._meshes import (
    DeviceMeshManager as DeviceMeshManager,
    MeshInfo as MeshInfo,
    MeshShape as MeshShape,
    create_device_mesh as create_device_mesh,
    create_multihost_mesh as create_multihost_mesh,
    mesh_info as mesh_info,
)
from ._rules import (
    LogicalAxisRules as LogicalAxisRules,
    MeshAxes as MeshAxes,
    MeshRules as MeshRules,
    RulesLike as RulesLike,
    as_logical_rules as as_logical_rules,
    create_named_sharding as create_named_sharding,
    data_parallel_rules as data_parallel_rules,
    fsdp_rules as fsdp_rules,
    partition_spec_for_names as partition_spec_for_names,
)
from ._strategies import (
    FSDP_DIMENSION_NAMES as FSDP_DIMENSION_NAMES,
    DataParallelStrategy as DataParallelStrategy,
    FSDPStrategy as FSDPStrategy,
    MultiDimensionalStrategy as MultiDimensionalStrategy,
    PipelineParallelStrategy as PipelineParallelStrategy,
    ShardingStrategy as ShardingStrategy,
    TensorParallelStrategy as TensorParallelStrategy,
)
