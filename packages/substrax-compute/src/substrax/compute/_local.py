"""The ``local`` backend: the job runs detached on this machine.

A supervisor leads the run's session and starts one worker per node: a job with ``nodes = N``
runs as N workers wired for ``initialize_distributed`` on 127.0.0.1, so a multi-host job can be
tried here first. Once a worker fails the supervisor stops the other nodes (their tasks get
SIGTERM, and SIGKILL after ``stop_grace_seconds``) and records the first failed node in the
job's manifest; a worker that dies mid-task has its task ended by the supervisor, and a worker
whose supervisor died stops its task and starts no other. A run is final only once none of its processes lives:
the supervisor, a worker, or a task it recorded. ``cancel`` ends every process group the run
recorded that still lives, whatever the run reads. Extras are installed with uv into an
environment kept per (project, extras) under the state directory, never into the project's own
``.venv``; the install does not count against the job's ``timeout_seconds`` (the supervisor
allows it up to ``EXTRAS_SETUP_SECONDS`` more).

Settings (``[tool.substrax.compute.backends.local]``): ``state_dir``, ``python`` (the
interpreter for a job without extras, a relative path taken from the project's directory;
default the project's ``.venv`` python, else this one),
``mounts`` (``{mount name: directory on this machine}``).

Example:
    >>> from substrax.compute import LocalBackend
    >>> backend = LocalBackend({})
    >>> backend.name
    'local'
"""

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ._backend import RunHandle, RunState, backend_state_dir, new_run, stage_run
from ._environment import NODE_RANK_ENV, mount_env_name, node_outputs
from ._errors import (
    ComputeConfigError,
    MountDirectoryNotFoundError,
    MountPathError,
    SecretNotSetError,
)
from ._files import copy_atomically, copy_outputs, follow_lines
from ._local_python import check_python, local_python
from ._manifest import MANIFEST_NAME, JobManifest, read_manifest
from ._processes import end_group, free_port, group_alive, spawn_detached, start_time
from ._records import COMPONENT, JsonValue
from ._run_errors import RunDirectoryGoneError
from ._runner import TASK_PROCESS
from ._supervisor import CANCELLED_MARKER, NODES_FILE, write_plan
from ._toml import ROOT_PATH


if TYPE_CHECKING:
    from ._spec import JobSpec


CANCEL_GRACE_SECONDS = 10.0
_WORKERS_MARGIN_SECONDS = 5.0  # for the workers to end once their tasks' grace is over
EXTRAS_SETUP_SECONDS = 1800.0
"""How long ``uv`` may take to install a job's extras before its worker begins the job."""
_SETTINGS = ("state_dir", "python", "mounts")


def _got(value: object) -> str:
    return json.dumps(value, default=str)


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalSettings:
    """The ``local`` backend's settings table, checked without pydantic (``status`` reads it).

    Example:
        >>> from substrax.compute._local import LocalSettings
        >>> LocalSettings.read({"mounts": {"data": "/srv/data"}}).mounts
        {'data': '/srv/data'}
        >>> LocalSettings.read({"pyhton": "python3"})
        Traceback (most recent call last):
        ...
        substrax.compute.ComputeConfigError: tool.substrax.compute.backends.local.pyhton: unknown key; allowed keys: state_dir, python, mounts
    """

    state_dir: str | None = None
    python: str | None = None
    mounts: dict[str, str] = field(default_factory=dict[str, str])

    @classmethod
    def read(cls, settings: Mapping[str, object]) -> "LocalSettings":
        """Check ``[tool.substrax.compute.backends.local]``; refusals name their TOML path.

        Raises:
            ComputeConfigError: Every unknown key and bad value.
        """
        prefix = f"{ROOT_PATH}.backends.local"
        problems = [
            (f"{prefix}.{key}", f"unknown key; allowed keys: {', '.join(_SETTINGS)}")
            for key in settings
            if key not in _SETTINGS
        ]
        for key in ("state_dir", "python"):
            value = settings.get(key)
            if value is not None and not isinstance(value, str):
                problems.append((f"{prefix}.{key}", f"must be a string, got {_got(value)}"))
        if settings.get("python") == "":
            why = (
                "is empty; name an interpreter, or leave python out for the project's .venv python"
            )
            problems.append((f"{prefix}.python", why))
        mounts = settings.get("mounts", {})
        if not isinstance(mounts, dict):
            problems.append((f"{prefix}.mounts", f"must be a table, got {_got(mounts)}"))
            mounts = {}
        for name, where in cast("dict[object, object]", mounts).items():
            if not isinstance(name, str) or not COMPONENT.fullmatch(name) or name in {".", ".."}:
                problems.append((f"{prefix}.mounts", f"key must be a mount name, got {_got(name)}"))
            elif not isinstance(where, str):
                problems.append((f"{prefix}.mounts.{name}", f"must be a string, got {_got(where)}"))
        if problems:
            raise ComputeConfigError(problems)
        return cls(
            state_dir=cast("str | None", settings.get("state_dir")),
            python=cast("str | None", settings.get("python")),
            mounts=dict(cast("dict[str, str]", mounts)),
        )


