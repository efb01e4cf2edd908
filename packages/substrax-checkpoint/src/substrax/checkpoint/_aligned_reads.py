"""Array reads into aligned host buffers, which a CPU device adopts without copying them.

Orbax reads every shard into a fresh ``np.zeros`` buffer and hands it to ``jax.device_put``.
Large NumPy buffers come from ``malloc`` 16 bytes past a page boundary, and XLA's CPU client
only aliases host memory aligned to 64 bytes, so each restored byte is copied once more after
it is read: on CPU that copy costs more than the read itself. Here the same TensorStore read
lands in a 64-byte aligned buffer that the device then owns (on an accelerator the transfer is
the same as orbax's). Local files are read through memory maps (TensorStore's ``memmap`` file
mode), which copies each byte once from the page cache instead of through a read buffer; a
committed step's files are never rewritten, so the maps cannot change under the read. The
store's own checksummed layout is read by :mod:`._chunk_reads`, which checks each chunk in the
page cache and copies it, on as many threads as there are CPUs.
Everything else (metadata, PRNG keys, padding or truncating reads) is orbax's own
``ArrayHandler``; saving is :mod:`._checksums`'s, which adds a checksum to every chunk. Every read
(these and orbax's) checks the checksums its chunks carry, and corrupted bytes raise
``CheckpointCorruptError`` naming the array.
"""

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, cast

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from etils import epath

from ._checksums import ChecksummedArrayHandler, ChecksummedNumpyHandler, ChecksummedScalarHandler
from ._chunk_reads import Bounds, ChunkLayout, chunk_layout, read_region, split
from ._corrupt_reads import checked_reads, corrupt_error, corruption, metadata_of, one_read


ALIGNMENT: Final = 64
"""The alignment XLA's CPU client needs to use a host buffer in place."""
_MEMMAP: Final = {"file_io_mode": {"mode": "memmap"}}

type _Index = tuple[slice, ...]


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """An uninitialised C-ordered array whose data starts on an ``ALIGNMENT`` boundary.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._aligned_reads import ALIGNMENT, aligned_empty
        >>> aligned_empty((3, 5), np.dtype(np.float32)).ctypes.data % ALIGNMENT
        0
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _plain_sharding(arg: object) -> jax.sharding.Sharding | None:
    """The sharding ``arg`` reads a whole stored array onto, or None for any other kind of read.

    Other kinds go to orbax's handler: padded or truncated reads, shardings left to the stored
    file, and uint32 arrays, which may be PRNG key data that orbax turns back into typed keys
    from its per-array metadata (the restore arguments of a key ask for its uint32 data).
    """
    if not isinstance(arg, ocp.type_handlers.ArrayRestoreArgs) or not arg.strict:
        return None
    if arg.dtype is None or arg.dtype == np.uint32:
        return None
    if jax.dtypes.issubdtype(arg.dtype, jax.dtypes.prng_key):
        return None
    return arg.sharding if isinstance(arg.sharding, jax.sharding.Sharding) else None


async def _read_array(
    info: ocp.type_handlers.ParamInfo,
    arg: ocp.type_handlers.ArrayRestoreArgs,
    sharding: jax.sharding.Sharding,
) -> jax.Array:
    spec = ocp.type_handlers.get_json_tspec_read(
        info,
        use_ocdbt=bool(info.is_ocdbt_checkpoint),
        raise_array_data_missing_error=info.raise_array_data_missing_error,
    )
    spec = ocp.type_handlers.get_cast_tspec_deserialize(spec, arg)
    context = ts.Context(ts.Context.Spec(_MEMMAP), parent=info.ts_context)
    store = await ts.open(spec, open=True, context=context)
    shape = tuple(int(size) for size in store.shape)
    wanted = arg.global_shape if arg.global_shape is not None else arg.shape
    if wanted is not None and tuple(wanted) != shape:
        raise ValueError(f"{info.name}: the stored shape is {shape}, the requested one {wanted}")
    shard_shape = sharding.shard_shape(shape)
    dtype = store.dtype.numpy_dtype
    layout = chunk_layout(store.spec(retain_context=False).to_json(), dtype)
    full = tuple(slice(0, size) for size in shape)
    devices_of: dict[Bounds, tuple[_Index, list[Any]]] = {}
    for device, given in sharding.addressable_devices_indices_map(shape).items():
        index = full if given is None else tuple(given)
        bounds = tuple(part.indices(size)[:2] for part, size in zip(index, shape, strict=True))
        devices_of.setdefault(bounds, (index, []))[1].append(device)

    async def read(bounds: Bounds, index: _Index, devices: list[Any]) -> list[jax.Array]:
        buffer = aligned_empty(shard_shape, dtype)
        try:
            # the store's own layout is checked here, in the page cache; any other by TensorStore
            if layout is None or not await _read_directly(layout, bounds, buffer):
                domain = ts.IndexDomain(shape=shape)[ts.d[:][index]] if shape else store.domain
                await ts.array(buffer)[ts.d[:].translate_to[domain.origin]].write(store[domain])
        except ValueError as error:
            if (found := corruption(error)) is not None:
                raise corrupt_error(info, found) from found
            raise
        return [
            jax.device_put(
                buffer, jax.sharding.SingleDeviceSharding(device, memory_kind=sharding.memory_kind)
            )
            for device in devices
        ]

    shards = await settled(
        read(bounds, index, devices) for bounds, (index, devices) in devices_of.items()
    )
    return jax.make_array_from_single_device_arrays(
        shape, sharding, [shard for group in shards for shard in group]
    )


@functools.cache
def _readers() -> ThreadPoolExecutor:
    """Threads that check and copy chunks, one per CPU, kept for the process.

    Orbax runs every restore in an event loop of its own; the loop's default executor would
    start its threads anew, and join them, in each restore.
    """
    return ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="substrax-checkpoint-read")


async def _read_directly(layout: ChunkLayout, bounds: Bounds, buffer: np.ndarray[Any, Any]) -> bool:
    """:func:`read_region` into ``buffer``, its chunks shared out among the CPUs' threads."""
    pieces = split(layout, bounds, os.cpu_count() or 1)
    starts = [piece[0][0] - bounds[0][0] if bounds else 0 for piece in pieces]
    loop = asyncio.get_running_loop()
    done = await settled(
        loop.run_in_executor(
            _readers(),
            read_region,
            layout,
            piece,
            buffer[start : start + piece[0][1] - piece[0][0]] if bounds else buffer,
        )
        for piece, start in zip(pieces, starts, strict=True)
    )
    return all(done)


