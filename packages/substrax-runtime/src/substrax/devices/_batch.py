"""Putting a host batch on devices: split one dimension over them, or copy it to each.

This module imports jax only as a function here runs, so ``from substrax.devices import
distribute_batch`` leaves jax unimported (a later ``apply_runtime`` still applies).
For per-subtree shardings on a mesh of several axes, ``substrax.spmd.place_batch_on_shards``
is the general tool; these cover the two layouts a batch needs without a mesh of its own.
"""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from substrax.typing import PyTree

from ._errors import BatchDimensionError, BatchDtypeError, BatchSizeMismatchError
from ._info import DeviceLike
from ._narrowing import check_fits_32_bits
from ._numbers import check_index


if TYPE_CHECKING:
    from jax.sharding import Mesh, NamedSharding


# NumPy dtype kinds kept on the host as they are, like a Python string: str, bytes, object.
_HOST_KINDS = frozenset("USO")


def _is_process_local(leaf: object) -> bool:
    """Whether ``leaf`` is rows this process holds rather than a global array across processes."""
    import jax  # noqa: PLC0415  (importing this module imports no jax)

    return not (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable)


def _array_to_place(path: str, leaf: object) -> object | None:
    """What to place for ``leaf``: the array (big-endian made native), or None to pass it through.

    Raises:
        BatchDtypeError: A NumPy leaf jax cannot hold (a masked array, a datetime or a
            structured dtype), or a 64-bit one whose values jax would change as it narrows
            them to 32 bits (``jax_enable_x64`` off); strings, bytes and objects pass through.
    """
    import jax  # noqa: PLC0415  (see _is_process_local)

    if isinstance(leaf, jax.Array):
        return leaf
    if not isinstance(leaf, np.ndarray | np.generic):
        return None
    dtype = cast("np.dtype[Any]", leaf.dtype)
    if dtype.kind in _HOST_KINDS:
        return None
    if isinstance(leaf, np.ma.MaskedArray):
        raise BatchDtypeError(path=path, dtype=str(dtype), masked=True)
    if not (jax.dtypes.issubdtype(dtype, np.number) or jax.dtypes.issubdtype(dtype, np.bool_)):
        raise BatchDtypeError(path=path, dtype=str(dtype))
    check_fits_32_bits(path, leaf)
    return leaf if dtype.isnative else leaf.astype(dtype.newbyteorder("="))


def _place(
    batch: PyTree, sharding: "NamedSharding", check: Callable[[str, object], None] | None = None
) -> PyTree:
    """Put every array leaf of ``batch`` on ``sharding`` in one call; other leaves pass through."""
    import jax  # noqa: PLC0415  (see _is_process_local)

    flat, treedef = jax.tree_util.tree_flatten_with_path(batch)
    leaves = [leaf for _, leaf in flat]
    index: list[int] = []
    for i, (key_path, leaf) in enumerate(flat):
        path = jax.tree_util.keystr(key_path)
        array = _array_to_place(path, leaf)
        if array is None:
            continue
        if check is not None:
            check(path, array)
        leaves[i] = array
        index.append(i)
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
    batch: PyTree, mesh: "Mesh", batch_axis: int = 0, mesh_axis: str = "data"
) -> PyTree:
    """Split dimension ``batch_axis`` of every array leaf over ``mesh_axis``; replicate the rest.

    Array leaves (``jax.Array``, NumPy arrays and scalars) become global arrays on
    ``NamedSharding(mesh, P(None, ..., mesh_axis))``; any other leaf (a string, a Python
    number, a NumPy array of strings, bytes or objects) is returned as it is. A big-endian
    NumPy array is placed in native byte order. On several processes each process passes the
    rows it loaded and jax assembles the global array. Call it outside ``jax.jit``.

    Args:
        batch: A pytree of host arrays.
        mesh: The mesh whose axis the batch dimension is split over.
        batch_axis: The dimension to split (0: the leading one); an int or a NumPy integer.
        mesh_axis: The mesh axis to split it over.

    Returns:
        The batch with every array leaf placed.

    Raises:
        BatchDimensionError: A ``ValueError``: a leaf has no dimension ``batch_axis``, or (on
            one process) the axis size does not divide it; the message names the leaf's path.
        BatchDtypeError: A ``TypeError``: a NumPy leaf jax cannot hold (a masked array, a
            datetime or structured dtype), or a 64-bit leaf whose values do not fit the 32
            bits jax keeps while ``jax_enable_x64`` is off; the message names the leaf's path
            and dtype.
        ValueError: ``mesh_axis`` is not an axis of ``mesh``, or ``batch_axis`` is negative.
        TypeError: ``batch_axis`` is not an integer (or is a bool).

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> from substrax.devices import shard_batch_dim
        >>> mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
        >>> placed = shard_batch_dim({"x": np.ones((3, 8)), "id": "b0"}, mesh, batch_axis=1)
        >>> placed["x"].sharding.spec, placed["x"].addressable_shards[0].data.shape, placed["id"]
        (P(None, 'data'), (3, 2), 'b0')
    """
    return _shard(batch, mesh, check_index("batch_axis", batch_axis, minimum=0), mesh_axis)


