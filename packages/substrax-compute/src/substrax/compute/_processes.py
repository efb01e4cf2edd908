"""Detached processes: spawn in a new session, recognise them later by pid and start time.

psutil reads a process's state and start time on every OS, so a pid reused by another
process is never taken for the run's.
"""

import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil


def start_time(pid: int) -> str:
    """When process ``pid`` started, as psutil reports it (seconds since the epoch, as text).

    Stored with a pid so that a later check can tell the same process from a new one that
    reuses its pid. Returns ``""`` where the process is gone or can't be inspected.

    Example:
        >>> import os
        >>> from substrax.compute._processes import start_time
        >>> start_time(os.getpid()) != ""
        True
    """
    try:
        return _stamp(psutil.Process(pid).create_time())
    except psutil.Error:
        return ""


def _stamp(created: float) -> str:
    return f"{created:.3f}"


def is_alive(pid: int, started: str) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` and has not exited.

    A zombie counts as exited, and so does a process whose start time differs from
    ``started`` (its pid was reused); an empty ``started`` skips that check. Reaps the process
    when it is this process's exited child, so no zombie is left behind.

    Example:
        >>> import os
        >>> from substrax.compute._processes import is_alive, start_time
        >>> is_alive(os.getpid(), start_time(os.getpid()))
        True
        >>> is_alive(os.getpid(), "0.000")
        False
    """
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return not started or _stamp(process.create_time()) == started
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process holds the pid: not ours any more
        return False


def spawn_detached(argv: Sequence[str], *, env: Mapping[str, str], log: Path) -> int:
    """Start ``argv`` in a new session, with its output appended to ``log``.

    Returns:
        The new process's pid, which is also its session's process group id.
    """
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawnp(argv[0], list(argv), dict(env), file_actions=actions, setsid=True)


def kill_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group ``pgid``; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int, started: str) -> bool:
    """Whether the process group ``pgid``, led by the process that started at ``started``, lives.

    Its leader alive is enough. A leader that is gone (``kill -9``) leaves the group alive while
    any member is; a pid that another process holds now (its start time differs) is not the
    group asked about. An empty ``started`` skips that check.

    Example:
        >>> import os
        >>> from substrax.compute._processes import group_alive
        >>> group_alive(os.getpgid(0), "")  # this process's own group
        True
        >>> group_alive(os.getpid(), "0.000")  # a pid that another process holds now
        False
    """
    if is_alive(pgid, started):  # also reaps it when it is this process's exited child
        return True
    now = start_time(pgid)
    if now and started and now != started:
        return False
    try:
        os.killpg(pgid, 0)  # a zombie counts here: look for a member that is none
    except (ProcessLookupError, PermissionError):
        return False
    return any(_member(pid, pgid) for pid in psutil.pids() if pid != pgid)


def _member(pid: int, pgid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process of the group ``pgid``."""
    try:
        return os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False


def _wait_group(pgid: int, started: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while group_alive(pgid, started):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def end_group(pgid: int, started: str, grace: float, *, terminated: float | None = None) -> None:
    """SIGTERM the group ``pgid`` while it lives (:func:`group_alive`); SIGKILL it after ``grace``.

    ``terminated`` is when (``time.monotonic()``) the group was sent SIGTERM already: it gets
    no second one (a task's handler would run again), and ``grace`` counts from then. Returns
    once the group is gone, or ``grace`` after the SIGKILL.
    """
    if not group_alive(pgid, started):
        return
    if terminated is None:
        kill_group(pgid, signal.SIGTERM)
        terminated = time.monotonic()
    if not _wait_group(pgid, started, terminated + grace - time.monotonic()):
        kill_group(pgid, signal.SIGKILL)
        _wait_group(pgid, started, grace)


_PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def adopt_orphans() -> bool:
    """Have this process adopt what its descendants leave behind (Linux's child subreaper).

    A task's child in a session of its own (``start_new_session``), which its group's end
    does not reach, is then this process's child once the task ends. Whether it could.
    """
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def end_adopted(grace: float) -> list[int]:
    """End every live descendant of this process: SIGTERM, then SIGKILL after ``grace``; their pids.

    Only for a process whose children are what its ended tasks left (the worker, once each
    task is reaped). Adopted children that already died are reaped.
    """
    try:
        left = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    live = [p for p in left if _status(p) not in (None, psutil.STATUS_ZOMBIE)]
    for process in live:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, stuck = psutil.wait_procs(live, timeout=grace)
    for process in stuck:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(stuck, timeout=grace)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:  # the adopted ones that were zombies already
            pass
    return [process.pid for process in live]


def _status(process: psutil.Process) -> str | None:
    try:
        return process.status()
    except psutil.Error:
        return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
