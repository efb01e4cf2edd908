"""One flush to disk per item write, where TensorStore would flush every file it writes.

TensorStore's file driver calls ``fsync`` on each file it writes and on the directory it renames
it into: for a training state of a few dozen arrays in the default layout (one directory per
array) that is about a hundred flushes per save, each a journal commit of its own, which on a
busy disk makes the save much slower than writing its bytes. The store's array writes instead
go through a TensorStore context with ``file_io_sync`` off, and once every array of the item is
written, one ``syncfs(2)`` on the item's directory flushes and waits for everything written to
that file system (should it fail, the item's files are flushed one by one, and a file that does
not reach the disk fails the write with its ``OSError``). Orbax's commit (the rename
that makes the step appear) runs only after that, so a committed step is on disk whole, as
before. The price: the flush also waits for what other processes wrote to the same file system.

Where ``syncfs`` is not available (not Linux), or the directory is not a local one, the writes
keep TensorStore's own per-file flushes.
"""

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

import tensorstore as ts


_UNSYNCED: Final = {"file_io_sync": False}


def _load_syncfs() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return syncfs


_SYNCFS: Final = _load_syncfs()


def batched_sync(directory: str | os.PathLike[str]) -> bool:
    """Whether writes under ``directory`` may skip per-file flushes for one :func:`sync_filesystem`.

    Example:
        >>> import sys, tempfile
        >>> from substrax.checkpoint._durability import batched_sync
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     batched_sync(directory) == sys.platform.startswith("linux")
        True
        >>> batched_sync("gs://bucket/run")
        False
    """
    return _SYNCFS is not None and Path(os.fspath(directory)).is_dir()


def unsynced(context: ts.Context | None) -> ts.Context:
    """``context`` (None: a default one) with TensorStore's per-file flushes off.

    The new context shares every other resource of ``context`` (thread pools, caches).

    Example:
        >>> import tensorstore as ts
        >>> from substrax.checkpoint._durability import unsynced
        >>> isinstance(unsynced(ts.Context()), ts.Context)
        True
    """
    spec = ts.Context.Spec(_UNSYNCED)
    return ts.Context(spec) if context is None else ts.Context(spec, context)


def sync_filesystem(directory: str | os.PathLike[str]) -> None:
    """Flush everything written to ``directory``'s file system to disk, and wait for it.

    A failed ``syncfs`` may be another process's write-back error anywhere on the file system,
    so the files under ``directory`` are then flushed one by one (:func:`flush_tree`), which
    raises the ``OSError`` of any of them that did not reach the disk.

    Raises:
        OSError: a file under ``directory`` did not reach the disk (or ``directory`` is missing).

    Example:
        >>> import tempfile
        >>> from substrax.checkpoint._durability import batched_sync, sync_filesystem
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     if batched_sync(directory):
        ...         sync_filesystem(directory)
    """
    fd = os.open(os.fspath(directory), os.O_RDONLY)
    try:
        flushed = _SYNCFS is not None and _SYNCFS(fd) == 0
    finally:
        os.close(fd)
    if not flushed:
        flush_tree(directory)


def flush_tree(directory: str | os.PathLike[str]) -> None:
    """``fsync`` every file and directory under ``directory`` (TensorStore's own flushes, late).

    Raises:
        OSError: one of them could not be flushed.

    Example:
        >>> import pathlib, tempfile
        >>> from substrax.checkpoint._durability import flush_tree
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     _ = (pathlib.Path(directory) / "chunk").write_bytes(b"0123")
        ...     flush_tree(directory)
    """
    for root, _, files in Path(os.fspath(directory)).walk():
        for path in (root, *(root / name for name in files)):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # a temporary file renamed away since the listing
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
