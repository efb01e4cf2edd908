"""A manifest in each committed step directory: every file's size and CRC-32C, checked on restore.

:func:`check_manifest` names each listed file that is missing or differs, with its item and (zarr)
array; unlisted files (``.nfs*`` litter) are not damage. Symbolic links are never followed.
"""

import contextlib
import errno
import functools
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from substrax.support import write_atomically

from ._metadata import DTYPES_ITEM, METADATA_ITEM, WRAPPER


MANIFEST_FILE: Final = "substrax_manifest.json"
"""The manifest's name inside a step directory."""

DUE_MARK: Final = ".substrax-manifest-due."
"""``<store>/<DUE_MARK><step>``: dropped by the writer before orbax's save, gone once sealed."""
MANIFEST_WAIT: Final = 5.0  # seconds a read waits for a due manifest (a killed writer's: in vain)
_FORMAT: Final = (1, "crc32c")
_ALWAYS_CHECKED: Final = frozenset({METADATA_ITEM, DTYPES_ITEM})
"""Items every restore reads, checked whatever ``items`` names."""
_ARRAY_METADATA: Final = frozenset({"zarr.json", ".zarray"})
"""The file that makes its directory a zarr array (v3, v2); OCDBT keeps these in its kvstore."""
_LEFTOVER: Final = re.compile(rf"\.{re.escape(MANIFEST_FILE)}\.[0-9a-f]+\.tmp")
"""The temporary file of a manifest write that was interrupted (``write_atomically``'s name)."""
_CRC: Final = re.compile(r"[0-9a-f]{8}")
_BLOCK: Final = 1 << 20
_NOT_A_FILE: Final = -1
_WORKERS: Final = min(8, os.cpu_count() or 1)
_SERIAL_BYTES: Final = 4 << 20
"""Below this many bytes in all, starting threads costs more than it saves."""
_FLAGS: Final = ("O_NOFOLLOW", "O_NONBLOCK", "O_BINARY")  # where the platform has them
_OPEN: Final = os.O_RDONLY | functools.reduce(int.__or__, (getattr(os, f, 0) for f in _FLAGS))


@dataclass(frozen=True)
class FileRecord:
    """What the manifest recorded for one file: its size in bytes and its CRC-32C."""

    size: int
    crc32c: int


@dataclass(frozen=True)
class Manifest:
    """A step's manifest: relative posix path -> :class:`FileRecord`, or why it is ``unreadable``."""

    files: Mapping[str, FileRecord]
    unreadable: str | None = None


@dataclass(frozen=True)
class Damage:
    """One file of a step that fails its check."""

    file: str
    """The file's path relative to the step directory, ``/``-separated."""
    item: str | None
    """The item directory the file lies in; None for top-level files."""
    array: str | None
    """The array's key path (``layers.0.kernel``; ``""`` for an item that is one array) where the
    layout names it (zarr), else None."""
    problem: str
    """``missing``, ``size 100, recorded 120``, ``CRC-32C 1a2b3c4d, recorded 5e6f7a8b``..."""

    def __str__(self) -> str:
        where = f"array {self.array!r} of " if self.array is not None else ""
        where += f"item {self.item!r}" if self.item is not None else "the step"
        return f"{self.file} ({where}): {self.problem}"


def _digest(path: str, expected_size: int | None, buffer: bytearray) -> tuple[int, int | None]:
    """``path``'s size and CRC-32C (None, unread, if the size isn't expected; -1: no file)."""
    with os.fdopen(os.open(path, _OPEN), "rb", buffering=0) as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            return _NOT_A_FILE, None
        if expected_size is not None and status.st_size != expected_size:
            return status.st_size, None
        view, size, crc = memoryview(buffer), 0, 0
        while count := file.readinto(buffer):
            crc = crc32c.crc32c(view[:count], crc)
            size += count
        return size, crc


def _each_file[T](
    jobs: Sequence[tuple[str, int]], work: Callable[[str, bytearray], T]
) -> dict[str, T]:
    """``work(path, buffer)`` for each ``(path, size)`` job, largest first, on a few threads."""
    pending = iter(sorted(jobs, key=lambda job: job[1], reverse=True))
    lock, results = threading.Lock(), dict[str, T]()

    def drain() -> None:
        buffer = bytearray(_BLOCK)
        while True:
            with lock:
                job = next(pending, None)
            if job is None:
                return
            results[job[0]] = work(job[0], buffer)

    serial = sum(size for _, size in jobs) < _SERIAL_BYTES
    workers = 1 if serial else min(_WORKERS, len(jobs))
    with ThreadPoolExecutor(workers, thread_name_prefix="substrax-manifest") as pool:
        threads = [pool.submit(drain) for _ in range(workers - 1)]
        drain()  # this thread is one of the workers
    for thread in threads:
        thread.result()
    return results


def _regular_files(step_dir: Path) -> list[tuple[str, int]]:
    """Every regular file under ``step_dir`` as (relative posix path, size), links not followed."""
    found: list[tuple[str, int]] = []
    directories = [""]
    while directories:
        prefix = directories.pop()
        with os.scandir(step_dir / prefix) as entries:
            for entry in entries:
                path = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    directories.append(path + "/")
                elif entry.is_file(follow_symlinks=False) and not _LEFTOVER.fullmatch(path):
                    found.append((path, entry.stat(follow_symlinks=False).st_size))
    return [(path, size) for path, size in found if path != MANIFEST_FILE]


