"""Running one task: its process group, piped logs with secrets redacted, its timeout."""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, BinaryIO

from substrax.support import write_atomically

from ._environment import task_environment
from ._manifest import DEVICES_LOG, STDERR_LOG, STDOUT_LOG, RunDevices, TaskOutcome, TaskStatus
from ._processes import end_adopted, end_group, start_time


if TYPE_CHECKING:
    from ._spec import JobSpec, Task
STOP_SIGNAL = signal.SIGUSR1
"""The signal that asks a worker to stop its task gracefully (``TaskRunner.stop``)."""
SUPERVISOR_ENV = "SUBSTRAX_COMPUTE_SUPERVISOR_PID"
"""The local supervisor's pid, given to the workers it starts: a worker whose supervisor is gone
stops its task and starts no other."""
_WAIT_SLICE_SECONDS = 0.1
_PUMP_SECONDS = 5.0  # how long a log pump may run on once the task's group is gone
TASK_PROCESS = ".task-process.json"
"""The running task's pid, start time, name, argv and wall-clock start, in its node's outputs: a
worker killed mid-task leaves its task running (in its own session), and the supervisor and
``cancel`` find it there."""
LOG_ORDER = (STDOUT_LOG, STDERR_LOG)
LOG_NAMES = frozenset(LOG_ORDER)
PROBE_SECONDS = 300.0
_PROBE = (
    "import json, jax; d = jax.devices(); print(json.dumps({'platform': d[0].platform, "
    "'kinds': sorted({x.device_kind for x in d}), 'count': len(d)}))"
)


def _task_parent() -> dict[str, str]:
    """This process's environment, as a task inherits it: without the supervisor's pid."""
    return {k: v for k, v in os.environ.items() if k != SUPERVISOR_ENV}


def _environment_problem(task: "Task", error: Exception) -> str:
    """Why ``task`` was not started, when its environment could not be built: never the program.

    A job ``env`` entry that contradicts the runtime table or what substrax sets names both
    values (``EnvironmentConflictError``'s message).
    """
    from substrax.runtime import EnvironmentConflictError  # noqa: PLC0415

    if isinstance(error, EnvironmentConflictError):
        return f"task {task.name!r} not started: the job's env conflicts with its settings: {error}"
    return f"task {task.name!r} not started: the job's environment cannot be built: {error}"


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


def echo(prefix: str, line: str) -> bool:
    """Write ``line`` to stdout after ``prefix``; False when stdout is full or closed.

    A character stdout's encoding lacks (a C locale) is shown replaced, never an error.
    """
    text = f"{prefix}{line if line.endswith(chr(10)) else line + chr(10)}"
    try:
        try:
            sys.stdout.write(text)
        except UnicodeEncodeError:
            encoding = sys.stdout.encoding or "ascii"
            sys.stdout.write(text.encode(encoding, errors="replace").decode(encoding))
        sys.stdout.flush()
    except (OSError, ValueError):
        return False
    return True


