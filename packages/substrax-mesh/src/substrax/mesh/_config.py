"""Parallelism sizes and the mesh topology that holds them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Self

from substrax.support import check_int


@dataclass(frozen=True, slots=True)
class ShardingConfig:
    """How many devices each kind of parallelism uses.

    Attributes:
        data_parallel_size: Replicas that each see a slice of the batch.
        tensor_parallel_size: Devices a layer's weights are split over.
        pipeline_parallel_size: Pipeline stages.
        fsdp_enabled: Whether parameters are sharded over the data axis too.
        fsdp_min_weight_size: Smallest first dimension that FSDP splits.

    Example:
        >>> from substrax.mesh import ShardingConfig
        >>> ShardingConfig(data_parallel_size=2, tensor_parallel_size=4).get_total_device_count()
        8
    """

    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    fsdp_enabled: bool = False
    fsdp_min_weight_size: int = 1024

    def __post_init__(self) -> None:
        check_int("data_parallel_size", self.data_parallel_size, minimum=1)
        check_int("tensor_parallel_size", self.tensor_parallel_size, minimum=1)
        check_int("pipeline_parallel_size", self.pipeline_parallel_size, minimum=1)
        check_int("fsdp_min_weight_size", self.fsdp_min_weight_size, minimum=0)

    def get_total_device_count(self) -> int:
        """The devices this configuration needs: the product of the three sizes."""
        return self.data_parallel_size * self.tensor_parallel_size * self.pipeline_parallel_size

    @classmethod
    def from_device_count(cls, device_count: int) -> Self:
        """A balanced configuration that uses exactly ``device_count`` devices.

        Up to 4 devices are all data parallel; 8 become 2 data x 4 tensor; otherwise the
        tensor size is the largest divisor of the count not above ``min(8, isqrt(count))``.

        Example:
            >>> from substrax.mesh import ShardingConfig
            >>> ShardingConfig.from_device_count(8)
            ShardingConfig(data_parallel_size=2, tensor_parallel_size=4, pipeline_parallel_size=1, fsdp_enabled=False, fsdp_min_weight_size=1024)
        """
        check_int("device_count", device_count, minimum=1)
        if device_count <= 4:  # noqa: PLR2004  (the documented heuristic)
            return cls(data_parallel_size=device_count)
        if device_count == 8:  # noqa: PLR2004
            return cls(data_parallel_size=2, tensor_parallel_size=4)
        limit = min(8, math.isqrt(device_count))
        tp = max(d for d in range(1, limit + 1) if device_count % d == 0)
        return cls(data_parallel_size=device_count // tp, tensor_parallel_size=tp)


@dataclass(frozen=True, slots=True)
class ParallelismConfig:
    """A mesh topology together with the sharding configuration it serves.

    Attributes:
        mesh_shape: Size of each mesh axis.
        mesh_axis_names: Name of each mesh axis.
        sharding_config: The parallelism sizes.

    Example:
        >>> from substrax.mesh import ParallelismConfig, ShardingConfig
        >>> config = ParallelismConfig.from_sharding_config(ShardingConfig(data_parallel_size=2, tensor_parallel_size=4))
        >>> config.mesh_shape, config.mesh_axis_names, config.is_valid()
        ((2, 4), ('data', 'model'), True)
    """

    mesh_shape: tuple[int, ...]
    mesh_axis_names: tuple[str, ...]
    sharding_config: ShardingConfig

    def __post_init__(self) -> None:
        object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        object.__setattr__(self, "mesh_axis_names", tuple(self.mesh_axis_names))
        if len(self.mesh_shape) != len(self.mesh_axis_names):
            msg = (
                f"mesh_shape {self.mesh_shape} and mesh_axis_names {self.mesh_axis_names} "
                "differ in length; give one name per axis"
            )
            raise ValueError(msg)
        if len(set(self.mesh_axis_names)) != len(self.mesh_axis_names):
            msg = f"mesh_axis_names {self.mesh_axis_names} repeat a name"
            raise ValueError(msg)
        for index, size in enumerate(self.mesh_shape):
            check_int(f"mesh_shape[{index}]", size, minimum=1)

    def is_valid(self) -> bool:
        """Whether the mesh holds what the sharding configuration needs.

        It must hold exactly the devices the configuration needs, and each axis named as
        :meth:`from_sharding_config` names them (``data``, ``model``, ``pipeline``) must have
        the configuration's size for it. Axes of other names are checked by the count only.

        Example:
            >>> from substrax.mesh import ParallelismConfig, ShardingConfig
            >>> config = ShardingConfig(data_parallel_size=2, tensor_parallel_size=4)
            >>> ParallelismConfig((2, 4), ("data", "model"), config).is_valid()
            True
            >>> ParallelismConfig((2, 4), ("model", "data"), config).is_valid()  # data=4, model=2
            False
        """
        config = self.sharding_config
        sizes = {
            "data": config.data_parallel_size,
            "model": config.tensor_parallel_size,
            "pipeline": config.pipeline_parallel_size,
        }
        if math.prod(self.mesh_shape) != config.get_total_device_count():
            return False
        return all(sizes.get(name, size) == size for name, size in self.mesh_dict.items())

    @property
    def mesh_dict(self) -> dict[str, int]:
        """The mesh shape as ``{name: size}``, ready for ``create_device_mesh``."""
        return dict(zip(self.mesh_axis_names, self.mesh_shape, strict=True))

    @classmethod
    def from_sharding_config(cls, config: ShardingConfig) -> Self:
        """The mesh for ``config``: axes ``data``, ``model``, ``pipeline`` for sizes above 1.

        A configuration of one device gets the single axis ``data`` of size 1.
        """
        sizes = (
            ("data", config.data_parallel_size),
            ("model", config.tensor_parallel_size),
            ("pipeline", config.pipeline_parallel_size),
        )
        kept = [(n, s) for n, s in sizes if s > 1] or [("data", 1)]
        return cls(tuple(s for _, s in kept), tuple(n for n, _ in kept), config)