def _shard(
    batch: PyTree, mesh: "Mesh", batch_axis: int, mesh_axis: str, *, same_size: bool = False
) -> PyTree:
    """:func:`shard_batch_dim`; with ``same_size``, every array leaf's batch size must agree."""
    import jax  # noqa: PLC0415  (see _is_process_local)
    from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

    if mesh_axis not in mesh.axis_names:
        msg = f"mesh_axis {mesh_axis!r} is not an axis of the mesh {dict(mesh.shape)}; pass mesh_axis="
        raise ValueError(msg)
    parts = int(mesh.shape[mesh_axis])
    whole = jax.process_count() == 1
    first: list[tuple[str, int]] = []  # the first array leaf's path and batch size

    def check(path: str, leaf: object) -> None:
        shape = tuple(int(n) for n in np.shape(cast("np.ndarray[Any, Any]", leaf)))
        if len(shape) <= batch_axis:
            raise BatchDimensionError(path=path, shape=shape, batch_axis=batch_axis, parts=parts)
        size = shape[batch_axis]
        if same_size and first and first[0][1] != size:
            raise BatchSizeMismatchError(
                path=first[0][0],
                size=first[0][1],
                other_path=path,
                other_size=size,
                batch_axis=batch_axis,
            )
        if not first:
            first.append((path, size))
        if whole and size % parts:
            raise BatchDimensionError(path=path, shape=shape, batch_axis=batch_axis, parts=parts)

    spec = PartitionSpec(*([None] * batch_axis), mesh_axis)
    return _place(batch, NamedSharding(mesh, spec), check)


def _checked_devices(devices: Sequence[DeviceLike] | None) -> list[DeviceLike]:
    """``devices`` as a list of distinct jax devices (this process's when None).

    Raises:
        TypeError: ``devices`` is one device rather than a sequence, or holds something else
            (a device id, say).
        ValueError: ``devices`` is empty or names a device twice.
    """
    import jax  # noqa: PLC0415  (see _is_process_local)

    if devices is None:
        return cast("list[DeviceLike]", jax.local_devices())
    if isinstance(devices, jax.Device):
        msg = f"devices={devices!r} is one device; pass a sequence of them, e.g. [device]"
        raise TypeError(msg)
    chosen = list(devices)
    if not chosen:
        msg = "devices is empty; pass at least one device, or None for this process's devices"
        raise ValueError(msg)
    for position, device in enumerate(chosen):
        if not isinstance(device, jax.Device):
            msg = (
                f"devices[{position}]={device!r} ({type(device).__name__}) is not a jax device; "
                "pass devices from jax.devices() or jax.local_devices() (jax.devices()[i], not i)"
            )
            raise TypeError(msg)
    seen: set[DeviceLike] = set()
    for device in chosen:
        if device in seen:
            msg = (
                f"devices names {device!r} more than once ({len(chosen)} entries, "
                f"{len(set(chosen))} distinct); pass each device once"
            )
            raise ValueError(msg)
        seen.add(device)
    return chosen


