"""The writer lock, one writing process per store, and how a job's processes agree.

A store opened to write holds ``fcntl.flock`` on ``<directory>/.substrax-writer.lock`` and
records itself there (host, pid, since when, a nonce); the kernel frees it when the process dies.
The writing stores of one directory in a process share the lock. In a multi-host job process 0
decides (takes the lock, refuses a save) and every process acts on its decision (:func:`agree`);
the others find its nonce in their directory, or opened another (:func:`agreed_record` refuses).
"""

import contextlib
import fcntl
import itertools
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
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


def agreed_record(
    record: CheckpointMetadata, directory: Path, *, leaves: Mapping[str, str], shared: bool
) -> CheckpointMetadata:
    """Process 0's record of a save, on every process: its metrics, epoch and extra decide.

    Retention and ``best_step`` then choose the same steps on every process (metrics logged on
    process 0 alone, or computed on each process's shard, made them disagree and hang). The one
    exchange also carries each process's ``leaves`` (``{path: kind}``, ``_trees.leaf_kinds``)
    and whether it sees process 0's writer lock in its directory (``shared``).

    Raises:
        ValueError: the processes save different steps or trees, or opened different
            directories (raised on every process, before orbax writes anything).
        CheckpointWriteError: a process did not call ``save`` within ``TIMEOUT_MS``.
    """
    if jax.process_count() == 1:
        return record
    mine = {"record": record.to_dict(), "leaves": leaves, "at": str(directory), "shared": shared}
    given = gather(json.dumps(mine), topic="record")
    if missing := [str(index) for index, text in enumerate(given) if text is None]:
        cause = (
            f"process {', '.join(missing)} did not call save within {TIMEOUT_MS // 1000} s; "
            "every process of the job opens the store and saves each step (after a missed "
            "save the job's processes no longer pair their exchanges: restart them all, and "
            "resume from the latest step)"
        )
        raise CheckpointWriteError(step=record.step, directory=directory, cause=cause)
    saves = [json.loads(text) for text in given if text is not None]
    if unshared := [f"process {i}: {s['at']}" for i, s in enumerate(saves) if not s["shared"]]:
        raise ValueError(
            f"the processes of this job opened different checkpoint stores: process 0 writes "
            f"{saves[0]['at']}, and its writer lock is not in the directory of "
            f"{', '.join(unshared)}; every process opens the same store, on storage all of "
            "them share (a multi-node substrax-compute job gives each node its own output "
            "directory: pass the store a path every node sees)"
        )
    if len({saved["record"]["step"] for saved in saves}) > 1:
        steps = ", ".join(f"process {i}: {s['record']['step']}" for i, s in enumerate(saves))
        raise ValueError(
            f"the processes of this job save different steps ({steps}); every process calls "
            "save with the same step (count steps alike on each, never from its own data)"
        )
    if differing := _differing_leaves([saved["leaves"] for saved in saves]):
        raise ValueError(
            f"the processes of this job save different trees at step {record.step} "
            f"({differing}); every process saves the same items and leaves, each of one kind "
            "(a host-local or NumPy leaf may hold another value on each: process 0's is saved)"
        )
    return CheckpointMetadata.from_dict(saves[0]["record"])


def all_call(action: str, step: int, directory: Path) -> None:
    """Return once every process called ``action`` on ``step`` (orbax's barrier would hang).

    Raises:
        ValueError: a process did not call it within ``TIMEOUT_MS``, or called it on another
            step (on every process that did; ``step`` is left as it was).
    """
    if jax.process_count() == 1:
        return
    given = gather(str(step), topic=action)
    if missing := [str(index) for index, text in enumerate(given) if text is None]:
        raise ValueError(
            f"{action}({step}) on {directory}: process {', '.join(missing)} did not call it "
            f"within {TIMEOUT_MS // 1000} s, and the step was left as it was; every process of "
            f"the job calls {action} on the store, with the same step (after a missed call the "
            "job's processes no longer pair their exchanges: restart them all)"
        )
    if len(set(given)) > 1:
        steps = ", ".join(f"process {i}: {text}" for i, text in enumerate(given))
        raise ValueError(f"the processes of this job {action} different steps ({steps})")


