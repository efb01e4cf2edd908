"""The writer lock: one writing process per store, freed by the operating system when it dies.

A store opened to write holds ``fcntl.flock`` on ``<directory>/.substrax-writer.lock`` and
records itself there (host, pid, since when). The kernel drops the lock when the holding process
exits, however it exits (``kill -9`` included), so a crashed writer never blocks the next one.
Within one process, the writing stores of one directory share the lock (a notebook re-running a
cell opens a second store before the first is collected); the last one to close releases it.
The newest of them is the directory's writer: the store hands over from the earlier one, which
gives its share back (see ``OrbaxCheckpointStore``). In
a multi-host job the job's processes together are one writer: process 0 takes the lock and every
process acts on its outcome.
"""

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import jax

from ._errors import CheckpointLockedError
from ._multihost import agree


LOCK_FILE: Final = ".substrax-writer.lock"
_READ_TRIES: Final = 20  # the holder writes its record just after locking: re-read until whole


@dataclass(frozen=True, slots=True, kw_only=True)
class LockHolder:
    """The process that holds a store's writer lock, as it recorded itself (None: unreadable).

    Example:
        >>> from substrax.checkpoint._lock import LockHolder
        >>> LockHolder(host="node1", pid=42, since="2026-01-01T00:00:00+00:00").pid
        42
    """

    host: str | None
    pid: int | None
    since: str | None


@dataclass(slots=True)
class _Held:
    fd: int
    count: int
    identity: tuple[int, int]  # the lock file's (st_dev, st_ino): gone or changed, the lock is lost


_held: dict[Path, _Held] = {}
_guard = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child holds no lock of its own: closing its copies leaves the parent's lock held."""
    global _guard  # noqa: PLW0603 - the parent's lock object may be held at fork time
    _guard = threading.Lock()
    for held in _held.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
        held.fd = -1  # the leases the child inherited release nothing
    _held.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


class WriterLease:
    """This store's share of the writer lock; ``release`` is idempotent.

    ``fresh`` says that no other store of this job was writing the directory when this one
    opened: only then are partial steps left behind by a dead writer removed.
    """

    def __init__(self, directory: Path, *, fresh: bool, local: bool) -> None:
        self.directory = directory
        self.fresh = fresh
        with _guard:  # the flock this process holds (a share of), None on other processes
            self._held = _held.get(directory) if local else None
        self._released = False

    def intact(self) -> bool:
        """Whether the lock file this lease locked still stands at its path (True elsewhere).

        Removing the directory (or replacing the lock file) drops the lock without a word: the
        next writer to open the directory locks a new file. The lock file is compared by device
        and inode with the one locked at open.
        """
        held = self._held
        return held is None or self._released or _intact(self.directory, held)

    def release(self) -> None:
        """Give this share back; the last share of the process unlocks the file."""
        with _guard:
            held = self._held
            if self._released or held is None or held.fd < 0:
                self._released = True
                return
            self._released = True
            held.count -= 1
            if held.count == 0:
                if _held.get(self.directory) is held:
                    del _held[self.directory]
                os.close(held.fd)  # closing the descriptor drops the flock


def _intact(directory: Path, held: _Held) -> bool:
    """Whether ``held``'s lock file still stands in ``directory`` (a file it cannot stat: yes)."""
    try:
        found = (directory / LOCK_FILE).stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True  # unreadable, not gone: the write that follows reports it
    return (found.st_dev, found.st_ino) == held.identity


def read_holder(directory: Path) -> LockHolder:
    """The holder recorded in ``directory``'s lock file (fields None where unreadable).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.checkpoint._lock import read_holder
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     read_holder(Path(directory))
        LockHolder(host=None, pid=None, since=None)
    """
    for attempt in range(_READ_TRIES):
        try:
            raw: Any = json.loads((directory / LOCK_FILE).read_text())
            return LockHolder(host=str(raw["host"]), pid=int(raw["pid"]), since=str(raw["since"]))
        except FileNotFoundError:
            break
        except (OSError, ValueError, KeyError, TypeError):
            if attempt + 1 < _READ_TRIES:
                time.sleep(0.05)
    return LockHolder(host=None, pid=None, since=None)


def _lock_here(directory: Path) -> tuple[bool, LockHolder | None]:
    """Take (or share) the flock in this process: (fresh, None), or (False, holder) if refused."""
    with _guard:
        held = _held.get(directory)
        if held is not None and _intact(directory, held):
            held.count += 1
            return False, None
        # none held, or its file removed with the directory: its stores keep it and fail to save
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False, read_holder(directory)
        except BaseException:
            os.close(fd)
            raise
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        found = os.fstat(fd)
        _held[directory] = _Held(fd=fd, count=1, identity=(found.st_dev, found.st_ino))
        return True, None


def take_writer_lock(directory: Path, *, clean: Callable[[Path], None]) -> WriterLease:
    """Lock ``directory`` (an existing directory) for this job's writing; raise if another holds it.

    ``clean`` runs once right after a fresh lock, before any other process of the job goes on:
    no live writer owns what it removes.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.checkpoint._lock import take_writer_lock
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     first = take_writer_lock(Path(directory), clean=lambda path: None)
        ...     second = take_writer_lock(Path(directory), clean=lambda path: None)  # shared here
        ...     first.release(); second.release()
        >>> (first.fresh, second.fresh)
        (True, False)
    """
    # jax's backend is touched only once jax.distributed runs: a single process never starts it
    if not jax.distributed.is_initialized() or jax.process_index() == 0:
        fresh, holder = _lock_here(directory)
        if fresh:
            try:
                clean(directory)
            except BaseException:
                WriterLease(directory, fresh=True, local=True).release()
                raise
        local = holder is None
    else:
        fresh, holder, local = False, None, False
    if jax.distributed.is_initialized():
        # process 0 decides: 0 a fresh lock, 1 a shared one, -pid (or -1) refused by pid
        code = 0 if fresh else 1 if holder is None else -(holder.pid or 1)
        code = int(agree(str(code), topic="writer-lock"))
        fresh = code == 0
        if code < 0 and holder is None:
            if local:
                WriterLease(directory, fresh=False, local=True).release()
            recorded = read_holder(directory)  # readable where the directory is shared
            pid = -code if code != -1 else recorded.pid
            holder = LockHolder(host=recorded.host, pid=pid, since=recorded.since)
    if holder is not None:
        raise CheckpointLockedError(
            directory=directory, host=holder.host, pid=holder.pid, since=holder.since
        )
    return WriterLease(directory, fresh=fresh, local=local)
