"""A CRC-32C checksum on every chunk of every array the store writes: the handlers that write it.

Arrays are written as zarr v3 (the default layout, with or without OCDBT) with zarr's ``crc32c``
codec last in each chunk's codec chain: TensorStore computes the checksum in C++ as it encodes
a chunk and checks it whenever the chunk is read, so a flipped bit fails the read instead of
returning a wrong value. Orbax builds its zarr3 write specs inside its handlers with a fixed
codec chain, so these handlers are orbax's ``ArrayHandler``, ``NumpyHandler`` and
``ScalarHandler`` with the spec of each write extended (the ``ArrayHandler`` writes what orbax
0.12 writes, with the spec built the same way and a jax array's shard split into chunks of at
most :data:`CHUNK_BYTES`, but every array at once: :mod:`._array_writes`). Arrays in files get
``.``-separated chunk keys as well (:data:`KEY_SEPARATOR`: fewer directories per save). Only the
store's own handler registry uses them; orbax's global handlers are left as they are. Their reads go through :mod:`._corrupt_reads`, which names the
array whose stored bytes fail their checks.

The checks cost throughput, restores most: TensorStore's checked decoding of a chunk runs at a
few GB/s, where an unchecked chunk is read straight from the memory-mapped file.

The zarr v2 layout (``use_zarr3=False``) has no checksum codec, so its arrays are written
without checksums. A read of an array written without them (zarr v2, or any array saved before
checksums existed) is not checked; it restores as before.
"""

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final, Self

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from orbax.checkpoint import future
from orbax.checkpoint._src.metadata import array_metadata
from orbax.checkpoint._src.serialization import (
    jax_array_handlers,
    limits,
    ocdbt_utils,
    replica_slices,
    tensorstore_utils,
)

from . import _array_writes
from ._corrupt_reads import checked_reads, metadata_of


CRC32C: Final = "crc32c"
CHUNK_BYTES: Final = 16 << 20
"""The largest checksummed chunk a jax array is written in (unless its ``SaveArgs`` choose).

Orbax writes each array shard as one chunk. TensorStore checks a chunk's checksum as it decodes
it, at about half the speed for a 32 MiB chunk as for one of 16 MiB or less, and the store's own
checked reads (:mod:`._chunk_reads`) share a shard's chunks out among threads.
"""

type _Spec = dict[str, Any]


def with_checksum(spec: _Spec) -> _Spec:
    """``spec`` (an orbax write spec) with ``crc32c`` last in its zarr3 chunks' codec chain.

    A zarr v2 spec, or one that already checksums its chunks, is returned unchanged.

    Example:
        >>> from substrax.checkpoint._checksums import with_checksum
        >>> spec = {"driver": "zarr3", "metadata": {"codecs": [{"name": "bytes"}]}}
        >>> [codec["name"] for codec in with_checksum(spec)["metadata"]["codecs"]]
        ['bytes', 'crc32c']
    """
    array = spec
    while array.get("driver") == "cast":
        array = array["base"]
    if array.get("driver") != "zarr3":
        return spec
    codecs: list[dict[str, Any]] = array["metadata"]["codecs"]
    if codecs and codecs[0].get("name") == "sharding_indexed":
        codecs = codecs[0]["configuration"]["codecs"]
    if not any(codec.get("name") == CRC32C for codec in codecs):
        codecs.append({"name": CRC32C})
    return spec


KEY_SEPARATOR: Final = "."
"""The chunk keys' separator of the arrays the store writes as files: ``c.0.1``, not ``c/0/1``.

zarr's default separator makes a directory per axis but the last under each array's ``c/``: a
2-d array is 3 directories and 2 files, where ``.`` makes it 1 and 2. Every save creates those
inodes and the step retention drops removes them: on a file system where creating and removing
inodes is dear (an ext4 without a journal checks every free inode against recent deletions),
the directories cost more CPU than writing the bytes. Any zarr v3 reader follows the array's
``zarr.json`` to its chunks, and the store's own checked reads (:mod:`._chunk_reads`) read both.
"""


def with_flat_keys(spec: _Spec) -> _Spec:
    """``spec`` (an orbax write spec) with ``.``-separated chunk keys: a zarr3 array in files.

    An array in OCDBT (its keys are no files), a zarr v2 array, or one whose spec names its
    chunk keys already, is returned unchanged.

    Example:
        >>> from substrax.checkpoint._checksums import with_flat_keys
        >>> spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": "a/"}, "metadata": {}}
        >>> with_flat_keys(spec)["metadata"]["chunk_key_encoding"]["configuration"]
        {'separator': '.'}
    """
    array = spec
    while array.get("driver") == "cast":
        array = array["base"]
    kvstore = array.get("kvstore")
    if (
        array.get("driver") != "zarr3"
        or not isinstance(kvstore, dict)
        or kvstore.get("driver") != "file"  # pyright: ignore[reportUnknownMemberType]
    ):
        return spec
    metadata: _Spec = array.setdefault("metadata", {})
    metadata.setdefault(
        "chunk_key_encoding", {"name": "default", "configuration": {"separator": KEY_SEPARATOR}}
    )
    return spec


