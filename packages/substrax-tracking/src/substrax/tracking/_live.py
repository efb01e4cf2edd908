"""Live locks (``<spool>.<run hash>.live``, flocked): a logger sending a run keeps replays off it."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import uuid
from pathlib import Path
from typing import Literal


__all__ = [
    "LiveLocks",
    "LiveState",
    "hold_live",
    "is_live",
    "let_go_live",
    "live_attempt",
    "live_state",
    "process_attempt",
    "try_flock",
]

type LiveState = Literal["live", "died", "none"]
"""A run's live lock: held (a logger sends the run), left by a process that never closed its
logger (killed; the file is removed once seen), or none (no logger, or one that closed)."""

_HELD: set[int] = set()  # the live locks held here: a forked child lets go of its copies
_ATTEMPT = [uuid.uuid4().hex]  # this process's attempt id: a forked child gets its own


def process_attempt() -> str:
    """This process's attempt id: what its loggers' live locks name (and MLflow's run tag)."""
    return _ATTEMPT[0]


def _path(spool: Path, run: str) -> Path:
    return spool.with_name(f"{spool.name}.{hashlib.sha256(run.encode()).hexdigest()[:16]}.live")


def try_flock(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` if no other holder has one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def hold_live(spool: Path, run: str, attempt: str = "") -> int:
    """Hold ``run``'s live lock beside ``spool`` until :func:`let_go_live` gets the returned fd.

    The file holds ``attempt``, the logger's attempt id (MLflow's ``substrax.attempt`` tag), so
    that a replay after a kill can tell whether a later attempt took the run over.
    """
    path = _path(spool, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)  # shared: loggers of one run in one process both hold it
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_ino == os.fstat(fd).st_ino:  # not removed as it was let go
                if attempt:  # this attempt's now, were it left by a killed one
                    with contextlib.suppress(OSError):  # a full disk: no attempt to compare
                        os.pwrite(fd, attempt.encode(), 0)
                        os.ftruncate(fd, len(attempt.encode()))
                _HELD.add(fd)
                return fd
        os.close(fd)


def live_attempt(spool: Path, run: str) -> str:
    """The attempt id ``run``'s live lock holds ("" when none, or no lock)."""
    try:
        return _path(spool, run).read_text(errors="replace")[:64]
    except OSError:
        return ""


def let_go_live(spool: Path, run: str, fd: int) -> None:
    """Let go of ``run``'s live lock, removing its file if no other logger holds it."""
    _HELD.discard(fd)
    os.close(fd)
    is_live(spool, run)


def is_live(spool: Path, run: str) -> bool:
    """Whether a logger (in any process) still sends ``run``'s records; a stale file is removed.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.tracking._live import hold_live, is_live, let_go_live
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     spool = Path(directory) / "run.spool.jsonl"
        ...     fd = hold_live(spool, "run-1")
        ...     print(is_live(spool, "run-1"), is_live(spool, "run-2"))
        ...     let_go_live(spool, "run-1", fd)
        ...     print(is_live(spool, "run-1"))
        True False
        False
    """
    return live_state(spool, run) == "live"


def live_state(spool: Path, run: str, *, remove: bool = True) -> LiveState:
    """``run``'s :data:`LiveState` beside ``spool``; a file left by a dead process is removed.

    With ``remove=False`` it is kept: a replay removes it once the run was ended FAILED, so that
    a replay that could not deliver the run leaves the next one the fact that it died.
    """
    path = _path(spool, run)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return "none"
    try:
        if not try_flock(fd):
            return "live"
        if remove:
            with contextlib.suppress(OSError):  # a closing logger removes it: its process died
                path.unlink()
        return "died"
    finally:
        os.close(fd)


class LiveLocks:
    """One logger's live locks beside ``spool``: one per name its run has had (a spec, an id)."""

    def __init__(self, spool: Path, attempt: str = "") -> None:
        self.spool, self.attempt = spool, attempt
        self.held: dict[str, int | None] = {}  # None: not held (a replay may send the run too)

    def hold(self, run: str) -> None:
        self.held[run] = None
        with contextlib.suppress(OSError):
            self.held[run] = hold_live(self.spool, run, self.attempt)

    def let_go(self) -> None:
        """Let go of every lock held (once: a second close never closes an fd reused since)."""
        for run, fd in self.held.items():
            if fd is not None:
                self.held[run] = None
                let_go_live(self.spool, run, fd)


def _let_go_in_child() -> None:
    _ATTEMPT[0] = uuid.uuid4().hex
    while _HELD:
        with contextlib.suppress(OSError):
            os.close(_HELD.pop())


os.register_at_fork(after_in_child=_let_go_in_child)
