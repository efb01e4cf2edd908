"""jax's coordination service in a process of its own, so that it outlives process 0.

``jax.distributed.initialize`` runs the job's coordination service inside process 0. When
process 0 dies, the service goes with it and jax aborts every other process at once from C++
(its clients cannot reach the service), with no Python cleanup. With ``fail_fast``,
``initialize_distributed`` instead has process 0 start the service in a small child process
(this module run with ``python -m``) on the coordinator's port; process 0 then talks to it as a
client like every other process. A dead process 0 is then only a task that stopped sending
heartbeats: the others' peer watches name it, as any other dead peer.

The child never outlives the job by more than its grace period: process 0 stops it after a
clean shutdown (every process met at exit and disconnected); once process 0 is gone without
stopping it, it serves ``grace`` more seconds, time for the other processes to see process 0
dead, run their hook and exit, then ends: sooner where it can tell that no client is connected
any more (on Linux, from the kernel's socket tables), and at once when process 0 said that every
other process is dead. It runs in a session of its own (a signal to process 0's process group
does not take the service away from the others) with its stdin and stdout piped to process 0
only and its log in an unlinked temporary file, so it never holds a pipe that a caller of
process 0 reads to its end.
"""

import contextlib
import importlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from ._errors import CoordinatorPortError


_READY = b"ready\n"
_STOP = b"stop\n"
_ALONE = b"alone\n"
_PARENT_POLL_SECONDS = 0.2
_QUIET_SECONDS = 2.0
_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_ESTABLISHED = "01"
_SHUTDOWN_SECONDS = 5.0


class CoordinatorProcess:
    """The child process that serves a job's coordination service (on process 0).

    Use ``start``; once it returned, clients can connect to the service.
    """

    def __init__(self, process: "subprocess.Popen[bytes]") -> None:
        self._process = process

    @classmethod
    def start(
        cls,
        bind_address: str,
        *,
        num_processes: int,
        heartbeat_timeout: int,
        shutdown_timeout: int,
        grace_seconds: float,
        timeout: float = 30.0,
    ) -> "CoordinatorProcess":
        """Start the service on ``bind_address`` and wait until it listens.

        Raises:
            CoordinatorPortError: The service (an ``OSError``) did not start within ``timeout`` (its last log line says why,
                e.g. the port is taken).
        """
        argv = [
            sys.executable,
            "-m",
            __name__,
            bind_address,
            str(num_processes),
            str(heartbeat_timeout),
            str(shutdown_timeout),
            str(grace_seconds),
            str(os.getpid()),
        ]
        with tempfile.TemporaryFile() as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
            if _read_line(process, timeout) == _READY:
                return cls(process)
            process.kill()
            process.wait()
            _close_pipes(process)
            log.seek(0)
            lines = log.read().decode(errors="replace").strip().splitlines()
        raise CoordinatorPortError(
            bind_address,
            f"jax's coordination service did not start on {bind_address} (exit status "
            f"{process.returncode}): {lines[-1] if lines else 'no output'}",
        )

    def stop(self) -> None:
        """End the service at once (after a clean shutdown, or when the job never started)."""
        with contextlib.suppress(OSError):
            stdin = self._process.stdin
            if stdin is not None:
                stdin.write(_STOP)
                stdin.flush()
        try:
            self._process.wait(timeout=_SHUTDOWN_SECONDS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        _close_pipes(self._process)

    def release(self) -> None:
        """Let the service end as soon as this process does: no other process needs it any more.

        The service stays up while this process lives (its own client would abort without it).
        """
        with contextlib.suppress(OSError):
            stdin = self._process.stdin
            if stdin is not None:
                stdin.write(_ALONE)
                stdin.flush()


def _close_pipes(process: "subprocess.Popen[bytes]") -> None:
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def _read_line(process: "subprocess.Popen[bytes]", timeout: float) -> bytes:
    """The child's first line on stdout, or ``b""`` when none came within ``timeout``."""
    stdout = process.stdout
    if stdout is None:  # pragma: no cover - always piped
        return b""
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else b""


def _serve(
    bind_address: str,
    *,
    num_processes: int,
    heartbeat_timeout: int,
    shutdown_timeout: int,
    grace_seconds: float,
    parent: int,
    stdin: IO[bytes],
    stdout: IO[bytes],
) -> None:
    # jaxlib's extension alone, not jax: the service starts in a fraction of a second
    jaxlib: Any = importlib.import_module("jaxlib._jax")
    service = jaxlib.get_distributed_runtime_service(
        bind_address,
        num_processes,
        heartbeat_timeout=heartbeat_timeout,
        shutdown_timeout=shutdown_timeout,
        recoverable=True,
    )
    stopped = threading.Event()
    parent_gone = threading.Event()
    alone = threading.Event()

    def read_commands() -> None:
        while (line := stdin.readline()) == _ALONE:
            alone.set()
        if line == _STOP:
            stopped.set()
        else:  # end of input: process 0 died (or closed the pipe without a word)
            parent_gone.set()

    threading.Thread(target=read_commands, daemon=True).start()
    with contextlib.suppress(OSError):
        stdout.write(_READY)
        stdout.flush()
    while not stopped.is_set() and not parent_gone.is_set():
        if os.getppid() != parent:  # a child process of process 0 may still hold the pipe
            parent_gone.set()
        stopped.wait(_PARENT_POLL_SECONDS)
    if parent_gone.is_set() and not alone.is_set():
        _serve_the_others(int(bind_address.rpartition(":")[2]), grace_seconds, stopped)
    closing = threading.Thread(target=service.shutdown, daemon=True)
    closing.start()
    closing.join(_SHUTDOWN_SECONDS)


def _serve_the_others(port: int, grace_seconds: float, stopped: threading.Event) -> None:
    """Serve for ``grace_seconds``, or until no client has been connected for a little while."""
    deadline = time.monotonic() + grace_seconds
    quiet_since: float | None = None
    while not stopped.wait(_PARENT_POLL_SECONDS):
        now = time.monotonic()
        if now >= deadline:
            return
        if _clients_connected(port) is False:
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= _QUIET_SECONDS:
                return
        else:
            quiet_since = None


def _clients_connected(port: int) -> bool | None:
    """Whether a TCP connection to ``port`` is established on this host; ``None`` when unknown.

    jax's clients keep one connection open to the service while they live (their heartbeats).
    Read from Linux's socket tables; elsewhere the grace period alone ends the service.
    """
    known = False
    for table in _TCP_TABLES:
        try:
            with table.open(encoding="ascii") as rows:
                next(rows, None)  # the header
                for row in rows:
                    fields = row.split()
                    local, state = fields[1], fields[3]
                    if state == _ESTABLISHED and int(local.rpartition(":")[2], 16) == port:
                        return True
        except (OSError, ValueError, IndexError):
            continue
        known = True
    return False if known else None


def main(argv: list[str]) -> None:
    """Serve until stopped, or until ``grace`` seconds after process 0 is gone."""
    bind_address, num_processes, heartbeat, shutdown, grace, parent = argv
    _serve(
        bind_address,
        num_processes=int(num_processes),
        heartbeat_timeout=int(heartbeat),
        shutdown_timeout=int(shutdown),
        grace_seconds=float(grace),
        parent=int(parent),
        stdin=sys.stdin.buffer,
        stdout=sys.stdout.buffer,
    )
    os._exit(0)  # no interpreter teardown racing the service's own threads


if __name__ == "__main__":
    main(sys.argv[1:])