def unsynced(context: ts.Context | None) -> ts.Context:
    """``context`` (orbax's, shared by a save's writes; None: TensorStore's default) unsynced.

    The child context turns TensorStore's ``fsync`` off and shares every other resource.

    TensorStore fsyncs every file it writes, and its directory, by default: about 190 syncs per
    save of a 26-array state (8-10 ms of CPU per save on a 2-core VM's ext4), while orbax writes
    the step's JSON files (its metadata, the store's record and dtypes) without any. Written data
    lives on in the OS's page cache when the process dies (``kill -9`` included) and reaches the
    disk by the OS's writeback, so a step committed by its final rename is whole unless the
    machine itself goes down: after a power cut or a kernel crash the latest steps may be damaged
    (their checksums or ``verify`` say so), as their JSON files could be before.

    Example:
        >>> import tensorstore as ts
        >>> from substrax.checkpoint._checksums import unsynced
        >>> unsynced(ts.Context()).spec.to_json()
        {'file_io_sync': False}
    """
    spec = {"file_io_sync": False}
    return ts.Context(spec) if context is None else ts.Context(spec, parent=context)


def _store_spec(spec: _Spec) -> _Spec:
    """The spec the store writes an array with: checksummed chunks under flat keys."""
    return with_flat_keys(with_checksum(spec))


class ChecksummedNumpyHandler(ocp.type_handlers.NumpyHandler):
    """Orbax's ``NumpyHandler``, writing zarr3 chunks with a ``crc32c`` checksum."""

    _checksums: bool = True

    @classmethod
    def like(cls, handler: ocp.type_handlers.NumpyHandler, *, checksums: bool) -> Self:
        """A handler configured as ``handler`` (a registry's own instance).

        ``checksums=False`` writes as orbax does (reads are checked either way).
        """
        made = cls.__new__(cls)
        vars(made).update(vars(handler))
        made._checksums = checksums
        return made

    async def _open_and_write(
        self, value: np.ndarray[Any, Any], tspec: _Spec, ts_context: ts.Context
    ) -> None:
        if not self._checksums:
            await super()._open_and_write(value, tspec, ts_context)
            return
        await super()._open_and_write(value, _store_spec(tspec), unsynced(ts_context))

    async def deserialize(  # pyright: ignore[reportIncompatibleMethodOverride] - orbax's own
        self, infos: Sequence[ocp.type_handlers.ParamInfo], args: Sequence[Any] | None = None
    ) -> Sequence[Any]:
        return await checked_reads(super().deserialize, infos, args)

    async def metadata(self, infos: Sequence[ocp.type_handlers.ParamInfo]) -> Sequence[Any]:
        return await checked_reads(metadata_of(super()), infos, None)


class ChecksummedScalarHandler(ChecksummedNumpyHandler, ocp.type_handlers.ScalarHandler):
    """Orbax's ``ScalarHandler``, writing zarr3 chunks with a ``crc32c`` checksum.

    The checksummed writes and checked reads are :class:`ChecksummedNumpyHandler`'s, around
    ``ScalarHandler``'s own steps (next in the method order).
    """