class AlignedArrayHandler(ocp.type_handlers.TypeHandler):
    """Orbax's ``ArrayHandler`` with plain reads going through :func:`aligned_empty` buffers."""

    def __init__(self, base: ocp.type_handlers.TypeHandler) -> None:
        self._base = base

    @property
    def _array_metadata_store(self) -> object:
        """The base handler's per-host array metadata, which orbax's PyTree handler looks up."""
        return getattr(self._base, "_array_metadata_store", None)

    def typestr(self) -> str:
        return self._base.typestr()

    async def metadata(self, infos: Sequence[ocp.type_handlers.ParamInfo]) -> Sequence[Any]:
        return await checked_reads(metadata_of(self._base), infos, None)

    async def serialize(
        self,
        values: Sequence[Any],
        infos: Sequence[ocp.type_handlers.ParamInfo],
        args: Sequence[Any] | None = None,
    ) -> Sequence[Any]:
        return await self._base.serialize(values, infos, args)

    def finalize(self, directory: epath.Path) -> None:
        self._base.finalize(directory)

    async def deserialize(
        self,
        infos: Sequence[ocp.type_handlers.ParamInfo],
        args: Sequence[Any] | None = None,
    ) -> Sequence[Any]:
        if args is None:
            return await checked_reads(self._base.deserialize, infos, args)
        direct: list[tuple[int, Any, jax.sharding.Sharding]] = []
        others: list[int] = []
        for i, arg in enumerate(args):
            sharding = _plain_sharding(arg)
            if sharding is None:
                others.append(i)
            else:
                direct.append((i, arg, sharding))
        reads = [one_read(_read_array(infos[i], arg, sharding)) for i, arg, sharding in direct]
        delegated = (
            checked_reads(
                self._base.deserialize, [infos[i] for i in others], [args[i] for i in others]
            )
            if others
            else _nothing()
        )
        read, rest = await settled([settled(reads), delegated])
        values: list[Any] = [None] * len(args)
        for i, value in zip([i for i, _, _ in direct] + others, [*read, *rest], strict=True):
            values[i] = value
        return values


async def _nothing() -> list[Any]:
    return []


async def settled[T](reads: Iterable[Awaitable[T]]) -> list[T]:
    """Await every read, then raise the first failure: none is left running when one fails.

    A read still running in TensorStore when its event loop closes reports into a closed loop.
    """
    results = await asyncio.gather(*reads, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(list[T], results)


class AlignedRegistry:
    """Orbax's global type-handler registry, its default array handlers reading aligned and checked.

    Handlers registered globally (before or after) are used as they are; only instances of
    orbax's own ``ArrayHandler``, ``NumpyHandler`` and ``ScalarHandler`` classes are replaced, by
    handlers configured as they are that read through :func:`aligned_empty` buffers (jax arrays),
    raise ``CheckpointCorruptError`` on a checksum mismatch, and (``checksums=True``) write a
    ``crc32c`` checksum with every zarr3 chunk.
    """

    def __init__(self, *, checksums: bool) -> None:
        self._checksums = checksums
        self._wrapped: dict[
            int, tuple[ocp.type_handlers.TypeHandler, ocp.type_handlers.TypeHandler]
        ] = {}

    def add(
        self,
        ty: object,
        handler: ocp.type_handlers.TypeHandler,
        func: Callable[[Any], bool] | None = None,
        override: bool = False,
        ignore_warnings: bool = False,
    ) -> None:
        del ignore_warnings  # orbax's global registration warns on its own terms
        ocp.type_handlers.register_type_handler(ty, handler, func, override)

    def get(self, ty: object) -> ocp.type_handlers.TypeHandler:
        handler = ocp.type_handlers.get_type_handler(ty)
        held = self._wrapped.get(id(handler))
        if held is None:
            replaced = self._replace(handler)
            if replaced is handler:
                return handler
            held = self._wrapped[id(handler)] = (handler, replaced)
        return held[1]

    def _replace(self, handler: ocp.type_handlers.TypeHandler) -> ocp.type_handlers.TypeHandler:
        checksums = self._checksums
        if type(handler) is ocp.type_handlers.ArrayHandler:
            return AlignedArrayHandler(ChecksummedArrayHandler.like(handler, checksums=checksums))
        if type(handler) is ocp.type_handlers.NumpyHandler:
            return ChecksummedNumpyHandler.like(handler, checksums=checksums)
        if type(handler) is ocp.type_handlers.ScalarHandler:
            return ChecksummedScalarHandler.like(handler, checksums=checksums)
        return handler

    def has(self, ty: object) -> bool:
        return ocp.type_handlers.has_type_handler(ty)
