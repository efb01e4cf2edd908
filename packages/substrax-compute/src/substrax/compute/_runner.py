"""Running one task: its process group, piped logs with secrets redacted, its timeout."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from substrax.support import write_atomically

from ._environment import task_environment
from ._manifest import DEVICES_LOG, STDERR_LOG, STDOUT_LOG, RunDevices, TaskOutcome, TaskStatus
from ._processes import start_time


if TYPE_CHECKING:
    from ._spec import JobSpec, Task
STOP_SIGNAL = signal.SIGUSR1
"""The signal that asks a worker to stop its task gracefully (``TaskRunner.stop``)."""
_WAIT_SLICE_SECONDS = 0.1
_PUMP_SECONDS = 5.0  # how long a log pump may run on once the task's group is gone
TASK_PROCESS = ".task-process.json"
"""The running task's pid and start time, in its node's outputs: a worker killed mid-task
leaves its task running (in its own session), and ``cancel`` finds it there."""
LOG_NAMES = frozenset({STDOUT_LOG, STDERR_LOG})
PROBE_SECONDS = 300.0
_PROBE = (
    "import json, jax; d = jax.devices(); print(json.dumps({'platform': d[0].platform, "
    "'kinds': sorted({x.device_kind for x in d}), 'count': len(d)}))"
)


class _Redactor:
    """Replaces each secret's value with ``***`` in text that goes to a log."""

    def __init__(self, values: Iterable[str]) -> None:
        self._values = sorted((v for v in values if v), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, "***")
        return text


def _argv(task: "Task", python: str) -> list[str]:
    argv = list(task.argv)
    if argv[0] == "python":
        argv[0] = python
    return argv


def _pump(stream: IO[bytes], log: IO[str], prefix: str, echo: bool, redact: _Redactor) -> None:
    """Copy ``stream`` to ``log`` (and stdout); a log closed once the task ended stops it."""
    with contextlib.suppress(ValueError):  # a process out of the task's group kept writing
        for raw in iter(stream.readline, b""):
            line = redact(raw.decode(errors="replace"))
            log.write(line)
            log.flush()
            if echo:
                sys.stdout.write(f"{prefix}{line if line.endswith(chr(10)) else line + chr(10)}")
                sys.stdout.flush()


def _listing(task_dir: Path) -> tuple[str, ...]:
    files = (p for p in task_dir.rglob("*") if p.is_file() and not p.is_symlink())
    return tuple(
        sorted(
            p.relative_to(task_dir).as_posix()
            for p in files
            if p.name not in LOG_NAMES or p.parent != task_dir
        )
    )