class LocalBackend:
    """Runs jobs as detached worker processes on this machine.

    Args:
        settings: The ``[tool.substrax.compute.backends.local]`` table.

    Raises:
        ComputeConfigError: A setting is unknown or malformed.
    """

    name = "local"

    def __init__(self, settings: Mapping[str, JsonValue] | None = None) -> None:
        self.raw_settings: dict[str, JsonValue] = dict(settings or {})
        self.settings = LocalSettings.read(self.raw_settings)
        self.state_dir = backend_state_dir(self.settings.state_dir, self.name)

    def _python(self, project: Path) -> str:
        return local_python(self.settings.python, project)

    def worker_command(self, spec: "JobSpec", project: Path) -> tuple[list[str], dict[str, str]]:
        """The interpreter argv prefix and extra environment that run the worker for ``spec``.

        Without extras this is the project's interpreter. With extras it is ``uv run --frozen
        --extra X ... python`` with ``UV_PROJECT_ENVIRONMENT`` set to an environment kept per
        (project, extras), so the project's own ``.venv`` is left as it is.
        """
        if not spec.extras:
            return [self._python(project)], {}
        key = hashlib.sha256(f"{project}\0{sorted(spec.extras)}".encode()).hexdigest()[:16]
        uv = shutil.which("uv") or "uv"
        argv = [uv, "run", "--project", str(project), "--frozen"]
        for extra in spec.extras:
            argv += ["--extra", extra]
        argv.append("python")
        return argv, {"UV_PROJECT_ENVIRONMENT": str(self.state_dir / "envs" / key)}

    def _mount_env(self, spec: "JobSpec", project: Path) -> dict[str, str]:
        env: dict[str, str] = {}
        for mount in spec.mounts:
            source = self.settings.mounts.get(mount.name)
            where = (project / source).resolve() if source else Path(mount.path)
            if source and not Path(source).is_absolute() and not where.is_relative_to(project):
                raise MountPathError(mount.name, source, project)
            if not where.is_dir():
                raise MountDirectoryNotFoundError(mount.name, where)
            env[mount_env_name(mount.name)] = str(where)
        return env

    def submit(self, spec: "JobSpec", *, project: "Path | str | os.PathLike[str]") -> RunHandle:
        """Stage the spec and start the detached supervisor of one worker per node.

        Raises:
            TypeError: ``project`` is not a path (a str or an ``os.PathLike``).
            ComputeConfigError: The ``python`` setting names no program on this machine.
        """
        project = _as_path(project).resolve()
        missing = [name for name in spec.secrets if name not in os.environ]
        if missing:
            raise SecretNotSetError(missing)
        if not spec.extras:  # with extras, uv's python runs the worker
            check_python(self.settings.python, project)
        mount_env = self._mount_env(spec, project)
        run = new_run(spec, project)
        run_dir = stage_run(self.state_dir / "runs", run)
        prefix, extra_env = self.worker_command(spec, project)
        port = free_port() if spec.nodes > 1 else 0
        commands: list[tuple[list[str], dict[str, str], Path]] = []
        for node in range(spec.nodes):
            env = {**extra_env, **mount_env, NODE_RANK_ENV: str(node)}
            if spec.nodes > 1:
                env |= {
                    "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                    "JAX_NUM_PROCESSES": str(spec.nodes),
                    "JAX_PROCESS_ID": str(node),
                }
            argv = [
                *prefix, "-m", "substrax.compute.worker", "--spec", str(run_dir / "spec.json"),
                "--project", str(project), "--outputs", str(run_dir / "outputs"),
                "--node-rank", str(node),
            ]  # fmt: skip
            log = run_dir / ("worker.log" if node == 0 else f"worker-{node}.log")
            commands.append((argv, env, log))
        plan = write_plan(
            run_dir,
            job=spec.name,
            timeout_seconds=spec.timeout_seconds,
            stop_grace_seconds=spec.stop_grace_seconds,
            nodes=commands,
            setup_seconds=EXTRAS_SETUP_SECONDS if spec.extras else 0.0,
        )
        supervisor = [sys.executable, "-m", "substrax.compute._supervisor", str(plan.parent)]
        pid = spawn_detached(supervisor, env=os.environ, log=commands[0][2])
        details = {
            "run_dir": str(run_dir),
            "pids": str(pid),
            "starts": start_time(pid),
            "pgid": str(pid),
            "nodes": str(spec.nodes),
        }
        return run.handle(self.name, details, self.raw_settings)

    @staticmethod
    def _processes(handle: RunHandle) -> list[tuple[int, str]]:
        pids = handle.details["pids"].split(",")
        starts = handle.details.get("starts", "").split(",")
        return [(int(pid), starts[i] if i < len(starts) else "") for i, pid in enumerate(pids)]

    @staticmethod
    def _groups(handle: RunHandle) -> list[tuple[int, str]]:
        """The run's process groups, each as (pgid, its leader's start).

        The session's (the supervisor and the workers), then each running task's own, as its
        node recorded it.
        """
        pgid = int(handle.details["pgid"])
        started = dict(LocalBackend._processes(handle)).get(pgid, "")
        groups = [(pgid, started)]
        outputs = Path(handle.details["run_dir"]) / "outputs"
        for node in range(int(handle.details.get("nodes", "1"))):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                task = json.loads((node_outputs(outputs, node) / TASK_PROCESS).read_text())
                groups.append((int(task["pid"]), str(task["start"])))
        return groups

    def status(self, handle: RunHandle) -> RunState:
        """Read the state from the process table, the marker and the manifests.

        The run is pending or running while any process of it lives: its supervisor, a worker
        (the supervisor's session) or a task (the task's own session, as its node recorded it).
        """
        run_dir = Path(handle.details["run_dir"])
        alive = any(group_alive(pgid, started) for pgid, started in self._groups(handle))
        outputs = run_dir / "outputs"
        nodes = int(handle.details.get("nodes", len(self._processes(handle))))
        manifests: list[JobManifest | None] = []
        for node in range(nodes):
            path = node_outputs(outputs, node) / MANIFEST_NAME
            manifests.append(read_manifest(path) if path.is_file() else None)
        if alive:
            return RunState.RUNNING if manifests[0] is not None else RunState.PENDING
        finished = [m for m in manifests if m is not None and m.finished]
        if len(finished) == nodes:  # the job ran to its end: a cancel after that ended nothing
            return RunState.SUCCEEDED if all(m.succeeded for m in finished) else RunState.FAILED
        if (run_dir / CANCELLED_MARKER).exists():
            return RunState.CANCELLED
        return RunState.FAILED

    @staticmethod
    def _run_dir(handle: RunHandle) -> Path:
        """The run's directory, refused when it is gone (removed by hand, a wiped state dir)."""
        run_dir = Path(handle.details["run_dir"])
        if not run_dir.is_dir():
            raise RunDirectoryGoneError(handle.run_id, run_dir)
        return run_dir

    def logs(self, handle: RunHandle, *, follow: bool) -> Iterator[str]:
        """Lines of node 0's worker log; with ``follow``, until the run is final.

        Raises:
            RunDirectoryGoneError: The run's directory is no longer there.
        """
        log = self._run_dir(handle) / "worker.log"
        return follow_lines(log, done=(lambda: self.status(handle).is_final) if follow else None)

    def fetch(self, handle: RunHandle, destination: Path) -> Path:
        """Copy the outputs and worker logs to ``destination/<run_id>``.

        Raises:
            RunDirectoryGoneError: The run's directory is no longer there, or a run that ended
                has no outputs directory (removed by hand).
        """
        run_dir = self._run_dir(handle)
        outputs = run_dir / "outputs"
        if not outputs.is_dir() and self.status(handle).is_final:  # not one still starting
            raise RunDirectoryGoneError(handle.run_id, outputs)
        target = destination / handle.run_id
        copy_outputs(outputs, target)
        for log in run_dir.glob("worker*.log"):
            copy_atomically(log, target / log.name)
        return target

    def cancel(self, handle: RunHandle) -> None:
        """End every process group the run recorded that still lives, whatever the run reads.

        The session's group first (the supervisor and the workers, which give their tasks
        SIGTERM and the job's ``stop_grace_seconds`` before SIGKILL, time to save a last
        checkpoint), then each task's own (a worker killed mid-task, ``kill -9`` or the OOM
        killer, leaves its task running there): SIGTERM, then SIGKILL after that grace plus
        ``_WORKERS_MARGIN_SECONDS`` (at least ``CANCEL_GRACE_SECONDS``). A group whose leader
        is dead is still ended while a member lives. A run that was not final reads as
        cancelled afterwards.
        """
        run_dir = Path(handle.details["run_dir"])
        if not self.status(handle).is_final:
            (run_dir / CANCELLED_MARKER).touch()
        grace = _cancel_grace(run_dir)
        for pgid, started in self._groups(handle):
            end_group(pgid, started, grace)


def _cancel_grace(run_dir: Path) -> float:
    """How long ``cancel`` lets a group of the run end before SIGKILL (the plan's grace, else 10 s)."""
    try:
        plan = json.loads((run_dir / NODES_FILE).read_text())
        grace = float(plan["stop_grace_seconds"]) + _WORKERS_MARGIN_SECONDS
    except (OSError, ValueError, KeyError, TypeError):  # a run made before its plan was written
        return CANCEL_GRACE_SECONDS
    return max(CANCEL_GRACE_SECONDS, grace)


def _as_path(project: object) -> Path:
    """``project`` as a Path: a str or an ``os.PathLike``, else a TypeError naming it."""
    if isinstance(project, str | os.PathLike):
        return Path(cast("str | os.PathLike[str]", project))
    raise TypeError(
        f"project={project!r:.80} must be the project's directory as a path (a str or an "
        f"os.PathLike), not {type(project).__name__}"
    )