def _local_mesh(devices: Sequence[DeviceLike] | None) -> "Mesh":
    from jax.sharding import AxisType, Mesh  # noqa: PLC0415  (see _is_process_local)

    chosen = _checked_devices(devices)
    grid = np.empty(len(chosen), dtype=object)
    grid[:] = chosen
    return Mesh(cast("np.ndarray[Any, Any]", grid), ("data",), axis_types=(AxisType.Auto,))


def distribute_batch(
    batch: PyTree, devices: Sequence[DeviceLike] | None = None, *, batch_axis: int = 0
) -> PyTree:
    """Split a host batch over this process's devices, an equal slice of ``batch_axis`` each.

    Each array leaf becomes one ``jax.Array`` over a one-axis ``data`` mesh of ``devices``;
    other leaves (strings, Python numbers, NumPy arrays of strings, bytes or objects) pass
    through. Use it for data parallelism within one process without building a mesh; across
    processes, shard over a global mesh with :func:`shard_batch_dim`.

    Args:
        batch: A pytree of host arrays, the same batch size (along ``batch_axis``) in every
            array leaf.
        devices: Distinct jax devices to split over; ``jax.local_devices()`` when None.
        batch_axis: The dimension to split; an int or a NumPy integer.

    Returns:
        The batch with every array leaf split over the devices.

    Raises:
        BatchDimensionError: A leaf has no dimension ``batch_axis``, or the device count does
            not divide it.
        BatchSizeMismatchError: Two array leaves differ in batch size; it names both.
        BatchDtypeError: A NumPy leaf jax cannot hold (a masked array, a datetime dtype), or
            a 64-bit one whose values do not fit 32 bits while ``jax_enable_x64`` is off.
        ValueError: ``devices`` is empty or names a device twice, or ``batch_axis`` is negative.
        TypeError: ``devices`` holds something other than jax devices, or ``batch_axis`` is
            not an integer.

    Example:
        >>> import jax, numpy as np
        >>> from substrax.devices import distribute_batch
        >>> placed = distribute_batch({"x": np.arange(16.0).reshape(8, 2)})
        >>> len(placed["x"].addressable_shards) == jax.local_device_count()
        True
    """
    axis = check_index("batch_axis", batch_axis, minimum=0)
    return _shard(batch, _local_mesh(devices), axis, "data", same_size=True)


def replicate_across_devices(pytree: PyTree, devices: Sequence[DeviceLike] | None = None) -> PyTree:
    """Give every device a full copy of each array leaf (one replicated ``jax.Array`` each).

    Args:
        pytree: Arrays in any pytree; other leaves (strings, Python numbers, NumPy arrays of
            strings, bytes or objects) pass through.
        devices: Distinct jax devices to copy to; ``jax.local_devices()`` when None.

    Returns:
        The same structure, every array leaf replicated over ``devices``.

    Raises:
        BatchDtypeError: A NumPy leaf jax cannot hold (a masked array, a datetime dtype), or
            a 64-bit one whose values do not fit 32 bits while ``jax_enable_x64`` is off.
        ValueError: ``devices`` is empty or names a device twice.
        TypeError: ``devices`` holds something other than jax devices.

    Example:
        >>> import jax, numpy as np
        >>> from substrax.devices import replicate_across_devices
        >>> params = replicate_across_devices({"w": np.ones(3)}, jax.devices()[:2])
        >>> [shard.data.shape for shard in params["w"].addressable_shards]
        [(3,), (3,)]
    """
    from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415  (see _is_process_local)

    sharding = NamedSharding(_local_mesh(devices), PartitionSpec())
    return _place(pytree, sharding)
