"""Device meshes with Auto axes, logical-axis rules and sharding strategies.

Three layers, low to high: meshes (:class:`DeviceMeshManager`, :func:`create_device_mesh`,
:func:`create_multihost_mesh`), rules that map logical dimension names onto mesh axes
(:class:`MeshRules`, :class:`LogicalAxisRules`, and :func:`shard_model` /
:func:`create_sharded_model`, which place a flax model annotated with
``nnx.with_partitioning``), and the strategies that choose a spec per tensor.

Importing this package imports nothing else, not even jax: each name is loaded from its module
when first used (PEP 562). Flax comes only with the logical-axis functions
(:func:`logical_to_mesh_spec`, :func:`state_shardings`, :func:`shard_model`,
:func:`create_sharded_model`).

Example:
    >>> import jax
    >>> from flax import nnx
    >>> from substrax.mesh import DeviceMeshManager, fsdp_rules, shard_model
    >>> mesh = DeviceMeshManager.create_device_mesh({"data": 1, "model": 2})
    >>> with nnx.use_eager_sharding(False):
    ...     layer = nnx.Linear(8, 8, rngs=nnx.Rngs(0),
    ...                        kernel_init=nnx.with_partitioning(nnx.initializers.ones, ("embed", "mlp")))
    >>> layer = shard_model(layer, mesh, fsdp_rules())
    >>> layer.kernel.get_value().addressable_shards[0].data.shape
    (4, 8)
"""

from typing import TYPE_CHECKING

from substrax.support import lazy_exports


if TYPE_CHECKING:
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


# Each public name and the private module that defines it.
_HOMES: dict[str, str] = {
    **dict.fromkeys(("ParallelismConfig", "ShardingConfig"), "_config"),
    **dict.fromkeys(
        (
            "MeshShapeError",
            "ShardingAnnotationError",
            "UnknownLogicalAxisError",
            "UnknownStrategyError",
        ),
        "_errors",
    ),
    **dict.fromkeys(
        ("create_sharded_model", "logical_to_mesh_spec", "shard_model", "state_shardings"),
        "_logical",
    ),
    **dict.fromkeys(
        (
            "DeviceMeshManager",
            "MeshInfo",
            "MeshShape",
            "create_device_mesh",
            "create_multihost_mesh",
            "mesh_info",
        ),
        "_meshes",
    ),
    **dict.fromkeys(
        (
            "LogicalAxisRules",
            "MeshAxes",
            "MeshRules",
            "RulesLike",
            "as_logical_rules",
            "create_named_sharding",
            "data_parallel_rules",
            "fsdp_rules",
            "partition_spec_for_names",
        ),
        "_rules",
    ),
    **dict.fromkeys(
        (
            "FSDP_DIMENSION_NAMES",
            "DataParallelStrategy",
            "FSDPStrategy",
            "MultiDimensionalStrategy",
            "PipelineParallelStrategy",
            "ShardingStrategy",
            "TensorParallelStrategy",
        ),
        "_strategies",
    ),
}

__all__ = [
    "FSDP_DIMENSION_NAMES",
    "DataParallelStrategy",
    "DeviceMeshManager",
    "FSDPStrategy",
    "LogicalAxisRules",
    "MeshAxes",
    "MeshInfo",
    "MeshRules",
    "MeshShape",
    "MeshShapeError",
    "MultiDimensionalStrategy",
    "ParallelismConfig",
    "PipelineParallelStrategy",
    "RulesLike",
    "ShardingAnnotationError",
    "ShardingConfig",
    "ShardingStrategy",
    "TensorParallelStrategy",
    "UnknownLogicalAxisError",
    "UnknownStrategyError",
    "as_logical_rules",
    "create_device_mesh",
    "create_multihost_mesh",
    "create_named_sharding",
    "create_sharded_model",
    "data_parallel_rules",
    "fsdp_rules",
    "logical_to_mesh_spec",
    "mesh_info",
    "partition_spec_for_names",
    "shard_model",
    "state_shardings",
]


# Each name is loaded from its module on first use (PEP 562), then kept here.
lazy_exports(__name__, _HOMES, __all__)