class _Pump(threading.Thread):
    """Copies one of a task's pipes to its log (and stdout) until the pipe closes; owns the log.

    It never stops reading, so the task never blocks on a full pipe. The log is written as UTF-8
    whatever the locale (undecodable bytes replaced). Once a write to the log fails (a full disk,
    a file size limit), the rest of the output is discarded, and ``lost`` counts its bytes (the
    line that failed included) and ``reason`` says why. An echo that fails ends the echo only.
    """

    def __init__(
        self, stream: IO[bytes], log: BinaryIO, name: str, prefix: str | None, redact: _Redactor
    ) -> None:
        super().__init__(daemon=True)  # a process that left the task's group may hold its pipe
        self.stream, self.log, self.name = stream, log, name
        self.prefix, self.redact = prefix, redact
        self.lost = 0
        self.reason: str | None = None

    def run(self) -> None:
        try:
            for raw in iter(self.stream.readline, b""):
                if self.reason is not None:
                    self.lost += len(raw)
                    continue
                line = self.redact(raw.decode("utf-8", errors="replace"))
                self._write(raw, line.encode())
                if self.prefix is not None and not echo(self.prefix, line):
                    self.prefix = None  # stdout is full or closed: the log holds the output
        finally:
            with contextlib.suppress(OSError):
                self.log.close()

    def _write(self, raw: bytes, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                written = self.log.write(view) or 0
                if not written:
                    break
                view = view[written:]
        except OSError as error:
            self.reason = f"writing {self.name} failed: {error}"
        else:
            if view:
                self.reason = f"writing {self.name} failed: the file took no more bytes"
        if self.reason is not None:
            self.lost += len(raw)


_LINKS_NAMED = 3  # the links a note names, before "and N more"


def links_note(task: str, task_dir: Path) -> str | None:
    """What to say of the symbolic links under ``task_dir``, never fetched; None without any."""
    links = sorted(
        p.relative_to(task_dir).as_posix() for p in task_dir.rglob("*") if p.is_symlink()
    )
    if not links:
        return None
    more = len(links) - _LINKS_NAMED
    shown = ", ".join(links[:_LINKS_NAMED]) + (f" and {more} more" if more > 0 else "")
    return (
        f"task {task} left {len(links)} symbolic links in its outputs ({shown}), which are not "
        "fetched: links are never followed; write a file in their place"
    )


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
    cancelled. A task that reaches its timeout gets the same SIGTERM, then SIGKILL after the
    same grace (time to save a last checkpoint), and reads as timed out.
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
        self.adopts = False  # the worker's: this process adopts what a task leaves (Linux)
        self.notes: list[str] = []  # what a task left, for the worker's log

    def cancel(self) -> None:
        """Kill the current task's process group now; start no further task.

        Its wait kills the task too (one started before it was :attr:`current`, whose group the
        handler could not reach, or one a stop had given a grace).
        """
        self.kill_at = time.monotonic()
        self.cancelled = True
        process = self.current
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Have the current task's process group sent SIGTERM, then SIGKILL after the spec's grace.

        Safe in a signal handler: it only sets flags, and the task's wait sends the signals.
        """
        if self.kill_at is None:  # a cancel's, at once, stays
            self.kill_at = time.monotonic() + self.spec.stop_grace_seconds
        self.cancelled = True

    def _wait(self, process: subprocess.Popen[bytes], budget: float) -> bool:
        """Wait for ``process``; True if it timed out (its deadline came before any stop).

        At its deadline or a stop its group gets SIGTERM, then SIGKILL after the spec's
        ``stop_grace_seconds``; after a cancel, SIGKILL at once.
        """
        deadline = time.monotonic() + budget
        timeout_kill_at: float | None = None
        terminated = False
        while True:
            now = time.monotonic()
            if timeout_kill_at is None and self.kill_at is None and now >= deadline:
                timeout_kill_at = now + self.spec.stop_grace_seconds
            kill_at = min(
                (t for t in (self.kill_at, timeout_kill_at) if t is not None), default=None
            )
            if kill_at is not None and not terminated:
                terminated = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
            if kill_at is not None and now >= kill_at:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return timeout_kill_at is not None
            limit = deadline if kill_at is None else kill_at
            try:
                process.wait(timeout=max(0.0, min(limit - now, _WAIT_SLICE_SECONDS)))
            except subprocess.TimeoutExpired:
                continue
            return timeout_kill_at is not None

    def probe(self, budget: float = PROBE_SECONDS) -> RunDevices | None:
        """The devices the job's tasks would see, within ``budget`` (and ``PROBE_SECONDS``)."""
        log = self.root / DEVICES_LOG
        try:
            env = task_environment(self.spec, None, parent=_task_parent())
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

    def _outcome(self, task: "Task", status: TaskStatus, start: float) -> TaskOutcome:
        return TaskOutcome(
            name=task.name,
            argv=task.argv,
            status=status,
            returncode=None,
            seconds=time.monotonic() - start,
        )

    def _not_started(
        self, task: "Task", why: str, logs: tuple[BinaryIO, BinaryIO], start: float
    ) -> TaskOutcome:
        """The outcome of a task that could not start: failed, ``why`` in its stderr.log."""
        out, err = logs
        reason = self.redact(why + "\n")
        with out, err, contextlib.suppress(OSError):
            err.write(reason.encode())
        if self.echo:  # as the task's own output is: else only its stderr.log says why
            echo(f"[{task.name}] ", reason)
        return self._outcome(task, TaskStatus.FAILED, start)

    def run_task(self, task: "Task", budget: float) -> TaskOutcome:
        task_dir = self.root / task.name
        task_dir.mkdir(parents=True, exist_ok=True)
        argv = _argv(task, self.python)
        start = time.monotonic()
        out = (task_dir / STDOUT_LOG).open("wb", buffering=0)
        err = (task_dir / STDERR_LOG).open("wb", buffering=0)
        if budget <= 0 or self.cancelled:
            out.close()
            err.close()
            status = TaskStatus.TIMED_OUT if budget <= 0 else TaskStatus.CANCELLED
            return dataclasses.replace(self._outcome(task, status, start), seconds=0.0)
        try:
            env = task_environment(self.spec, task_dir, parent=_task_parent())
        except (LookupError, ValueError) as error:  # the job's env, secrets or runtime
            return self._not_started(task, _environment_problem(task, error), (out, err), start)
        pipes = (os.pipe(), os.pipe())  # (read, write) of its stdout, then of its stderr
        try:
            process = subprocess.Popen(
                argv,
                cwd=self.project,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=pipes[0][1],
                stderr=pipes[1][1],
                start_new_session=True,
                # the task holds its pipes' read ends too: if this worker is killed, a print in
                # its SIGTERM handler still has a reader (no BrokenPipeError) and it can save
                pass_fds=(pipes[0][0], pipes[1][0]),
            )
        except OSError as error:
            os.close(pipes[0][0])
            os.close(pipes[1][0])
            return self._not_started(
                task, f"could not start {argv[0]!r}: {error}", (out, err), start
            )
        finally:
            os.close(pipes[0][1])  # the task's copies are the only writers: EOF when it ends
            os.close(pipes[1][1])
        started = start_time(process.pid)
        record = {
            "pid": process.pid,
            "start": started,
            "task": task.name,
            "argv": list(task.argv),
            "time": time.time(),
        }
        with contextlib.suppress(OSError):  # without it only the worker's end reaches it
            write_atomically(self.root / TASK_PROCESS, json.dumps(record))
        prefix = f"[{task.name}] " if self.echo else None
        pumps = [
            _Pump(os.fdopen(read, "rb"), log, name, prefix, self.redact)
            for (read, _), log, name in zip(pipes, (out, err), LOG_ORDER, strict=True)
        ]
        for pump in pumps:
            pump.start()
        timed_out = self._wait(process, budget)
        # what the task left in its group: a background child would outlive the job, and one
        # holding the task's output would keep its log, and so the job, open past every timeout
        # (end_group waits for live members only: a zombie nobody reaps does not hold it)
        end_group(process.pid, started, self.spec.stop_grace_seconds)
        if self.adopts and (left := end_adopted(self.spec.stop_grace_seconds)):  # own sessions
            self.notes.append(f"task {task.name} left processes running {left}; they were ended")
        (self.root / TASK_PROCESS).unlink(missing_ok=True)
        until = time.monotonic() + _PUMP_SECONDS
        for pump in pumps:
            pump.join(max(0.0, until - time.monotonic()))
            if not pump.is_alive():  # closing a pipe a pump still reads would wait for it
                pump.stream.close()
        self.current = None
        code = process.returncode
        if timed_out:
            status = TaskStatus.TIMED_OUT
        elif self.cancelled:
            status = TaskStatus.CANCELLED
        else:
            status = TaskStatus.SUCCEEDED if code == 0 else TaskStatus.FAILED
        return TaskOutcome(
            name=task.name,
            argv=task.argv,
            status=status,
            returncode=code,
            seconds=time.monotonic() - start,
            outputs=_listing(task_dir),
            lost_log_bytes=sum(pump.lost for pump in pumps),
            lost_log_reason="; ".join(p.reason for p in pumps if p.reason is not None) or None,
        )
