r"""The worker every backend runs (``python -m substrax.compute.worker --spec S --project P --outputs O``).

It probes the devices in a child, then runs each task in order from the project root with the
job's JAX settings and ``AVITAI_OUTPUT_DIR=<outputs>/<task>``, writes the task's logs there
(UTF-8 whatever the locale), enforces timeouts, keeps going after a failed task (in a job of
several nodes it starts no further task and ends failed: the nodes run each task together) and
rewrites ``manifest.json`` atomically after every task. It never imports jax itself. SIGTERM
(``cancel``), a task's timeout, and ``STOP_SIGNAL`` (SIGUSR1, how the local supervisor stops the
surviving nodes of a multi-node job) send the running task's process group SIGTERM, and SIGKILL
only after the job's ``stop_grace_seconds`` (30 s by default), so the task can save a last
checkpoint, run its peer-failure hook and flush its logs. Started by the local supervisor,
the worker stops the same way once that supervisor is gone.

Example:
    >>> import sys, tempfile
    >>> from substrax.compute import JobSpec, Task, run_job
    >>> from pathlib import Path
    >>> spec = JobSpec(name="j", probe_devices=False, timeout_seconds=60,
    ...                tasks=(Task(name="t", argv=("python", "-c", "print(42)"), timeout_seconds=60),))
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     out = Path(directory) / "outputs"
    ...     run_job(spec, project=Path(directory), outputs=out, echo=False).succeeded
    ...     (out / "t" / "stdout.log").read_text().strip()
    True
    '42'
"""

import argparse
import contextlib
import dataclasses
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from substrax.support import EXIT_FAILED, EXIT_OK, UsageError, run_command

from ._environment import EVENT_PREFIX, NODE_RANK_ENV, node_outputs
from ._manifest import MANIFEST_NAME, JobManifest, TaskOutcome, TaskStatus, write_manifest
from ._processes import adopt_orphans, is_alive, start_time
from ._pump import MIN_SECRET_LENGTH
from ._runner import STOP_SIGNAL, SUPERVISOR_ENV, TaskRunner, links_note, mark_failure
from ._spec import JobSpec, read_job_spec
from ._toml import reason, toml_path


PROG = "python -m substrax.compute.worker"


_WATCH_SECONDS = 0.5


def _event(echo: bool, text: str) -> None:
    if echo:
        with contextlib.suppress(OSError, ValueError):  # a full disk under the log stops no run
            sys.stdout.write(f"{EVENT_PREFIX}{text}\n")
            sys.stdout.flush()


