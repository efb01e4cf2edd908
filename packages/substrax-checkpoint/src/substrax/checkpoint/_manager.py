"""How the store drives orbax: its handlers and options, the background save call, the disk.

The store owns the semantics (steps, refusals, retention, the index); this module holds the
orbax plumbing under it: one ``PyTreeCheckpointHandler`` per item name, two JSON items for the
metadata record and the dtypes, the manager's options, and what an interrupted save leaves
behind on disk. Only orbax's public API: its handlers with the options they document.
"""

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orbax.checkpoint as ocp

from ._formats import DTYPES_ITEM, METADATA_ITEM
from ._index import INDEX_FILE
from ._metadata import ITEM_NAMES
from ._retention import OrbaxPreservation
from ._snapshot import Snapshot


TMP_MARK: Final = ".orbax-checkpoint-tmp"
DELETED: Final = ".substrax-deleted"  # a deleted step is renamed here, then its files removed


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """How arrays are laid out on disk (every layout reads back whatever the options).

    Attributes:
        ocdbt: one OCDBT database per item rather than one directory per array.
        zarr3: zarr v3 rather than v2.
        compression: zstd-compressed chunks.
    """

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
    preservation: OrbaxPreservation,
) -> ocp.CheckpointManager:
    """The orbax ``CheckpointManager`` of a store at ``directory``."""
    options = ocp.CheckpointManagerOptions(
        create=not read_only,
        read_only=read_only,
        # only the writer lock's holder cleans, once, when it takes the lock (remove_partial_steps)
        cleanup_tmp_directories=False,
        # a step leaves the store in one rename, so a reader never lists a half-deleted step
        todelete_subdir=None if read_only else DELETED,
        enable_async_checkpointing=async_save,
        preservation_policy=preservation,
        lightweight_initialize=True,
    )
    return ocp.CheckpointManager(directory, options=options, item_handlers=_handlers(layout))


def save_held(
    manager: ocp.CheckpointManager, step: int, args: dict[str, Any], snapshot: Snapshot
) -> bool:
    """The writer thread's part of an asynchronous save: orbax's own (asynchronous) save call.

    ``snapshot`` keeps the arrays' buffers in place until orbax holds its own copies of them.
    """
    try:
        # orbax raises a failed write once in every thread that waits for it; ``save`` waited
        # on the caller's thread (and raised it there) before handing this step over
        with contextlib.suppress(Exception):
            manager.wait_until_finished()
        return bool(manager.save(step, args=ocp.args.Composite(**args), force=True))
    finally:
        del snapshot


def remove_partial_steps(directory: Path) -> None:
    """Remove the temporary step directories and index files an interrupted save left behind.

    Only the holder of the writer lock calls this, right after taking it: no live writer owns them.
    """
    if not directory.is_dir():
        return
    for child in directory.iterdir():
        if TMP_MARK in child.name and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        elif child.name.startswith(f".{INDEX_FILE}.") and child.name.endswith(".tmp"):
            child.unlink(missing_ok=True)
    empty_deleted(directory)


def remove_remade(directory: Path, step: int) -> None:
    """Remove what a write of ``step`` made again in ``directory`` after it was removed.

    The step (committed or temporary), the index file and the deleted-steps folder; then the
    directory itself when nothing else is left in it. Anything else there stays.
    """
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
    """The committed steps under ``directory``: its sub-directories named by an integer."""
    if not directory.is_dir():
        return []
    with os.scandir(directory) as entries:
        return sorted(int(e.name) for e in entries if e.name.isdigit() and e.is_dir())
