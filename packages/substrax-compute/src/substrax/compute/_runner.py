"""Running one task: its process group, piped logs with secrets redacted, its timeout."""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from substrax.support import env_values_agree, write_atomically

from ._environment import FAILED_AT_ENV, task_environment
from ._manifest import DEVICES_LOG, STDERR_LOG, STDOUT_LOG, RunDevices, TaskOutcome, TaskStatus
from ._processes import end_adopted, end_group, start_time
from ._pump import Pump, Redactor, echo


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


def _argv(task: "Task", python: str) -> list[str]:
    argv = list(task.argv)
    if argv[0] == "python":
        argv[0] = python
    return argv


def _start_problem(argv: list[str], error: OSError | UnicodeEncodeError) -> str:
    """Why a task's process could not start: the program, or text this locale can't pass on.

    Under a C locale (``LC_ALL=C``, ``PYTHONUTF8=0``) an argument, an ``env`` value or the
    project's path with non-ASCII text can't be encoded for the new process.
    """
    if isinstance(error, OSError):
        return f"could not start {argv[0]!r}: {error}"
    return (
        f"could not start {argv[0]!r}: {error.object!r} (an argument, an env value or the project's "
        f"path) has text this locale's encoding, {error.encoding}, can't pass to a process; run "
        "under a UTF-8 locale (LC_ALL=C.UTF-8) or with PYTHONUTF8=1"
    )


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

    ``cancel`` (the worker's SIGTERM handler) and ``stop`` (its ``STOP_SIGNAL`` handler) send
    the current task's process group SIGTERM and kill it only after the spec's
    ``stop_grace_seconds`` (time to save a last checkpoint); no later task starts and the task
    reads as cancelled. A task that reaches its timeout gets the same SIGTERM, then SIGKILL
    after the same grace, and reads as timed out.
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
        self.redact = Redactor({name: os.environ.get(name, "") for name in spec.secrets})
        self.cancelled = False
        self.kill_at: float | None = None
        self.adopts = False  # the worker's: this process adopts what a task leaves (Linux)
        self.notes: list[str] = []  # what a task left, for the worker's log

    def cancel(self) -> None:
        """Cancel the run: as :meth:`stop` (SIGTERM, SIGKILL after the grace; no further task)."""
        self.stop()

    def stop(self) -> None:
        """Have the current task's process group sent SIGTERM, then SIGKILL after the spec's grace.

        Safe in a signal handler: it only sets flags, and the task's wait sends the signals
        (also to a task that was starting as it came). A second stop keeps the first's deadline.
        """
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.spec.stop_grace_seconds
        self.cancelled = True

    def _wait(self, process: subprocess.Popen[bytes], budget: float) -> tuple[bool, float | None]:
        """Wait for ``process``; whether it timed out, and when its group got SIGTERM (or None).

        It timed out when its deadline came before any stop; the time is ``time.monotonic()``'s.
        At its deadline, a stop or a cancel its group gets SIGTERM, then SIGKILL after the
        spec's ``stop_grace_seconds``.
        """
        deadline = time.monotonic() + budget
        timeout_kill_at: float | None = None
        terminated: float | None = None
        while True:
            now = time.monotonic()
            if timeout_kill_at is None and self.kill_at is None and now >= deadline:
                timeout_kill_at = now + self.spec.stop_grace_seconds
            kill_at = min(
                (t for t in (self.kill_at, timeout_kill_at) if t is not None), default=None
            )
            if kill_at is not None and terminated is None:
                terminated = now
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
            if kill_at is not None and now >= kill_at:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return timeout_kill_at is not None, terminated
            limit = deadline if kill_at is None else kill_at
            try:
                process.wait(timeout=max(0.0, min(limit - now, _WAIT_SLICE_SECONDS)))
            except subprocess.TimeoutExpired:
                continue
            return timeout_kill_at is not None, terminated

    def dropped(self) -> list[str]:
        """This process's ``JAX_*`` and ``XLA_*`` variables whose value a task does not get.

        ``child_environment`` drops them: a task sees the job's runtime table and env only.
        Empty when the job's environment cannot be built (each task then says why).
        """
        parent = _task_parent()
        try:
            env = task_environment(self.spec, self.root, parent=parent)
        except (LookupError, ValueError):
            return []
        prefixes = ("JAX_", "XLA_")
        return sorted(
            n
            for n, v in parent.items()
            if n.startswith(prefixes) and (n not in env or not env_values_agree(n, v, env[n]))
        )

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
        except (OSError, UnicodeEncodeError) as error:
            os.close(pipes[0][0])
            os.close(pipes[1][0])
            return self._not_started(task, _start_problem(argv, error), (out, err), start)
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
            Pump(os.fdopen(read, "rb"), log, name, prefix, self.redact)
            for (read, _), log, name in zip(pipes, (out, err), LOG_ORDER, strict=True)
        ]
        for pump in pumps:
            pump.start()
        timed_out, terminated = self._wait(process, budget)
        code = process.returncode
        if (not timed_out and not self.cancelled and code != 0) or (code or 0) > 0:
            mark_failure(code)  # now: what the task left may take the grace to end
        # what the task left in its group: a background child would outlive the job, and one
        # holding the task's output would keep its log, and so the job, open past every timeout
        # (end_group waits for live members only: a zombie nobody reaps does not hold it); a
        # group sent SIGTERM already (a wrapper that died of it) gets no second one, only the
        # rest of its grace
        end_group(process.pid, started, self.spec.stop_grace_seconds, terminated=terminated)
        if self.adopts and (left := end_adopted(self.spec.stop_grace_seconds)):  # own sessions
            self.notes.append(f"task {task.name} left processes running {left}; they were ended")
        (self.root / TASK_PROCESS).unlink(missing_ok=True)
        until = time.monotonic() + _PUMP_SECONDS
        for pump in pumps:
            pump.join(max(0.0, until - time.monotonic()))
            if not pump.is_alive():  # closing a pipe a pump still reads would wait for it
                pump.stream.close()
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


def mark_failure(returncode: int | None) -> None:
    """Write when this node's first task failed, and how, where the supervisor asked for it.

    In a multi-node job a node's failure makes its peers fail too, and the workers' exits can
    come in any order; the supervisor blames the node whose task failed first. A task the
    supervisor stopped counts when it ended with a status of its own (a process that raised
    can take seconds to exit while jax shuts down; the stop signal itself ends none that way).
    """
    path = os.environ.get(FAILED_AT_ENV)
    if path and not Path(path).exists():
        record = json.dumps({"time": time.time(), "returncode": returncode})
        with contextlib.suppress(OSError):  # without it the supervisor blames the first exit
            write_atomically(Path(path), record)