class ChecksummedArrayHandler(ocp.type_handlers.ArrayHandler):
    """Orbax's ``ArrayHandler``, writing zarr3 chunks with a ``crc32c`` checksum.

    It writes what orbax writes (the copy to host, every array, the sharding file, the
    per-process array metadata), with two changes: each array's spec (the codec, flat chunk
    keys), and the writes started together and awaited once (:mod:`._array_writes`), by one
    commit future where orbax starts two. A handler with a dispatcher, a host memory budget or
    replica-separate folders (options the store never sets) writes as orbax does.
    """

    _checksums: bool = True

    @classmethod
    def like(
        cls, handler: ocp.type_handlers.ArrayHandler, *, checksums: bool
    ) -> "ChecksummedArrayHandler":
        """A handler configured as ``handler`` (a registry's own instance).

        ``checksums=False`` writes as orbax does (reads are checked either way).
        """
        made = cls.__new__(cls)
        vars(made).update(vars(handler))
        made._checksums = checksums
        return made

    def _writes_as_orbax(
        self, values: Sequence[Any], infos: Sequence[ocp.type_handlers.ParamInfo]
    ) -> bool:
        return (
            not self._checksums
            or self.has_dispatcher()
            or self._enable_replica_parallel_separate_folder
            or any(
                isinstance(info.device_host_byte_limiter, limits.LimitInFlightBytes)
                for info in infos
            )
            or not all(info.use_zarr3 for info in infos)
            or (  # orbax refuses these with its own message
                jax.process_count() > 1
                and any(isinstance(v, jax.Array) and v.is_fully_addressable for v in values)
            )
        )

    async def serialize(
        self,
        values: Sequence[jax.Array],
        infos: Sequence[ocp.type_handlers.ParamInfo],
        args: Sequence[ocp.SaveArgs] | None = None,
    ) -> Sequence[future.Future]:
        args = list(args or [ocp.SaveArgs()] * len(values))
        if self._writes_as_orbax(values, infos):
            return await super().serialize(values, infos, args)
        ocp.type_handlers.check_input_arguments(values, infos, args)
        args = [
            arg if arg.chunk_byte_size is not None else replace(arg, chunk_byte_size=CHUNK_BYTES)
            for arg in args
        ]
        jax_array_handlers.check_array_values(values, infos)
        arrays: list[jax.Array] = []
        extra: dict[str, dict[str, str]] = {}
        for value, info in zip(values, infos, strict=True):
            if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
                arrays.append(jax.random.key_data(value))
                extra[str(info.name)] = {
                    array_metadata.RANDOM_KEY_IMPL: str(jax.random.key_impl(value))
                }
            else:
                arrays.append(value)
        on_host = replica_slices.transfer_arrays_to_host(
            arrays,
            self._replica_id,
            self._use_replica_parallel,
            self._min_slice_bytes_for_replica_parallel,
            self._max_replicas_for_replica_parallel,
            enable_pinned_host_transfer=infos[0].enable_pinned_host_transfer,
        )
        shardings = (
            [array.sharding for array in arrays] if self._enable_write_sharding_file else None
        )
        # one commit future for the arrays and their sharding file where orbax makes one each:
        # each future is a thread of its own, with an event loop of its own, started at every save
        return [
            future.CommitFutureAwaitingContractedSignals(
                self._write(on_host, infos, args, extra, shardings), name="array_type_handler"
            )
        ]

    async def _write(
        self,
        values: Sequence[replica_slices.ReplicaSlices],
        infos: Sequence[ocp.type_handlers.ParamInfo],
        args: Sequence[ocp.SaveArgs],
        extra: dict[str, dict[str, str]],
        shardings: Sequence[jax.sharding.Sharding | None] | None,
    ) -> None:
        """Write the host copies (each spec with the checksum codec), then the sharding file."""
        ocdbt = bool(infos[0].is_ocdbt_checkpoint)
        limiter = infos[0].byte_limiter or limits.get_byte_limiter()
        # as orbax: one transaction for an OCDBT write only when no byte limit bounds what it holds
        unlimited = isinstance(limiter, limits.UnlimitedInFlightBytes)
        transaction = ts.Transaction(atomic=True) if ocdbt and unlimited else None
        for info in infos:
            await info.await_path_creation()
        specs = [
            tensorstore_utils.build_array_write_spec(
                info=info,
                arg=arg,
                global_shape=value.global_shape,
                local_shape=value.local_shape,
                dtype=value.dtype,
                use_ocdbt=ocdbt,
                process_index=ocdbt_utils.get_process_index_for_subdir(ocdbt),
                metadata_key=self._metadata_key,
                ext_metadata=extra.get(str(info.name)),
            )
            for value, info, arg in zip(values, infos, args, strict=True)
        ]
        contexts: dict[int, ts.Context] = {}  # one unsynced child per context of orbax's
        for info in infos:
            if id(info.ts_context) not in contexts:
                contexts[id(info.ts_context)] = unsynced(info.ts_context)
        primary = ocp.multihost.is_primary_host(self._primary_host)
        writes = [
            (value, _store_spec(spec.json), contexts[id(info.ts_context)])
            for value, spec, info in zip(values, specs, infos, strict=True)
        ]
        try:
            for nbytes, batch in _array_writes.batches(writes, limiter):
                async with limits.reserved_bytes(limiter, nbytes):
                    _array_writes.write_arrays(batch, transaction=transaction, primary=primary)
            store = self._array_metadata_store
            if store is not None:
                await store.write(
                    checkpoint_dir=infos[0].parent_dir,
                    array_metadatas=[spec.metadata for spec in specs],
                    process_index=ocp.multihost.process_index(),
                )
        except BaseException:
            if transaction is not None:
                transaction.abort()
            raise
        if transaction is not None:
            await transaction.commit_async()
        if shardings is not None and primary:
            _array_writes.write_shardings(
                [
                    (sharding, info.parent_dir.as_posix(), info.name)
                    for sharding, info in zip(shardings, infos, strict=True)
                    if sharding is not None
                ],
                context=infos[0].ts_context,
            )
