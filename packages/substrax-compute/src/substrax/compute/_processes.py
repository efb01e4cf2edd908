"""Detached processes: spawn in a new session, recognise them later by pid and start time."""

import contextlib
import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22).

    Returns ``""`` where ``/proc`` is absent or the process is gone.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]


def is_alive(pid: int, started: str) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` and has not exited.

    Reaps the process when it is this process's exited child, so no zombie is left behind.
    """
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    stat_path = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():
        try:
            fields = stat_path.read_text().rpartition(")")[2].split()
        except OSError:
            return False
        return fields[0] != "Z" and (not started or fields[19] == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def wait_all_dead(processes: Sequence[tuple[int, str]], timeout: float) -> bool:
    """Poll until none of ``(pid, start)`` is alive or ``timeout`` passes; True if all ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(is_alive(pid, started) for pid, started in processes):
            return True
        time.sleep(0.05)
    return not any(is_alive(pid, started) for pid, started in processes)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