_SHOWN: Final = 5  # the differing leaves a message names


def _differing_leaves(trees: list[dict[str, str]]) -> str:
    """The leaves (``item/path``) that ``trees`` (one per process) disagree on, as text, or ""."""
    paths = sorted({path for tree in trees for path in tree})
    differing = [path for path in paths if len({tree.get(path) for tree in trees}) > 1]
    shown = [
        f"{path}: "
        + ", ".join(f"process {i}: {tree.get(path, 'absent')}" for i, tree in enumerate(trees))
        for path in differing[:_SHOWN]
    ]
    more = len(differing) - _SHOWN
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


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
    nonce: str  # recorded in the lock file: another process seeing it shares the directory


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

    ``nonce``: on a process other than 0, the nonce process 0 recorded in its lock file.
    """

    def __init__(self, directory: Path, *, local: bool, nonce: str | None = None) -> None:
        self.directory = directory
        with _guard:  # the flock this process holds (a share of), None on other processes
            self._held = _held.get(directory) if local else None
        self._released = False
        self._nonce = nonce  # None once seen (or on process 0)

    def shared(self) -> bool:
        """Whether this process's directory holds process 0's lock file (one store, shared)."""
        if self._nonce is not None and _recorded_nonce(self.directory, self._nonce):
            self._nonce = None
        return self._nonce is None

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


def _recorded_nonce(directory: Path, nonce: str) -> bool:
    """Whether ``directory``'s lock file records ``nonce`` (re-read a while: storage may lag)."""
    for attempt in range(_READ_TRIES):
        with contextlib.suppress(OSError, ValueError):
            raw: Any = json.loads((directory / LOCK_FILE).read_text())
            if isinstance(raw, dict) and raw.get("nonce") == nonce:  # pyright: ignore[reportUnknownMemberType]
                return True
        if attempt + 1 < _READ_TRIES:
            time.sleep(0.05)
    return False


def _lock_here(directory: Path) -> tuple[bool, LockHolder | None, str]:
    """Take (or share) the flock in this process: (fresh, None, its nonce), or (False, holder, "")."""
    with _guard:
        held = _held.get(directory)
        if held is not None and _intact(directory, held):
            held.count += 1
            return False, None, held.nonce
        # none held, or its file removed with the directory: its stores keep it and fail to save
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False, read_holder(directory), ""
        except BaseException:
            os.close(fd)
            raise
        nonce = secrets.token_hex(8)
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
            "nonce": nonce,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        if jax.distributed.is_initialized():  # before the others look for its nonce (no backend)
            os.fsync(fd)
        found = os.fstat(fd)
        identity = (found.st_dev, found.st_ino)
        _held[directory] = _Held(fd=fd, count=1, identity=identity, nonce=nonce)
        return True, None, nonce


def take_writer_lock(directory: Path, *, clean: Callable[[Path], None]) -> WriterLease:
    """Lock ``directory`` for this job's writing, ``clean`` it when fresh; raise if another holds it."""
    # jax's backend is touched only once jax.distributed runs: a single process never starts it
    nonce = ""
    if not jax.distributed.is_initialized() or jax.process_index() == 0:
        fresh, holder, nonce = _lock_here(directory)
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
        # process 0 decides: 0 locked (fresh or shared) with its nonce, -pid (or -1) refused by pid
        decided = f"{0 if holder is None else -(holder.pid or 1)} {nonce}"
        text, _, nonce = agree(decided, topic="writer-lock").partition(" ")
        code = int(text)
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
    return WriterLease(directory, local=local, nonce=None if local else nonce)
