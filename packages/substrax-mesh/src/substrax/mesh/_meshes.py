"""Device meshes: every axis Auto by default, with errors that say what to do."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from substrax.devices import visible_devices
from substrax.support import check_int, check_type

from ._errors import MeshShapeError


type MeshShape = Mapping[str, int] | Sequence[tuple[str, int]]


_PAIR = 2
_logger = logging.getLogger(__name__)
_warned_smaller: set[tuple[int, int, bool]] = set()


def _warn_smaller_mesh(shape: dict[str, int], needed: int, available: int, *, given: bool) -> None:
    """Say once per (mesh size, device count) that a mesh leaves devices unused."""
    if (needed, available, given) in _warned_smaller:
        return
    _warned_smaller.add((needed, available, given))
    if given:  # the caller chose the devices, and more of them than the mesh takes
        text = "mesh shape %s takes the first %d of the %d devices given; pass as many as it takes"
        _logger.warning(text, shape, needed, available)
        return
    _logger.warning(
        "mesh shape %s uses %d of the %d devices; the other %d are left out and stay idle. "
        "Size the mesh to every device (e.g. {'data': jax.device_count()}), or pass devices= "
        "to choose them (said once per mesh size)",
        shape,
        needed,
        available,
        available - needed,
    )


def _normalize_shape(mesh_shape: MeshShape) -> dict[str, int]:
    pairs = list(mesh_shape.items()) if isinstance(mesh_shape, Mapping) else list(mesh_shape)
    shape: dict[str, int] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == _PAIR):  # pyright: ignore[reportUnnecessaryIsInstance]
            msg = f"mesh shape entries must be (name, size) pairs; got {pair!r}"
            raise TypeError(msg)
        name, size = pair
        if not isinstance(name, str) or not name:  # pyright: ignore[reportUnnecessaryIsInstance]
            msg = f"mesh axis names must be non-empty strings; got {name!r} in {pairs!r}"
            raise TypeError(msg)
        if name in shape:
            msg = f"mesh axis {name!r} appears twice in {pairs!r}; give every axis one size"
            raise MeshShapeError(msg, mesh_shape=dict(pairs), device_count=-1)
        if isinstance(size, np.integer):  # numpy's ints are sizes too (np.int64(2))
            size = int(size)
        try:
            shape[name] = check_int(f"mesh axis {name!r} has size", size, minimum=1)
        except (TypeError, ValueError) as error:
            msg = f"{error}; give every axis a positive size"
            raise MeshShapeError(msg, mesh_shape=dict(pairs), device_count=-1) from None
    if not shape:
        msg = "mesh shape is empty; name at least one axis, e.g. {'data': jax.device_count()}"
        raise MeshShapeError(msg, mesh_shape={}, device_count=-1)
    return shape


def _normalize_dcn(dcn_shape: Mapping[str, int] | None, ici: dict[str, int]) -> dict[str, int]:
    given = cast("object", {} if dcn_shape is None else dcn_shape)
    check_type("dcn_shape", given, Mapping, "a mapping from axis name to a slice count, or None")
    dcn = dict(cast("Mapping[str, object]", given))
    unknown = sorted(set(dcn) - set(ici))
    if unknown:
        msg = f"dcn_shape names axes {unknown} that ici_shape {ici} lacks; add them with size 1"
        raise MeshShapeError(msg, mesh_shape=ici, device_count=-1)
    try:
        return {
            n: check_int(f"dcn_shape axis {n!r} has size", v, minimum=1) for n, v in dcn.items()
        }
    except (TypeError, ValueError) as error:
        msg = f"{error}; give each dcn_shape axis the number of slices or processes along it"
        raise MeshShapeError(msg, mesh_shape=ici, device_count=-1) from None


def create_device_mesh(
    mesh_shape: MeshShape,
    devices: Sequence[Any] | None = None,
    *,
    axis_types: Sequence[AxisType] | None = None,
) -> Mesh:
    """Create a mesh of the given shape, every axis ``AxisType.Auto`` unless told otherwise.

    Uses the first ``prod(sizes)`` of ``devices`` (all visible devices by default), laid
    out by ``jax.make_mesh`` so that neighbouring mesh positions are close on the hardware.
    A mesh that leaves devices out is logged once (a WARNING on ``substrax.mesh``) per mesh
    size and device count, naming how many stay idle.

    Args:
        mesh_shape: Axis name to size, as a mapping or a list of ``(name, size)`` pairs.
        devices: The devices to use; ``substrax.devices.visible_devices()`` when None.
        axis_types: One ``AxisType`` per axis; Auto for every axis when None.

    Returns:
        The mesh.

    Raises:
        MeshShapeError: If the shape needs more devices than there are, or is malformed.
        ValueError: If ``axis_types`` does not give one type per axis.

    Example:
        >>> from substrax.mesh import create_device_mesh
        >>> mesh = create_device_mesh({"data": 2})
        >>> dict(mesh.shape)
        {'data': 2}
    """
    shape = _normalize_shape(mesh_shape)
    # an array of devices (mesh_utils' layout) is read in its order, as jax.make_mesh does
    pool = list(visible_devices() if devices is None else np.ravel(np.asarray(devices)))
    needed = math.prod(shape.values())
    if needed > len(pool):
        where = "are visible (set JAX_NUM_CPU_DEVICES or pass devices=)"
        msg = f"mesh shape {shape} needs {needed} devices; {len(pool)} " + (
            where if devices is None else "were given in devices="
        )
        raise MeshShapeError(msg, mesh_shape=shape, device_count=len(pool))
    if len(set(pool[:needed])) != needed:
        msg = (
            f"devices for mesh shape {shape} name a device twice ({pool[:needed]}); give each once"
        )
        raise MeshShapeError(msg, mesh_shape=shape, device_count=len(set(pool)))
    if needed < len(pool):
        _warn_smaller_mesh(shape, needed, len(pool), given=devices is not None)
    if axis_types is None:
        types = (AxisType.Auto,) * len(shape)
    else:
        types = tuple(axis_types)
        if len(types) != len(shape):
            msg = (
                f"axis_types has {len(types)} entries for the {len(shape)} axes of {shape}; "
                "give one AxisType per axis"
            )
            raise ValueError(msg)
    return jax.make_mesh(tuple(shape.values()), tuple(shape), types, devices=pool[:needed])


def _granules(pool: Sequence[Any]) -> tuple[int, bool]:
    """How many DCN granules ``pool`` spans, and whether they are TPU slices (else processes)."""
    slices = {getattr(d, "slice_index", None) for d in pool}
    if None not in slices and len(slices) > 1:
        return len(slices), True
    return len({getattr(d, "process_index", 0) for d in pool}), False


def create_multihost_mesh(
    ici_shape: MeshShape,
    dcn_shape: Mapping[str, int] | None = None,
    *,
    devices: Sequence[Any] | None = None,
    axis_types: Sequence[AxisType] | None = None,
) -> Mesh:
    """Create a mesh over the devices of every process, DCN-aware where it matters.

    Each axis has size ``ici_shape[name] * dcn_shape.get(name, 1)``. The ``ici_shape`` is the
    layout inside one slice (or one process, on CPU and GPU hosts), ``dcn_shape`` how slices
    are stacked along each axis over the data-centre network; the devices are placed with
    ``jax.experimental.mesh_utils.create_hybrid_device_mesh`` so that only the DCN axes cross
    hosts. With no ``dcn_shape`` this is :func:`create_device_mesh` over all devices of all
    processes.

    Args:
        ici_shape: Axis name to size within one slice (TPU) or one process.
        dcn_shape: Axis name to the number of slices or processes stacked along it.
        devices: The devices to use; ``jax.devices()`` (every process's) when None.
        axis_types: One ``AxisType`` per axis; Auto for every axis when None.

    Returns:
        The global mesh.

    Raises:
        MeshShapeError: If the shape needs more devices than there are (fewer are used, as
            :func:`create_device_mesh` uses them, with a warning), ``dcn_shape`` names an
            axis ``ici_shape`` lacks or has a size that is not an int >= 1, or its sizes do not
            multiply to the number of slices (TPU) or processes the devices span.

    Example:
        >>> from substrax.mesh import create_multihost_mesh
        >>> mesh = create_multihost_mesh({"data": 2, "model": 1})
        >>> dict(mesh.shape)
        {'data': 2, 'model': 1}
    """
    ici = _normalize_shape(ici_shape)
    dcn = _normalize_dcn(dcn_shape, ici)
    full = {name: size * dcn.get(name, 1) for name, size in ici.items()}
    pool = list(visible_devices() if devices is None else np.ravel(np.asarray(devices)))
    if all(v == 1 for v in dcn.values()) and (dcn_shape is None or _granules(pool)[0] == 1):
        return create_device_mesh(full, devices, axis_types=axis_types)
    if math.prod(full.values()) != len(pool):
        msg = (
            f"multi-host mesh shape {full} (ici {ici} x dcn {dcn}) needs "
            f"{math.prod(full.values())} devices; {len(pool)} are visible across all processes"
        )
        raise MeshShapeError(msg, mesh_shape=full, device_count=len(pool))
    from jax.experimental import mesh_utils  # noqa: PLC0415  (rarely needed)

    granules, by_slice = _granules(pool)
    if math.prod(dcn.values()) != granules:
        unit = "slices" if by_slice else "processes"
        msg = (
            f"dcn_shape {dcn} stacks {math.prod(dcn.values())} {unit}, but the {len(pool)} "
            f"devices span {granules} {unit}; make the product of dcn_shape {granules} (ici_shape "
            "being the layout inside one), or leave dcn_shape out on a single host"
        )
        raise MeshShapeError(msg, mesh_shape=full, device_count=len(pool))
    grid = mesh_utils.create_hybrid_device_mesh(
        list(ici.values()),
        [dcn.get(name, 1) for name in ici],
        pool,
        process_is_granule=not by_slice,
    )
    types = (AxisType.Auto,) * len(full) if axis_types is None else tuple(axis_types)
    if len(types) != len(full):
        msg = f"axis_types has {len(types)} entries for the {len(full)} axes of {full}"
        raise ValueError(msg)
    return Mesh(cast("np.ndarray[Any, Any]", grid), tuple(full), axis_types=types)


@dataclass(frozen=True, slots=True)
class MeshInfo(Mapping[str, object]):
    """What a mesh holds: its device count and the size of each axis.

    Reads like the documented dict ``{"total_devices": int, "axes": {name: size}}``: it is a
    read-only mapping with those two keys, compares equal to that dict and prints as it.

    Attributes:
        total_devices: The number of devices in the mesh.
        axes: Axis name to size, in mesh order.

    Example:
        >>> from substrax.mesh import MeshInfo
        >>> info = MeshInfo(total_devices=8, axes={"data": 8})
        >>> info == {"total_devices": 8, "axes": {"data": 8}}
        True
        >>> info["axes"]["data"]
        8
    """

    total_devices: int
    axes: Mapping[str, int] = field(default_factory=dict[str, int])

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", MappingProxyType(dict(self.axes)))

    def as_dict(self) -> dict[str, int | dict[str, int]]:
        """The documented plain-dict form."""
        return {"total_devices": self.total_devices, "axes": dict(self.axes)}

    def __getitem__(self, key: str) -> object:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("total_devices", "axes"))

    def __len__(self) -> int:
        return 2

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MeshInfo):
            return self.as_dict() == other.as_dict()
        if isinstance(other, Mapping):
            return self.as_dict() == dict(cast("Mapping[str, object]", other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.total_devices, tuple(self.axes.items())))

    def __str__(self) -> str:
        return str(self.as_dict())


def mesh_info(mesh: Mesh) -> MeshInfo:
    """Describe a mesh.

    Args:
        mesh: The mesh to describe.

    Returns:
        Its device count and axis sizes.

    Raises:
        TypeError: ``mesh`` is not a ``jax.sharding.Mesh``.

    Example:
        >>> from substrax.mesh import create_device_mesh, mesh_info
        >>> mesh_info(create_device_mesh({"data": 2})).axes["data"]
        2
    """
    check_type("mesh", mesh, Mesh, "a jax.sharding.Mesh, e.g. create_device_mesh({'data': 2})")
    return MeshInfo(total_devices=int(mesh.devices.size), axes=dict(mesh.shape))


class DeviceMeshManager:
    """Static helpers that build device meshes for common layouts.

    Every mesh has Auto axes, so XLA infers the collectives of a batch-sharded step.

    Example:
        >>> from substrax.mesh import DeviceMeshManager
        >>> mesh = DeviceMeshManager.create_hybrid_mesh(data_parallel_size=2, model_parallel_size=2)
        >>> DeviceMeshManager.get_mesh_info(mesh)["axes"]
        {'data': 2, 'model': 2}
    """

    create_device_mesh = staticmethod(create_device_mesh)
    create_multihost_mesh = staticmethod(create_multihost_mesh)

    @staticmethod
    def get_mesh_info(mesh: Mesh) -> dict[str, int | dict[str, int]]:
        """Describe a mesh as the documented plain dict, which ``json.dumps`` accepts.

        Args:
            mesh: The device mesh to inspect.

        Returns:
            ``{"total_devices": int, "axes": {name: size}}``, axes in mesh order (a new dict
            each call). :func:`mesh_info` gives the same as a typed, read-only ``MeshInfo``.

        Raises:
            TypeError: ``mesh`` is not a ``jax.sharding.Mesh``.

        Example:
            >>> import json
            >>> from substrax.mesh import DeviceMeshManager
            >>> mesh = DeviceMeshManager.create_hybrid_mesh(2, 4)
            >>> json.dumps(DeviceMeshManager.get_mesh_info(mesh))
            '{"total_devices": 8, "axes": {"data": 2, "model": 4}}'
        """
        return mesh_info(mesh).as_dict()

    @staticmethod
    def create_data_parallel_mesh(num_devices: int | None = None) -> Mesh:
        """Create a one-axis mesh named ``data``.

        Args:
            num_devices: How many devices to use; all visible devices when None.

        Raises:
            MeshShapeError: If more devices are asked for than are visible.

        Example:
            >>> from substrax.mesh import DeviceMeshManager
            >>> DeviceMeshManager.create_data_parallel_mesh(2).axis_names
            ('data',)
        """
        count = len(visible_devices()) if num_devices is None else num_devices
        return create_device_mesh({"data": count})

    @staticmethod
    def create_model_parallel_mesh(num_devices: int) -> Mesh:
        """Create a one-axis mesh named ``model``.

        Args:
            num_devices: How many devices to split the model over.

        Raises:
            MeshShapeError: If more devices are asked for than are visible.

        Example:
            >>> from substrax.mesh import DeviceMeshManager
            >>> DeviceMeshManager.create_model_parallel_mesh(2).axis_names
            ('model',)
        """
        return create_device_mesh({"model": num_devices})

    @staticmethod
    def create_hybrid_mesh(data_parallel_size: int, model_parallel_size: int) -> Mesh:
        """Create a two-axis ``(data, model)`` mesh.

        Args:
            data_parallel_size: Size of the ``data`` axis.
            model_parallel_size: Size of the ``model`` axis.

        Raises:
            MeshShapeError: If the product exceeds the visible devices.

        Example:
            >>> from substrax.mesh import DeviceMeshManager
            >>> dict(DeviceMeshManager.create_hybrid_mesh(2, 2).shape)
            {'data': 2, 'model': 2}
        """
        return create_device_mesh({"data": data_parallel_size, "model": model_parallel_size})