class TaskRunner:
    """Runs one job's tasks.

    ``cancel`` (the worker's SIGTERM handler) kills the current task at once; ``stop`` (its
    ``STOP_SIGNAL`` handler) sends the task's process group SIGTERM and kills it only after
    the spec's ``stop_grace_seconds``. Either way no later task starts and the task reads as
    cancelled.
    """

    def __init__(
        self, spec: "JobSpec", *, project: Path, root: Path, echo: bool, python: str
    ) -> None:
        self.spec, self.project, self.root, self.echo, self.python = (
            spec,
            project,
            root,
            echo,
            python,
        )
        self.redact = _Redactor(os.environ.get(name, "") for name in spec.secrets)
        self.current: subprocess.Popen[bytes] | None = None
        self.cancelled = False
        self.kill_at: float | None = None

    def cancel(self) -> None:
        """Kill the current task's process group now; start no further task."""
        self.cancelled = True
        process = self.current
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Have the current task's process group sent SIGTERM, then SIGKILL after the spec's grace.

        Safe in a signal handler: it only sets flags, and the task's wait sends the signals.
        """
        self.cancelled = True
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.spec.stop_grace_seconds

    def _wait(self, process: subprocess.Popen[bytes], budget: float) -> bool:
        """Wait for ``process``; kill its group at the deadline or a stop's; True if timed out."""
        deadline = time.monotonic() + budget
        terminated = False
        while True:
            if self.kill_at is not None and not terminated:
                terminated = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
            limit = deadline if self.kill_at is None else min(deadline, self.kill_at)
            try:
                process.wait(timeout=max(0.0, min(limit - time.monotonic(), _WAIT_SLICE_SECONDS)))
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                stopped = self.kill_at is not None and now >= self.kill_at
                if stopped or now >= deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    return not stopped
            else:
                return False

    def _end_leftovers(self, pgid: int) -> None:
        """End what the task left running in its group: SIGTERM, SIGKILL after the stop grace.

        A background child would outlive the job, and one holding the task's output would keep
        its log, and so the job, open past every timeout.
        """
        deadline = time.monotonic() + self.spec.stop_grace_seconds
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
                while sig is signal.SIGTERM and time.monotonic() < deadline:
                    time.sleep(_WAIT_SLICE_SECONDS)
                    os.killpg(pgid, 0)  # ProcessLookupError once the group is empty
            except (ProcessLookupError, PermissionError):
                return

    def probe(self, budget: float = PROBE_SECONDS) -> RunDevices | None:
        """The devices the job's tasks would see, within ``budget`` (and ``PROBE_SECONDS``)."""
        log = self.root / DEVICES_LOG
        try:
            env = task_environment(self.spec, None, parent=os.environ)
            result = subprocess.run(
                [self.python, "-c", _PROBE],
                env=env,
                cwd=self.project,
                capture_output=True,
                text=True,
                timeout=max(0.0, min(budget, PROBE_SECONDS)),
                check=False,
            )
            lines = [line for line in result.stdout.splitlines() if line.strip()]
            if result.returncode == 0 and lines:
                return RunDevices.from_dict(json.loads(lines[-1]))
            log.write_text(self.redact(result.stdout + result.stderr))
        except (OSError, ValueError, LookupError, subprocess.TimeoutExpired) as error:
            log.write_text(self.redact(f"device probe failed: {error!r}\n"))
        return None

    def run_task(self, task: "Task", budget: float) -> TaskOutcome:
        task_dir = self.root / task.name
        task_dir.mkdir(parents=True, exist_ok=True)
        argv = _argv(task, self.python)
        start = time.monotonic()
        with (task_dir / STDOUT_LOG).open("w") as out, (task_dir / STDERR_LOG).open("w") as err:
            if budget <= 0 or self.cancelled:
                status = TaskStatus.CANCELLED if self.cancelled else TaskStatus.TIMED_OUT
                return TaskOutcome(
                    name=task.name, argv=task.argv, status=status, returncode=None, seconds=0.0
                )
            try:
                env = task_environment(self.spec, task_dir, parent=os.environ)
                process = subprocess.Popen(
                    argv,
                    cwd=self.project,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except (OSError, LookupError, ValueError) as error:
                reason = self.redact(f"could not start {argv[0]!r}: {error}\n")
                err.write(reason)
                if self.echo:  # as the task's own output is: else only its stderr.log says why
                    sys.stdout.write(f"[{task.name}] {reason}")
                    sys.stdout.flush()
                return TaskOutcome(
                    name=task.name,
                    argv=task.argv,
                    status=TaskStatus.FAILED,
                    returncode=None,
                    seconds=time.monotonic() - start,
                )
            self.current = process
            record = {"pid": process.pid, "start": start_time(process.pid)}
            with contextlib.suppress(OSError):  # without it only the worker's end reaches it
                write_atomically(self.root / TASK_PROCESS, json.dumps(record))
            # Both pipes exist: Popen was given PIPE for each.
            stdout, stderr = cast("IO[bytes]", process.stdout), cast("IO[bytes]", process.stderr)
            pumps = [
                threading.Thread(
                    target=_pump,
                    args=(pipe, log, f"[{task.name}] ", self.echo, self.redact),
                    daemon=True,  # a process that left the task's group may hold its pipe
                )
                for pipe, log in ((stdout, out), (stderr, err))
            ]
            for pump in pumps:
                pump.start()
            timed_out = self._wait(process, budget)
            self._end_leftovers(process.pid)
            (self.root / TASK_PROCESS).unlink(missing_ok=True)
            until = time.monotonic() + _PUMP_SECONDS
            for pump, pipe in zip(pumps, (stdout, stderr), strict=True):
                pump.join(max(0.0, until - time.monotonic()))
                if not pump.is_alive():  # closing a pipe a pump still reads would wait for it
                    pipe.close()
            self.current = None
        code = process.returncode
        if self.cancelled:
            status = TaskStatus.CANCELLED
        elif timed_out:
            status = TaskStatus.TIMED_OUT
        else:
            status = TaskStatus.SUCCEEDED if code == 0 else TaskStatus.FAILED
        return TaskOutcome(
            name=task.name,
            argv=task.argv,
            status=status,
            returncode=code,
            seconds=time.monotonic() - start,
            outputs=_listing(task_dir),
        )
