"""Sharding strategies: decide the partition spec of a tensor from its dimension names."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from substrax.support import check_int, check_type

from ._config import ParallelismConfig
from ._errors import UnknownStrategyError


_logger = logging.getLogger(__name__)


FSDP_DIMENSION_NAMES = frozenset({"out_features", "features", "hidden", "embed", "mlp"})
"""Dimension names that :class:`FSDPStrategy` splits when they come first."""


def _check_axis(strategy: ShardingStrategy, axes: Mapping[str, int], what: str = "mesh") -> None:
    """Refuse a strategy whose axis ``axes`` (a mesh's shape) lacks, or holds at another index.

    A :class:`PipelineParallelStrategy` must also have one stage per device of its axis.
    """
    names = list(axes)
    axis_name, mesh_axis = strategy.axis_name, strategy.mesh_axis
    who = type(strategy).__name__
    if axis_name not in names:
        msg = (
            f"{who} axis {axis_name!r} is not an axis of the {what} {dict(axes)}; give the "
            f"strategy one of {names}"
        )
        raise ValueError(msg)
    if names.index(axis_name) != mesh_axis:
        msg = (
            f"{who} has mesh_axis={mesh_axis} but {axis_name!r} is axis "
            f"{names.index(axis_name)} of the {what} {dict(axes)}; give its index"
        )
        raise ValueError(msg)
    if isinstance(strategy, PipelineParallelStrategy) and strategy.num_stages != axes[axis_name]:
        msg = (
            f"PipelineParallelStrategy has num_stages={strategy.num_stages} but its axis "
            f"{axis_name!r} has {axes[axis_name]} devices in the {what} {dict(axes)}; give it "
            "one stage per device of the axis"
        )
        raise ValueError(msg)


def _put(array: jax.Array, mesh: Mesh, spec: PartitionSpec, who: str) -> jax.Array:
    """``array`` placed by ``spec``, or a ValueError naming the dimension that does not divide."""
    for dim, axis in enumerate(spec):
        if isinstance(axis, str) and array.shape[dim] % mesh.shape[axis]:
            msg = (
                f"{who} cannot split dimension {dim} (size {array.shape[dim]}) of the array of "
                f"shape {array.shape} over mesh axis {axis!r} of size {mesh.shape[axis]}; make "
                f"that dimension a multiple of {mesh.shape[axis]}, or use a mesh axis that divides it"
            )
            raise ValueError(msg)
    return jax.device_put(array, NamedSharding(mesh, spec))


@dataclass(frozen=True, slots=True)
class ShardingStrategy(ABC):
    """How one kind of parallelism lays tensors out on one mesh axis.

    Attributes:
        axis_name: The mesh axis the strategy uses.
        mesh_axis: The index of that axis in the mesh.

    Raises:
        TypeError: ``axis_name`` is not a str, or ``mesh_axis`` not an int.
        ValueError: ``axis_name`` is empty, or ``mesh_axis`` negative.
    """

    axis_name: str
    mesh_axis: int

    def __post_init__(self) -> None:
        if not check_type("axis_name", self.axis_name, str, "a mesh axis name (a str)"):
            msg = "axis_name='' must name a mesh axis, e.g. 'data'"
            raise ValueError(msg)
        check_int("mesh_axis", self.mesh_axis, minimum=0)

    @abstractmethod
    def get_partition_spec(self, tensor_shape: tuple[str, ...]) -> PartitionSpec:
        """The partition spec of a tensor whose dimensions have these names."""

    @abstractmethod
    def apply_sharding(self, array: jax.Array, mesh: Mesh) -> jax.Array:
        """Place ``array`` on ``mesh`` as this strategy lays it out."""


@dataclass(frozen=True, slots=True)
class DataParallelStrategy(ShardingStrategy):
    """Split the dimension named ``batch``; replicate everything else.

    Example:
        >>> from substrax.mesh import DataParallelStrategy
        >>> DataParallelStrategy("data", 0).get_partition_spec(("batch", "features"))
        P('data', None)
    """

    def get_partition_spec(self, tensor_shape: tuple[str, ...]) -> PartitionSpec:
        """Split only the ``batch`` dimension."""
        return PartitionSpec(*(self.axis_name if d == "batch" else None for d in tensor_shape))

    def apply_sharding(self, array: jax.Array, mesh: Mesh) -> jax.Array:
        """Split the leading (batch) dimension of ``array`` over the axis.

        Raises:
            ValueError: If the axis is not in ``mesh``, or its size does not divide the batch.
        """
        _check_axis(self, mesh.shape)
        spec = PartitionSpec(self.axis_name) if array.ndim else PartitionSpec()
        return _put(array, mesh, spec, "DataParallelStrategy")


@dataclass(frozen=True, slots=True)
class FSDPStrategy(ShardingStrategy):
    """Fully sharded data parallel: split the first dimension of large weights.

    The two ways in choose differently: :meth:`apply_sharding` splits an array by its size
    (a first dimension of at least ``min_weight_size``), and :meth:`get_partition_spec` a shape
    given by dimension names, by its first name (one of :data:`FSDP_DIMENSION_NAMES`: an
    ``("in_features", "out_features")`` kernel is replicated there).

    Attributes:
        min_weight_size: Smallest first dimension that is split.

    Example:
        >>> from substrax.mesh import FSDPStrategy
        >>> FSDPStrategy("data", 0).get_partition_spec(("hidden", "out_features"))
        P('data', None)
    """

    min_weight_size: int = 1024

    def __post_init__(self) -> None:
        ShardingStrategy.__post_init__(self)
        check_int("min_weight_size", self.min_weight_size, minimum=0)

    def should_shard_weight(self, weight: jax.Array) -> bool:
        """Whether ``weight`` is large enough (first dimension >= ``min_weight_size``) to split."""
        return weight.ndim >= 1 and weight.shape[0] >= self.min_weight_size

    def get_partition_spec(self, tensor_shape: tuple[str, ...]) -> PartitionSpec:
        """Split the first dimension when it is a feature dimension; else replicate."""
        if tensor_shape and tensor_shape[0] in FSDP_DIMENSION_NAMES:
            return PartitionSpec(self.axis_name, *([None] * (len(tensor_shape) - 1)))
        return PartitionSpec(*([None] * len(tensor_shape)))

    def get_gradient_partition_spec(self, tensor_shape: tuple[str, ...]) -> PartitionSpec:
        """Gradients are laid out like their weights."""
        return self.get_partition_spec(tensor_shape)

    def apply_sharding(self, array: jax.Array, mesh: Mesh) -> jax.Array:
        """Split the first dimension of a large enough, evenly divisible weight; else replicate.

        A weight large enough whose first dimension the axis does not divide is replicated with
        a warning naming its shape: it costs its full size on every device.
        """
        _check_axis(self, mesh.shape)
        size = mesh.shape[self.axis_name]
        split = self.should_shard_weight(array) and array.shape[0] % size == 0
        if self.should_shard_weight(array) and not split:
            _logger.warning(
                "FSDPStrategy replicates a weight of shape %s on every device: its first "
                "dimension is not divisible by the %r axis (size %d); pad it to a multiple",
                tuple(array.shape),
                self.axis_name,
                size,
            )
        spec = PartitionSpec(self.axis_name) if split else PartitionSpec()
        return jax.device_put(array, NamedSharding(mesh, spec))


_TP_DIMENSIONS = ("in_features", "out_features")


@dataclass(frozen=True, slots=True)
class TensorParallelStrategy(ShardingStrategy):
    """Split layer weights along their input or output features (Megatron style).

    Attributes:
        shard_dimension: ``"out_features"`` (column parallel, the default) or ``"in_features"``.

    Example:
        >>> from substrax.mesh import TensorParallelStrategy
        >>> TensorParallelStrategy("model", 1).get_linear_weight_spec()
        P(None, 'model')
    """

    shard_dimension: str | None = None

    def __post_init__(self) -> None:
        ShardingStrategy.__post_init__(self)
        if self.shard_dimension not in (None, *_TP_DIMENSIONS):
            msg = f"shard_dimension must be one of {_TP_DIMENSIONS} or None; got {self.shard_dimension!r}"
            raise ValueError(msg)

    @property
    def _target(self) -> str:
        return self.shard_dimension or "out_features"

    def get_partition_spec(self, tensor_shape: tuple[str, ...]) -> PartitionSpec:
        """Split the first dimension named like ``shard_dimension`` (or ``heads``)."""
        targets = {self._target, "heads"}
        entries: list[str | None] = [None] * len(tensor_shape)
        for i, name in enumerate(tensor_shape):
            if name in targets:
                entries[i] = self.axis_name
                break
        return PartitionSpec(*entries)

    def get_linear_weight_spec(self) -> PartitionSpec:
        """An ``(in, out)`` kernel: split ``out`` (column) or ``in`` (row)."""
        if self._target == "out_features":
            return PartitionSpec(None, self.axis_name)
        return PartitionSpec(self.axis_name, None)

    def get_attention_qkv_spec(self) -> PartitionSpec:
        """Q, K and V projections ``(embed, heads*dim)``: split the heads (column parallel)."""
        return PartitionSpec(None, self.axis_name)

    def get_attention_output_spec(self) -> PartitionSpec:
        """The output projection ``(heads*dim, embed)``: split the heads (row parallel)."""
        return PartitionSpec(self.axis_name, None)

    def apply_sharding(self, array: jax.Array, mesh: Mesh) -> jax.Array:
        """Split a kernel by :meth:`get_linear_weight_spec`, a bias of a column split; else replicate.

        Raises:
            ValueError: If the axis is not in ``mesh``, or its size does not divide the dimension
                split (named, with the array's shape).
        """
        _check_axis(self, mesh.shape)
        if array.ndim == 2:  # noqa: PLR2004  (a kernel)
            spec = self.get_linear_weight_spec()
        elif array.ndim == 1 and self._target == "out_features":
            spec = PartitionSpec(self.axis_name)
        else:
            spec = PartitionSpec()
        return _put(array, mesh, spec, "TensorParallelStrategy")


@dataclass(frozen=True, slots=True)
class PipelineParallelStrategy(ShardingStrategy):
    """Assign whole layers to pipeline stages; tensors themselves are replicated.

    Attributes:
        num_stages: The number of stages.

    Example:
        >>> from substrax.mesh import PipelineParallelStrategy
        >>> PipelineParallelStrategy("pipeline", 0, num_stages=3).assign_layers_to_stages(8)
        [3, 3, 2]
    """

    num_stages: int = 1

    def __post_init__(self) -> None:
        ShardingStrategy.__post_init__(self)
        check_int("num_stages", self.num_stages, minimum=1)

    def assign_layers_to_stages(self, num_layers: int) -> list[int]:
        """Layers per stage, as even as possible, earlier stages taking the remainder.

        Raises:
            ValueError: If there are fewer layers than stages.
        """
        if num_layers < self.num_stages:
            msg = f"{num_layers} layers cannot fill {self.num_stages} stages; use fewer stages"
            raise ValueError(msg)
        base, extra = divmod(num_layers, self.num_stages)
        return [base + (1 if i < extra else 0) for i in range(self.num_stages)]

    def get_partition_spec(self, tensor_shape: tuple[str, ...]) -> PartitionSpec:
        """Replicated: a stage holds whole layers."""
        return PartitionSpec(*([None] * len(tensor_shape)))

    def get_forward_communication_pattern(self) -> list[tuple[int, int]]:
        """Activations flow from each stage to the next."""
        return [(i, i + 1) for i in range(self.num_stages - 1)]

    def get_backward_communication_pattern(self) -> list[tuple[int, int]]:
        """Gradients flow from each stage to the previous one, last stage first."""
        return [(i + 1, i) for i in reversed(range(self.num_stages - 1))]

    def apply_sharding(self, array: jax.Array, mesh: Mesh) -> jax.Array:
        """Replicate ``array`` over ``mesh``.

        Raises:
            ValueError: If the axis is not in ``mesh`` (or at another index), or its size is
                not ``num_stages``.
        """
        _check_axis(self, mesh.shape)
        return jax.device_put(array, NamedSharding(mesh, PartitionSpec()))


_PRIORITY = ("model", "tensor", "fsdp")


@dataclass(frozen=True, slots=True)
class MultiDimensionalStrategy:
    """Several strategies combined, one spec per tensor.

    Every strategy's axis must be the config's mesh axis at its ``mesh_axis`` index (a
    pipeline's of ``num_stages`` devices), as ``apply_sharding`` requires of a mesh; only
    data-parallel and FSDP strategies may share a mesh axis. When strategies propose
    different axes for one dimension, ``model`` (or ``tensor``) wins, then ``fsdp``, then the
    rest in the order given; a mesh axis is used once per spec.

    Attributes:
        strategies: Strategy name to strategy.
        config: The parallelism configuration they serve.

    Raises:
        TypeError: ``config`` is not a ``ParallelismConfig`` (a ``ShardingConfig``: convert it).
        ValueError: A strategy whose axis the config's mesh lacks, holds at another index, or
            (a pipeline's) sizes other than ``num_stages``; or strategies that share an axis
            though they may not.

    Example:
        >>> from substrax.mesh import ParallelismConfig, ShardingConfig, DataParallelStrategy, MultiDimensionalStrategy, TensorParallelStrategy
        >>> config = ParallelismConfig.from_sharding_config(ShardingConfig(data_parallel_size=2, tensor_parallel_size=4))
        >>> multi = MultiDimensionalStrategy(
        ...     {"data": DataParallelStrategy("data", 0), "model": TensorParallelStrategy("model", 1)}, config)
        >>> multi.get_combined_partition_spec("dense", ("batch", "out_features"))
        P('data', 'model')
    """

    strategies: Mapping[str, ShardingStrategy]
    config: ParallelismConfig
    _order: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, ParallelismConfig):  # pyright: ignore[reportUnnecessaryIsInstance]
            got = type(self.config).__name__  # 0.1.22's users pass a ShardingConfig
            msg = f"config must be a ParallelismConfig, got a {got}; convert a ShardingConfig with"
            raise TypeError(msg + " ParallelismConfig.from_sharding_config(config)")
        object.__setattr__(self, "strategies", MappingProxyType(dict(self.strategies)))
        shareable = (DataParallelStrategy, FSDPStrategy)
        by_axis: dict[str, list[str]] = {}
        for name, strategy in self.strategies.items():
            by_axis.setdefault(strategy.axis_name, []).append(name)
        for axis, names in by_axis.items():
            kinds = [self.strategies[n] for n in names]
            if len(names) > 1 and not all(isinstance(k, shareable) for k in kinds):
                msg = (
                    f"strategies {names} share mesh axis {axis!r}; only data-parallel and FSDP "
                    "strategies may share an axis"
                )
                raise ValueError(msg)
        for strategy in self.strategies.values():
            _check_axis(strategy, self.config.mesh_dict, "config's mesh")
        ranked = [n for n in _PRIORITY if n in self.strategies]
        ranked += [n for n in self.strategies if n not in ranked]
        object.__setattr__(self, "_order", tuple(ranked))

    def get_combined_partition_spec(
        self, tensor_name: str, tensor_shape: tuple[str, ...]
    ) -> PartitionSpec:
        """Every strategy's proposal for this tensor, merged by :meth:`resolve_sharding_conflicts`."""
        proposed = {n: s.get_partition_spec(tensor_shape) for n, s in self.strategies.items()}
        return self.resolve_sharding_conflicts(tensor_name, proposed)

    def resolve_sharding_conflicts(
        self, tensor_name: str, proposed_specs: dict[str, PartitionSpec]
    ) -> PartitionSpec:
        """Merge proposed specs dimension by dimension in priority order.

        Raises:
            UnknownStrategyError: If a proposal comes from a strategy this object does not hold
                (a ``KeyError``).
        """
        unknown = sorted(set(proposed_specs) - set(self.strategies))
        if unknown:
            raise UnknownStrategyError(tensor_name, unknown=unknown, known=list(self._order))
        rank = len(max(proposed_specs.values(), key=len, default=PartitionSpec()))
        merged: list[str | tuple[str, ...] | None] = [None] * rank
        used: set[str] = set()
        for name in self._order:
            spec = proposed_specs.get(name)
            if spec is None:
                continue
            for dim, entry in enumerate(spec):
                if entry is None or merged[dim] is not None:
                    continue
                axes = (entry,) if isinstance(entry, str) else tuple(entry)
                if used.isdisjoint(axes):
                    merged[dim] = entry
                    used.update(axes)
        return PartitionSpec(*merged)
