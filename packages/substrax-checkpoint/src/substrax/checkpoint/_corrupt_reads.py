"""Stored bytes that fail their checks, told apart and named by step, item and leaf.

TensorStore reports a chunk whose checksum does not match, a shard index or OCDBT node that
cannot be decoded, and a chunk a committed step lacks, as a ``ValueError`` (orbax raises it
again as the cause of a plain ``Exception``). The store's array handlers (:mod:`._checksums`,
:mod:`._aligned_reads`) read through :func:`checked_reads`, which turns such a report into
``CheckpointCorruptError`` naming the array, and :func:`one_read`, which lets the event loop's
other reads settle before a failed one is raised.
"""

import asyncio
import json
import os
import re
import weakref
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import orbax.checkpoint as ocp

from ._errors import CheckpointCorruptError
from ._trees import leaf_path


_CORRUPT: Final = re.compile(
    r"DATA_LOSS:|Error reading shard entry|Error decoding b-tree node|Digest mismatch"
    r"|checksum verification failed|Data corruption detected|NOT_FOUND:"
)
_FILE: Final = re.compile(r'file "([^"]+)"')
_METADATA_FILES: Final = frozenset(
    {"_sharding", "_METADATA", "_CHECKPOINT_METADATA", "zarr.json", ".zarray"}
)
"""The JSON files of a step that orbax and TensorStore read (``array_metadatas/*`` too)."""
_ARRAY_METADATAS: Final = "array_metadatas"
_REQUIRED_KEYS: Final = {"_METADATA": "tree_metadata", "zarr.json": "zarr_format"}
_OCDBT: Final = "ocdbt.process_"  # a process's OCDBT database, not read


def _is_metadata_file(path: Path) -> bool:
    return path.name in _METADATA_FILES or path.parent.name == _ARRAY_METADATAS


def json_damage(path: Path) -> str | None:
    """What is wrong with the metadata file ``path`` (None: a JSON object as orbax expects).

    ``_METADATA`` must hold ``tree_metadata``, ``zarr.json`` ``zarr_format`` and an
    ``array_metadatas`` file ``array_metadatas``; a missing file is no damage here (a missing
    array file is reported by the read that needs it).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.checkpoint._corrupt_reads import json_damage
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     path = Path(directory) / "_sharding"
        ...     _ = path.write_text("[1, 2]")
        ...     json_damage(path)
        'not a JSON object'
    """
    try:
        raw: object = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"unreadable: {error}"
    except ValueError as error:
        return f"not JSON: {error}"
    if not isinstance(raw, dict):
        return "not a JSON object"
    required = _ARRAY_METADATAS if path.parent.name == _ARRAY_METADATAS else None
    required = _REQUIRED_KEYS.get(path.name, required)
    if required is not None and required not in raw:
        return f"no {required!r} in the JSON object"
    return None


def metadata_damage(step_dir: Path) -> list[tuple[Path, str]]:
    """Every damaged metadata file of the step ``step_dir`` (see :func:`json_damage`), sorted.

    Chunk files and OCDBT databases are not read.
    """
    found: list[tuple[Path, str]] = []
    for root, folders, names in os.walk(step_dir):
        if "zarr.json" in names or ".zarray" in names:
            folders.clear()  # an array: the rest is its chunks
        folders[:] = [f for f in folders if f not in ("d", "c") and not f.startswith(_OCDBT)]
        for name in names:
            path = Path(root) / name
            if _is_metadata_file(path) and (damage := json_damage(path)) is not None:
                found.append((path, damage))
    return sorted(found)


def named_damage(error: BaseException) -> tuple[Path, str] | None:
    """A damaged metadata file that ``error`` (or one of its causes) names, and its damage."""
    seen: BaseException | None = error
    while seen is not None:
        for name in _FILE.findall(str(seen)):
            path = Path(name)
            if _is_metadata_file(path) and (damage := json_damage(path)) is not None:
                return path, damage
        seen = seen.__cause__ or seen.__context__
    return None


