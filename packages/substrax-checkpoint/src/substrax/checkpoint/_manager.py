"""How the store drives orbax (its public API only): handlers, options, the background save call.

Also the snapshot that call saves, and what an interrupted save or a deletion leaves on disk.
"""

import contextlib
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jax
import numpy as np
import orbax.checkpoint as ocp

from substrax.typing import PyTree

from ._index import INDEX_FILE
from ._manifest import DUE_MARK, MANIFEST_FILE
from ._metadata import DTYPES_ITEM, ITEM_NAMES, METADATA_ITEM
from ._steps import restore_replaced, scan_steps


TMP_MARK: Final = ".orbax-checkpoint-tmp"
DELETED: Final = ".substrax-deleted"  # a deleted step is renamed here, then its files removed


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """How arrays are laid out on disk: an OCDBT database per item, zarr v3, zstd (each on or off)."""

    ocdbt: bool = True
    zarr3: bool = True
    compression: bool = False


def _handlers(layout: Layout) -> dict[str, ocp.CheckpointHandler]:
    handlers: dict[str, ocp.CheckpointHandler] = {
        name: ocp.PyTreeCheckpointHandler(
            use_ocdbt=layout.ocdbt,
            use_zarr3=layout.zarr3,
            use_compression=layout.compression,
        )
        for name in ITEM_NAMES
    }
    handlers[METADATA_ITEM] = ocp.JsonCheckpointHandler()
    handlers[DTYPES_ITEM] = ocp.JsonCheckpointHandler()
    return handlers


def open_manager(
    directory: Path,
    *,
    layout: Layout,
    async_save: bool,
    read_only: bool,
) -> ocp.CheckpointManager:
    """The orbax ``CheckpointManager`` at ``directory``; it keeps every step (the store prunes).

    A reader's manager is this process's alone: its opening and restores wait for no other
    process of a ``jax.distributed`` job (orbax's barriers span the processes it is told of).
    """
    processes = ocp.options.MultiprocessingOptions()
    if read_only and jax.distributed.is_initialized():  # no backend started otherwise
        here = jax.process_index()
        processes = ocp.options.MultiprocessingOptions(primary_host=here, active_processes={here})
    options = ocp.CheckpointManagerOptions(
        create=not read_only,
        read_only=read_only,
        # only the writer lock's holder cleans, once, when it takes the lock (remove_partial_steps)
        cleanup_tmp_directories=False,
        # a step leaves the store in one rename, so a reader never lists a half-deleted step
        todelete_subdir=None if read_only else DELETED,
        enable_async_checkpointing=async_save,
        lightweight_initialize=True,
        multiprocessing_options=processes,
    )
    return ocp.CheckpointManager(directory, options=options, item_handlers=_handlers(layout))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Items frozen for a background write; ``pins`` hold every CPU buffer until orbax copied it."""

    items: dict[str, PyTree]
    pins: tuple[np.ndarray[Any, Any], ...]


def _on_host(leaf: jax.Array) -> bool:
    return all(device.platform == "cpu" for device in leaf.sharding.device_set)


def _views(leaf: jax.Array) -> list[np.ndarray[Any, Any]]:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)  # the key's own uint32 buffer, not a copy
    return [np.asarray(shard.data) for shard in leaf.addressable_shards]


def snapshot(items: Mapping[str, PyTree]) -> Snapshot | None:
    """Freeze ``items`` for a background write; None when the device has no room for a copy."""
    leaves, treedef = jax.tree.flatten(dict(items))
    on_device = [
        i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array) and not _on_host(leaf)
    ]
    if on_device:
        originals = [leaves[i] for i in on_device]
        try:
            copies = jax.device_put(
                originals, [leaf.sharding for leaf in originals], may_alias=False
            )
        except jax.errors.JaxRuntimeError:  # no device memory for a copy of the state
            return None
        for i, copy in zip(on_device, copies, strict=True):
            leaves[i] = copy
    pins = tuple(
        view
        for leaf in leaves
        if isinstance(leaf, jax.Array) and _on_host(leaf)
        for view in _views(leaf)
    )
    frozen = [leaf.copy() if isinstance(leaf, np.ndarray) else leaf for leaf in leaves]
    return Snapshot(jax.tree.unflatten(treedef, frozen), pins)


def save_held(
    manager: ocp.CheckpointManager, step: int, args: ocp.args.Composite, snapshot: Snapshot
) -> bool:
    """The writer thread's part of an asynchronous save: orbax's save call, ``snapshot`` held till then."""
    try:
        # orbax raises a failed write once in every thread that waits for it; ``save`` waited
        # on the caller's thread (and raised it there) before handing this step over
        with contextlib.suppress(Exception):
            manager.wait_until_finished()
        return bool(manager.save(step, args=args, force=True))
    finally:
        del snapshot


def remove_partial_steps(directory: Path) -> None:
    """Remove what an interrupted save left behind (the writer lock's new holder calls this).

    A step an interrupted overwrite kept aside goes back in place unless its replacement was
    committed (then it is removed).
    """
    if not directory.is_dir():
        return
    for child in directory.iterdir():
        name = child.name
        if TMP_MARK in name and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        elif name.isdigit() and child.is_dir():  # a manifest never written: it stays unverified
            for leftover in child.glob(f".{MANIFEST_FILE}.*.tmp"):  # write_atomically's name
                leftover.unlink()
        elif name.startswith(DUE_MARK) or (
            name.startswith(f".{INDEX_FILE}.") and name.endswith(".tmp")
        ):
            child.unlink(missing_ok=True)
    restore_replaced(directory)
    empty_deleted(directory)


def remove_remade(directory: Path, step: int) -> None:
    """Remove what a write of ``step`` made again in a removed ``directory`` (it too, if left empty)."""
    try:
        children = list(directory.iterdir())
    except OSError:
        return
    for child in children:
        name = child.name
        if name in (str(step), DELETED) or name.startswith(f"{step}{TMP_MARK}"):
            shutil.rmtree(child, ignore_errors=True)
        elif name == INDEX_FILE or (name.startswith(f".{INDEX_FILE}.") and name.endswith(".tmp")):
            child.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()


def has_deleted(directory: Path) -> bool:
    """Whether deleted steps wait under ``directory``'s deleted-steps folder for removal."""
    try:
        with os.scandir(directory / DELETED) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False


def empty_deleted(directory: Path) -> None:
    """Remove the files of the deleted steps (the folder itself stays: orbax renames into it)."""
    try:
        children = list((directory / DELETED).iterdir())
    except FileNotFoundError:
        return
    for child in children:
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def step_directories(directory: Path) -> list[int]:
    """The committed steps under ``directory``, ascending (other integer-named folders are not).

    A step is a directory named by its step that holds that step's metadata record.
    """
    return list(scan_steps(directory).steps)