def watch_supervisor(
    supervisor: int,
    runner: TaskRunner,
    *,
    alive: Callable[[int, str], bool] = is_alive,
    started: Callable[[int], str] = start_time,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Stop ``runner`` once the process ``supervisor`` has exited (a zombie counts as exited).

    The supervisor itself is watched, never this worker's parent: with extras the worker runs
    under ``uv run``, which stays its parent. The supervisor is told from a later process that
    reuses its pid by its start time, read when the watch begins. The task gets SIGTERM, then
    SIGKILL after the grace, and no further task starts.
    """
    since = started(supervisor)
    while since and alive(supervisor, since):
        sleep(_WATCH_SECONDS)
    _event(True, f"the supervisor (pid {supervisor}) is gone; stopping this node")
    runner.stop()


def run_job(
    spec: JobSpec,
    *,
    project: str | os.PathLike[str],
    outputs: str | os.PathLike[str],
    echo: bool = True,
    python: str = sys.executable,
    node: int = 0,
    runner_hook: Callable[["TaskRunner"], None] | None = None,
) -> JobManifest:
    """Run every task of ``spec`` and return the final manifest (also written to disk).

    Args:
        spec: The job.
        project: The project root every task runs from.
        outputs: The run's output root (node 0 writes here, node N under ``nodes/N``).
        echo: Echo task output with a ``[task]`` prefix, and progress events, to stdout.
        python: The interpreter a leading ``python`` in a task's argv means.
        node: This node's rank in a multi-node job.
        runner_hook: Called with the runner before the first task (the CLI installs its
            signal handlers through it).

    Returns:
        The manifest, ``finished`` unless the run was cancelled or stopped before the job's
        deadline (a stop after it only ends the job's timeout).
    """
    root = node_outputs(Path(outputs), node).resolve()
    root.mkdir(parents=True, exist_ok=True)
    runner = TaskRunner(spec, project=Path(project).resolve(), root=root, echo=echo, python=python)
    if runner_hook is not None:
        runner_hook(runner)
    manifest_path = root / MANIFEST_NAME
    manifest = JobManifest(job=spec.name, node=node, nodes=spec.nodes)
    write_manifest(manifest_path, manifest)
    deadline = time.monotonic() + spec.timeout_seconds
    for name in runner.redact.too_short:
        _event(
            echo,
            f"secret {name} is not masked in the logs: its value is shorter than "
            f"{MIN_SECRET_LENGTH} characters, and masking it would mask them in every line",
        )
    if dropped := runner.dropped():
        _event(
            echo,
            f"the tasks do not get this environment's {', '.join(dropped)}: substrax sets JAX_* "
            "and XLA_* variables from the job's runtime table and env only; set them there",
        )
    if spec.probe_devices:
        _event(echo, "probing devices")
        manifest = dataclasses.replace(manifest, devices=runner.probe(deadline - time.monotonic()))
    outcomes: list[TaskOutcome] = []
    for index, task in enumerate(spec.tasks, start=1):
        budget = min(task.timeout_seconds, deadline - time.monotonic())
        _event(echo, _start_event(task.name, f"({index}/{len(spec.tasks)})", budget, runner))
        outcome = runner.run_task(task, budget)
        if outcome.status is TaskStatus.FAILED or (outcome.returncode or 0) > 0:
            mark_failure(outcome.returncode)  # a stopped task that exits 1 was failing already
        outcomes.append(outcome)
        for note in [*runner.notes, links_note(task.name, root / task.name)]:
            if note:
                _event(echo, note)
        runner.notes.clear()
        if outcome.lost_log_bytes:
            _event(
                echo,
                f"task {task.name} lost {outcome.lost_log_bytes} bytes of its output: "
                f"{outcome.lost_log_reason}",
            )
        _event(
            echo,
            f"task {task.name} {outcome.status} ({index}/{len(spec.tasks)}) {outcome.seconds:.1f}s",
        )
        manifest = dataclasses.replace(manifest, tasks=tuple(outcomes))
        write_manifest(manifest_path, manifest)
        if runner.cancelled and time.monotonic() < deadline:  # past it: the job timed out
            manifest = dataclasses.replace(manifest, tasks=(*outcomes, *_skipped(spec, index)))
            write_manifest(manifest_path, manifest)  # every task: the later ones cancelled
            return manifest
        if spec.nodes > 1 and outcome.status is not TaskStatus.SUCCEEDED:
            if rest := spec.tasks[index:]:
                _event(
                    echo,
                    f"task {task.name} did not succeed on node {node}: the nodes of a "
                    f"{spec.nodes}-node job run each task together, so this node starts no "
                    f"further task ({', '.join(t.name for t in rest)} cancelled)",
                )
            outcomes += _skipped(spec, index)
            manifest = dataclasses.replace(manifest, tasks=tuple(outcomes))
            break
    manifest = dataclasses.replace(manifest, finished=True)
    write_manifest(manifest_path, manifest)
    _event(echo, f"job {spec.name} {'succeeded' if manifest.succeeded else 'failed'}")
    return manifest


def _start_event(name: str, place: str, budget: float, runner: TaskRunner) -> str:
    """The event before a task: it started, or why ``run_task`` starts no process of it."""
    if budget > 0 and not runner.cancelled:
        return f"task {name} started {place}"
    why = "the run was cancelled" if budget > 0 else "the job's timeout_seconds ran out"
    return f"task {name} not started: {why} {place}"


def _skipped(spec: JobSpec, done: int) -> list[TaskOutcome]:
    """The tasks after the ``done`` first, as cancelled: a cancelled run starts none of them.

    Nor does a node of a multi-node job after a task that did not succeed: every node runs
    each task as one jax program, and a node that went on to its next task while a peer still
    ran this one (or waited for it at the coordinator) would join two different programs into
    one run. Its worker ends failed instead, and its peers are stopped.
    """
    return [
        TaskOutcome(
            name=t.name, argv=t.argv, status=TaskStatus.CANCELLED, returncode=None, seconds=0.0
        )
        for t in spec.tasks[done:]
    ]


def _default_node() -> int:
    for name in (NODE_RANK_ENV, "JAX_PROCESS_ID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Run a job's tasks on this node.")
    parser.add_argument("--spec", type=Path, required=True, help="the job spec (spec.json)")
    parser.add_argument("--project", required=True, help="the project root (a directory)")
    parser.add_argument(
        "--outputs", required=True, help="the run's output root (a directory, created if missing)"
    )
    parser.add_argument("--node-rank", type=int, default=None, help="this node's rank")
    return parser


def _read_spec(path: Path) -> JobSpec:
    """The spec in ``path``; an unreadable or invalid one is a usage error (exit 2)."""
    try:
        return read_job_spec(json.loads(path.read_text()))
    except ValidationError as error:
        problems = "; ".join(
            f"{toml_path(e['loc'], 'spec')}: {reason(e, JobSpec)}" for e in error.errors()
        )
        raise UsageError(f"--spec {path}: {problems}") from error
    except (OSError, ValueError) as error:
        reason_text = str(error).replace("\n", "; ")
        raise UsageError(f"--spec {path}: {reason_text}") from error


def _check_paths(project: str, outputs: str) -> tuple[Path, Path]:
    """``--project`` and ``--outputs`` as paths; bad ones are usage errors (exit 2)."""
    if not project or not Path(project).is_dir():
        raise UsageError(f"--project {project!r} is not a directory; pass the project root")
    if not outputs:
        raise UsageError("--outputs is empty; pass the run's output directory")
    for candidate in (Path(outputs), *Path(outputs).parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise UsageError(
                    f"--outputs {outputs!r} cannot be a directory: {candidate} is a file; "
                    "pass a directory"
                )
            break
    return Path(project), Path(outputs)


def _run(args: argparse.Namespace) -> int:
    spec = _read_spec(args.spec)
    project, outputs = _check_paths(args.project, args.outputs)
    node = _default_node() if args.node_rank is None else args.node_rank
    if not 0 <= node < spec.nodes:
        raise UsageError(
            f"--node-rank {node} is outside this {spec.nodes}-node job; pass 0 to {spec.nodes - 1}"
        )

    def install(runner: TaskRunner) -> None:
        runner.adopts = adopt_orphans()  # its own process: what a task leaves is its child

        def on_term(signum: int, frame: object) -> None:  # noqa: ARG001
            runner.cancel()

        def on_stop(signum: int, frame: object) -> None:  # noqa: ARG001
            runner.stop()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(STOP_SIGNAL, on_stop)
        supervisor = os.environ.get(SUPERVISOR_ENV, "")  # the tasks do not get it
        if supervisor.isdigit():
            watch = threading.Thread(
                target=watch_supervisor, args=(int(supervisor), runner), daemon=True
            )
            watch.start()

    manifest = run_job(spec, project=project, outputs=outputs, node=node, runner_hook=install)
    if not manifest.finished:
        return 128 + signal.SIGTERM
    return EXIT_OK if manifest.succeeded else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    """Run the worker from the command line.

    Returns:
        0 when every task succeeded, 1 when one did not, 2 for bad arguments (a ``--project``
        that is not a directory, an empty ``--outputs`` or one where a file stands, a
        ``--node-rank`` outside ``[0, nodes)``) or an unreadable or invalid spec
        (``python -m substrax.compute.worker: error: ...``), 1 with such a line when the run's
        files cannot be written (a full disk), and 128 + SIGTERM when the run was cancelled.
    """
    args = _parser().parse_args(argv)
    if sys.stdout is sys.__stdout__ and isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(encoding="utf-8", errors="replace")  # the worker log, any locale
    # a disk that fills up under the run's files: one line in the worker's log, exit 1
    return run_command(PROG, lambda: _run(args), failures=(OSError,))