def corruption(error: BaseException) -> ValueError | None:
    """TensorStore's report of stored bytes that fail their checks, in ``error`` or its causes.

    TensorStore raises a ``ValueError``: ``FAILED_PRECONDITION`` for an array's ``zarr.json``
    that is JSON but not the metadata orbax wrote (its file, named in the message, is checked
    with :func:`json_damage`), ``DATA_LOSS: ... Digest mismatch, stored digest is
    0x... but computed digest is 0x...`` for a chunk's checksum, ``DATA_LOSS`` for a shard index
    that cannot be decoded, ``Error reading shard entry`` for a compressed chunk whose
    decompression fails before its checksum is reached, ``Error decoding b-tree node`` for an
    OCDBT node (which carries its own checksum), ``NOT_FOUND`` for a chunk or an array's
    ``zarr.json`` that a committed step lacks (orbax writes every chunk, and reads with missing
    chunks refused). Orbax's own array reads raise it again as the cause of a plain
    ``Exception``. A step deleted while it is read fails the same way; the store tells the two
    apart by whether the step's directory is still there.

    Example:
        >>> from substrax.checkpoint._corrupt_reads import corruption
        >>> corruption(ValueError("DATA_LOSS: Error reading ...: Digest mismatch")) is not None
        True
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ValueError) and _CORRUPT.search(str(seen)):
            return seen
        seen = seen.__cause__ or seen.__context__
    seen = error
    while seen is not None:  # a metadata file it names is not what orbax wrote (valid JSON)
        if isinstance(seen, ValueError) and named_damage(seen) is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def corrupt_error(
    info: ocp.type_handlers.ParamInfo, cause: BaseException
) -> CheckpointCorruptError:
    """The store's error for a corrupted array, named by the step directory it was read from.

    ``info.parent_dir`` is the item's directory, ``<store>/<step>/<item>``; the leaf is the
    array's full key path in the item as orbax stores it.
    """
    item_dir = Path(str(info.parent_dir))
    step_name = item_dir.parent.name
    found = _FILE.search(str(cause))
    return CheckpointCorruptError(
        step=int(step_name) if step_name.isdigit() else None,
        item=item_dir.name,
        leaf=leaf_path(tuple(info.keypath or ())) if info.keypath else str(info.name),
        directory=item_dir.parent.parent,
        path=Path(found.group(1)) if found else item_dir / str(info.name),
        detail=str(cause).split("[", 1)[0].strip(),
    )


_IN_FLIGHT: Final[
    weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[asyncio.Future[Any]]]
] = weakref.WeakKeyDictionary()


async def one_read[T](read: Awaitable[T]) -> T:
    """Await ``read``; when it fails, first let the event loop's other reads finish.

    Orbax closes its event loop as soon as one read fails, and a TensorStore read still running
    then reports into the closed loop (a ``RuntimeError`` printed on stderr). Every read of the
    store's handlers is registered here, and a failed one waits for the others to settle.
    """
    running = _IN_FLIGHT.setdefault(asyncio.get_running_loop(), set())
    task = asyncio.ensure_future(read)
    running.add(task)
    task.add_done_callback(running.discard)
    try:
        return await task
    except Exception:
        others = [other for other in running if other is not task]
        if others:
            await asyncio.wait(others)
        raise


async def checked_reads[T](
    read: Callable[
        [Sequence[ocp.type_handlers.ParamInfo], Sequence[Any] | None], Awaitable[Sequence[T]]
    ],
    infos: Sequence[ocp.type_handlers.ParamInfo],
    args: Sequence[Any] | None,
) -> Sequence[T]:
    """``read(infos, args)``, with corrupted data raised as ``CheckpointCorruptError``.

    When one read of several fails, the arrays are read again one at a time to name the one
    whose bytes are corrupted.
    """
    try:
        return await one_read(read(infos, args))
    except Exception as error:
        found = corruption(error)
        if found is None:
            raise
        for i, info in enumerate(infos):
            try:
                await one_read(read([info], None if args is None else [args[i]]))
            except Exception as one:
                if (again := corruption(one)) is not None:
                    raise corrupt_error(info, again) from again
        raise corrupt_error(infos[0], found) from found


def metadata_of(
    handler: ocp.type_handlers.TypeHandler,
) -> Callable[
    [Sequence[ocp.type_handlers.ParamInfo], Sequence[Any] | None], Awaitable[Sequence[Any]]
]:
    """``handler.metadata`` in the form :func:`checked_reads` calls (its arguments unused)."""

    def metadata(
        infos: Sequence[ocp.type_handlers.ParamInfo], _: Sequence[Any] | None
    ) -> Awaitable[Sequence[Any]]:
        return handler.metadata(infos)

    return metadata
