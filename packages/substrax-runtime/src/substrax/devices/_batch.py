"""Putting a host batch on devices: split one dimension over them, or copy it to each.

This module imports jax; ``substrax.devices`` loads it when one of its names is first used.
For per-subtree shardings on a mesh of several axes, ``substrax.spmd.place_batch_on_shards``
is the general tool; these cover the two layouts a batch needs without a mesh of its own.
"""

from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from substrax.support import check_int
from substrax.typing import PyTree

from ._errors import BatchDimensionError
from ._info import DeviceLike


_ARRAY_TYPES = (np.ndarray, np.generic, jax.Array)


def _is_process_local(leaf: object) -> bool:
    """Whether ``leaf`` is rows this process holds rather than a global array across processes."""
    return not (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable)


def _place(
    batch: PyTree, sharding: NamedSharding, check: Callable[[str, object], None] | None = None
) -> PyTree:
    """Put every array leaf of ``batch`` on ``sharding`` in one call; other leaves pass through."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(batch)
    leaves = [leaf for _, leaf in flat]
    index = [i for i, leaf in enumerate(leaves) if isinstance(leaf, _ARRAY_TYPES)]
    for i in index:
        if check is not None:
            check(jax.tree_util.keystr(flat[i][0]), leaves[i])
    rows = [i for i in index if _is_process_local(leaves[i])]
    if rows:
        # On one process this is one batched device_put; on several, each process passes the
        # rows it holds and jax assembles the global arrays.
        made = jax.make_array_from_process_local_data(
            [sharding] * len(rows), [leaves[i] for i in rows]
        )
        for i, array in zip(rows, made, strict=True):
            leaves[i] = array
    for i in index:
        if not _is_process_local(leaves[i]):
            leaves[i] = jax.device_put(leaves[i], sharding)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def shard_batch_dim(
    batch: PyTree, mesh: Mesh, batch_axis: int = 0, mesh_axis: str = "data"
) -> PyTree:
    """Split dimension ``batch_axis`` of every array leaf over ``mesh_axis``; replicate the rest.

    Array leaves (``jax.Array``, NumPy arrays and scalars) become global arrays on
    ``NamedSharding(mesh, P(None, ..., mesh_axis))``; any other leaf (a string, a Python
    number) is returned as it is. On several processes each process passes the rows it
    loaded and jax assembles the global array. Call it outside ``jax.jit``.

    Args:
        batch: A pytree of host arrays.
        mesh: The mesh whose axis the batch dimension is split over.
        batch_axis: The dimension to split (0: the leading one).
        mesh_axis: The mesh axis to split it over.

    Returns:
        The batch with every array leaf placed.

    Raises:
        BatchDimensionError: A ``ValueError``: a leaf has no dimension ``batch_axis``, or (on
            one process) the axis size does not divide it; the message names the leaf's path.
        ValueError: ``mesh_axis`` is not an axis of ``mesh``, or ``batch_axis`` is negative.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> from substrax.devices import shard_batch_dim
        >>> mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
        >>> placed = shard_batch_dim({"x": np.ones((3, 8)), "id": "b0"}, mesh, batch_axis=1)
        >>> placed["x"].sharding.spec, placed["x"].addressable_shards[0].data.shape, placed["id"]
        (P(None, 'data'), (3, 2), 'b0')
    """
    check_int("batch_axis", batch_axis, minimum=0)
    if mesh_axis not in mesh.axis_names:
        msg = f"mesh_axis {mesh_axis!r} is not an axis of the mesh {dict(mesh.shape)}; pass mesh_axis="
        raise ValueError(msg)
    parts = int(mesh.shape[mesh_axis])
    whole = jax.process_count() == 1

    def check(path: str, leaf: object) -> None:
        shape = tuple(int(n) for n in np.shape(cast("np.ndarray[Any, Any]", leaf)))
        uneven = whole and len(shape) > batch_axis and shape[batch_axis] % parts
        if len(shape) <= batch_axis or uneven:
            raise BatchDimensionError(path=path, shape=shape, batch_axis=batch_axis, parts=parts)

    spec = PartitionSpec(*([None] * batch_axis), mesh_axis)
    return _place(batch, NamedSharding(mesh, spec), check)


def _local_mesh(devices: Sequence[DeviceLike] | None) -> Mesh:
    chosen = jax.local_devices() if devices is None else list(devices)
    if not chosen:
        msg = "devices is empty; pass at least one device, or None for this process's devices"
        raise ValueError(msg)
    grid = np.empty(len(chosen), dtype=object)
    grid[:] = chosen
    return Mesh(cast("np.ndarray[Any, Any]", grid), ("data",), axis_types=(AxisType.Auto,))


def distribute_batch(
    batch: PyTree, devices: Sequence[DeviceLike] | None = None, *, batch_axis: int = 0
) -> PyTree:
    """Split a host batch over this process's devices, an equal slice of ``batch_axis`` each.

    Each array leaf becomes one ``jax.Array`` over a one-axis ``data`` mesh of ``devices``;
    other leaves pass through. Use it for data parallelism within one process without building
    a mesh; across processes, shard over a global mesh with :func:`shard_batch_dim`.

    Args:
        batch: A pytree of host arrays, the same leading batch size in every array leaf.
        devices: The devices to split over; ``jax.local_devices()`` when None.
        batch_axis: The dimension to split.

    Returns:
        The batch with every array leaf split over the devices.

    Raises:
        BatchDimensionError: A leaf has no dimension ``batch_axis``, or the device count does
            not divide it.
        ValueError: ``devices`` is empty.

    Example:
        >>> import jax, numpy as np
        >>> from substrax.devices import distribute_batch
        >>> placed = distribute_batch({"x": np.arange(16.0).reshape(8, 2)})
        >>> len(placed["x"].addressable_shards) == jax.local_device_count()
        True
    """
    return shard_batch_dim(batch, _local_mesh(devices), batch_axis=batch_axis)


def replicate_across_devices(pytree: PyTree, devices: Sequence[DeviceLike] | None = None) -> PyTree:
    """Give every device a full copy of each array leaf (one replicated ``jax.Array`` each).

    Args:
        pytree: Arrays or array-likes in any pytree; other leaves pass through.
        devices: The devices to copy to; ``jax.local_devices()`` when None.

    Returns:
        The same structure, every array leaf replicated over ``devices``.

    Raises:
        ValueError: ``devices`` is empty.

    Example:
        >>> import jax, numpy as np
        >>> from substrax.devices import replicate_across_devices
        >>> params = replicate_across_devices({"w": np.ones(3)}, jax.devices()[:2])
        >>> [shard.data.shape for shard in params["w"].addressable_shards]
        [(3,), (3,)]
    """
    sharding = NamedSharding(_local_mesh(devices), PartitionSpec())
    return _place(pytree, sharding)