def write_manifest(step_dir: Path) -> None:
    """Record every regular file under ``step_dir`` (a committed step) in its :data:`MANIFEST_FILE`.

    The JSON, ``{"format": 1, "algorithm": "crc32c", "files": {path: {"size": n, "crc32c":
    "8 hex digits"}}}``, is written atomically.
    """
    digests = _each_file(
        _regular_files(step_dir), lambda path, buffer: _digest(f"{step_dir}/{path}", None, buffer)
    )
    files = {
        path: {"size": size, "crc32c": f"{crc:08x}"}
        for path, (size, crc) in sorted(digests.items())
        if crc is not None  # a regular file when listed, no longer one: not orbax's
    }
    document = {"format": _FORMAT[0], "algorithm": _FORMAT[1], "files": files}
    write_atomically(step_dir / MANIFEST_FILE, json.dumps(document, indent=0))


def _parse(document: object) -> Manifest:
    """The manifest a JSON document holds, or one saying what is wrong with its shape."""
    if not isinstance(document, dict) or not isinstance(files := document.get("files"), dict):
        return Manifest({}, unreadable="not a JSON object with a 'files' object")
    if (found := (document.get("format"), document.get("algorithm"))) != _FORMAT:
        return Manifest({}, unreadable=f"format {found}; this release reads {_FORMAT}")
    records: dict[str, FileRecord] = {}
    for path, record in files.items():
        entry = record if isinstance(record, dict) else {}
        size, crc = entry.get("size"), entry.get("crc32c")
        if path.startswith("/") or {"", ".", ".."} & set(path.split("/")):
            return Manifest({}, unreadable=f"path {path!r} is not inside the step")
        if type(size) is not int or size < 0 or not isinstance(crc, str) or not _CRC.fullmatch(crc):
            return Manifest({}, unreadable=f"{path!r}: {record!r}, not {{'size', 'crc32c'}}")
        records[path] = FileRecord(size, int(crc, 16))
    return Manifest(records) if records else Manifest({}, unreadable="it lists no files")


def mark_due(step_dir: Path | None, *, due: bool) -> None:
    """Mark ``step_dir``'s manifest as due, or no longer; unmarked, readers don't wait for it."""
    mark = None if step_dir is None else step_dir.parent / f"{DUE_MARK}{step_dir.name}"
    with contextlib.suppress(OSError):
        if mark is not None and due:
            mark.touch()
        elif mark is not None:
            mark.unlink(missing_ok=True)


def read_manifest(step_dir: Path) -> Manifest | None:
    """``step_dir``'s manifest (one due waited for, :data:`MANIFEST_WAIT` at most), or None."""
    deadline = time.monotonic() + MANIFEST_WAIT
    while True:
        try:
            with os.fdopen(os.open(step_dir / MANIFEST_FILE, _OPEN), "rb") as file:
                return _parse(json.loads(file.read()))
        except FileNotFoundError:
            step_dir.stat()  # the step itself vanished: raise, don't call it unverified
            due = (step_dir.parent / f"{DUE_MARK}{step_dir.name}").exists()
            if not due or time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        except (OSError, ValueError) as error:  # ValueError: not UTF-8, not JSON
            return Manifest({}, unreadable=f"{type(error).__name__}: {error}")


def _locate(file: str, arrays: Collection[str]) -> tuple[str | None, str | None]:
    """(item, array) of ``file``, given the directories that hold a zarr array (wrapper left out)."""
    parts = file.split("/")
    for depth in range(len(parts) - 1, 0, -1):
        if "/".join(parts[:depth]) in arrays:
            key = ".".join(parts[1:depth])
            return parts[0], "" if key == WRAPPER else key.removeprefix(WRAPPER + ".")
    return (parts[0] if len(parts) > 1 else None), None


def _difference(size: int, crc: int | None, recorded: FileRecord) -> str | None:
    """What differs between a file's size and CRC-32C and its record; None when nothing."""
    if size == _NOT_A_FILE:
        return "not a regular file"
    if crc is None:
        return f"size {size}, recorded {recorded.size}"
    if crc != recorded.crc32c:
        return f"CRC-32C {crc:08x}, recorded {recorded.crc32c:08x}"
    return None


def check_manifest(
    step_dir: Path, manifest: Manifest, *, items: Collection[str] | None = None
) -> list[Damage]:
    """Every listed file of ``step_dir`` that is missing or differs from ``manifest``, by file.

    With ``items``, only those items' files are read, beside those every restore reads.
    """
    if isinstance(items, str):
        raise TypeError(f"items={items!r} is one string; pass a collection of names: [{items!r}]")
    if manifest.unreadable is not None:
        problem = f"unreadable manifest ({manifest.unreadable}); the step can't be verified"
        return [Damage(MANIFEST_FILE, None, None, problem)]
    root = os.path.realpath(step_dir, strict=True) + os.sep
    inside = functools.cache(lambda parent: os.path.realpath(step_dir / parent).startswith(root))

    def check_one(path: str, buffer: bytearray) -> str | None:
        recorded, parent = manifest.files[path], path.rpartition("/")[0]
        if parent and not inside(parent):
            return "reached through a symbolic link out of the step"
        try:
            size, crc = _digest(f"{step_dir}/{path}", recorded.size, buffer)
        except FileNotFoundError:
            step_dir.stat()  # the whole step vanished (deleted by a writer): raise
            return "missing"
        except OSError as error:  # ELOOP: O_NOFOLLOW met a link
            return "a symbolic link" if error.errno == errno.ELOOP else f"unreadable ({error})"
        return _difference(size, crc, recorded)

    def wanted(path: str) -> bool:
        head, nested, _ = path.partition("/")
        return items is None or not nested or head in items or head in _ALWAYS_CHECKED

    problems = _each_file([(p, r.size) for p, r in manifest.files.items() if wanted(p)], check_one)
    arrays = {
        p.rpartition("/")[0] for p in manifest.files if p.rpartition("/")[2] in _ARRAY_METADATA
    }
    return [Damage(p, *_locate(p, arrays), found) for p, found in sorted(problems.items()) if found]
