"""The writer lock, one writing process per store, and how a job's processes agree.

A store opened to write holds ``fcntl.flock`` on ``<directory>/.substrax-writer.lock`` and
records itself there (host, pid, since when); the kernel frees it when the process dies. The
writing stores of one directory in a process share the lock. In a multi-host job process 0
decides (takes the lock, refuses a save) and every process acts on its decision (:func:`agree`).
"""

import contextlib
import fcntl
import itertools
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

from substrax.runtime import distributed_state

from ._metadata import CheckpointMetadata
from ._write_errors import (
    CheckpointLockedError,
    CheckpointWriteError,
    DistributedNotInitializedError,
)


LOCK_FILE: Final = ".substrax-writer.lock"
_READ_TRIES: Final = 20  # the holder writes its record just after locking: re-read until whole
TIMEOUT_MS: Final = 300_000
_decisions = itertools.count()


def coordination_client(needed_by: str) -> Any:  # noqa: ANN401  (jax's private client)
    """``jax.distributed``'s client; ``DistributedNotInitializedError`` naming ``needed_by`` if none."""
    client = distributed_state().client
    if client is None:
        raise DistributedNotInitializedError(process_count=jax.process_count(), needed_by=needed_by)
    return client


def agree(value: str, *, topic: str = "save") -> str:
    """Process 0's ``value`` on every process, through ``jax.distributed``'s key-value store."""
    if jax.process_count() == 1:
        return value
    client = coordination_client("the checkpoint store")
    key = f"substrax_checkpoint/{topic}/{next(_decisions)}"
    if jax.process_index() == 0:
        client.key_value_set(key, value)
        return value
    return str(client.blocking_key_value_get(key, TIMEOUT_MS))


def gather(value: str, *, topic: str) -> list[str | None]:
    """Every process's ``value``, in process order, on every process (each waits for all).

    A process that has not given its value within ``TIMEOUT_MS`` has None in its place.
    """
    if jax.process_count() == 1:
        return [value]
    client = coordination_client("the checkpoint store")
    key = f"substrax_checkpoint/{topic}/{next(_decisions)}"
    client.key_value_set(f"{key}/{jax.process_index()}", value)
    with contextlib.suppress(Exception):  # jax's error at the timeout: who is missing is below
        client.wait_at_barrier(key, TIMEOUT_MS)
    found = dict(client.key_value_dir_get(key))
    return [found.get(f"{key}/{index}") for index in range(jax.process_count())]


def agreed_record(record: CheckpointMetadata, directory: Path) -> CheckpointMetadata:
    """Process 0's record of a save, on every process: its metrics, epoch and extra decide.

    Retention and ``best_step`` then choose the same steps on every process (metrics logged on
    process 0 alone, or computed on each process's shard, made them disagree and hang).

    Raises:
        ValueError: the processes save different steps (raised on every process).
        CheckpointWriteError: a process did not call ``save`` within ``TIMEOUT_MS``.
    """
    if jax.process_count() == 1:
        return record
    given = gather(json.dumps(record.to_dict()), topic="record")
    if missing := [str(index) for index, text in enumerate(given) if text is None]:
        cause = (
            f"process {', '.join(missing)} did not call save within {TIMEOUT_MS // 1000} s; "
            "every process of the job opens the store and saves each step"
        )
        raise CheckpointWriteError(step=record.step, directory=directory, cause=cause)
    records = [json.loads(text) for text in given if text is not None]
    if len({saved["step"] for saved in records}) > 1:
        steps = ", ".join(f"process {i}: {saved['step']}" for i, saved in enumerate(records))
        raise ValueError(
            f"the processes of this job save different steps ({steps}); every process calls "
            "save with the same step (count steps alike on each, never from its own data)"
        )
    return CheckpointMetadata.from_dict(records[0])


def is_primary() -> bool:
    """Whether this process writes the store's own files (the index)."""
    return jax.process_index() == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LockHolder:
    """The process that holds a store's writer lock, as it recorded itself (None: unreadable)."""

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
    """This store's share of the writer lock; ``release`` is idempotent."""

    def __init__(self, directory: Path, *, local: bool) -> None:
        self.directory = directory
        with _guard:  # the flock this process holds (a share of), None on other processes
            self._held = _held.get(directory) if local else None
        self._released = False

    def intact(self) -> bool:
        """Whether the lock file this lease locked (same device and inode) still stands there."""
        held = self._held
        return held is None or self._released or _intact(self.directory, held)

    def release(self) -> None:
        """Give this share back; the last share of the process unlocks the file."""
        with _guard:
            held, released, self._released = self._held, self._released, True
            if released or held is None or held.fd < 0:
                return
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
    """The holder recorded in ``directory``'s lock file (fields None where unreadable)."""
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
    """Lock ``directory`` for this job's writing, ``clean`` it when fresh; raise if another holds it."""
    # jax's backend is touched only once jax.distributed runs: a single process never starts it
    if not jax.distributed.is_initialized() or jax.process_index() == 0:
        fresh, holder = _lock_here(directory)
        if fresh:
            try:
                clean(directory)
            except BaseException:
                WriterLease(directory, local=True).release()
                raise
        local = holder is None
    else:
        holder, local = None, False
    if jax.distributed.is_initialized():
        # process 0 decides: 0 locked (fresh or shared), -pid (or -1) refused by pid
        code = int(agree(str(0 if holder is None else -(holder.pid or 1)), topic="writer-lock"))
        if code < 0 and holder is None:
            if local:
                WriterLease(directory, local=True).release()
            recorded = read_holder(directory)  # readable where the directory is shared
            pid = -code if code != -1 else recorded.pid
            holder = LockHolder(host=recorded.host, pid=pid, since=recorded.since)
    if holder is not None:
        raise CheckpointLockedError(
            directory=directory, host=holder.host, pid=holder.pid, since=holder.since
        )
    return WriterLease(directory, local=local)
