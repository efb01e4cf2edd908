"""``python -m substrax.compute._supervisor RUN_DIR``: a local job's workers, together.

The local backend starts this detached, as the leader of the run's session, for every run (one
node or more). It starts one worker per node from ``RUN_DIR/nodes.json`` (each with this process's
environment plus the node's own variables), waits for them, and once a worker exits with a non-zero
status it stops the others (their tasks get SIGTERM, then SIGKILL after the job's
``stop_grace_seconds``) and records in the job's manifest (node 0's) which node failed first and
how, before it exits itself: the run is not final before that. A worker whose task stopped
because a peer died (the peer watch's status 75) waits for its peers a grace before they are
stopped: a peer whose task raised lingers while jax shuts down, and is the one to name. A one-node job's worker counts as
failed so only when it ended before finishing the job (killed, or it could not write the
manifest): a job whose tasks failed is no node's failure. A worker that dies mid-task leaves its
task running in the task's own session: its group is ended here (SIGTERM, then SIGKILL after the
grace) and the task is added to its node's manifest. A cancelled run (SIGTERM to the session, or
to this process alone: it passes it on to the workers) reads as cancelled and records no failed
node. The job's ``timeout_seconds`` bounds the whole run, node starts included:
once it has passed (plus ``_WORKER_MARGIN_SECONDS`` for the workers to stop their own tasks) no
further node is started and the running ones are stopped as above. A plan's ``setup_seconds``
(the local backend's allowance for ``uv`` to install a job's extras) is added to that deadline
until every node's worker has begun its job (written its manifest), and the deadline is then
the last one's start plus the timeout and the margin: a slow install never stops a worker
before its own deadline, which turns its task's timeout into a cancellation. Each worker is
told this process's pid (``SUPERVISOR_ENV``), and stops on its own once this process is gone.
"""

import contextlib
import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from substrax.support import write_atomically

from ._blame import NodeExit, blame, failed_at, stopped_for_a_peer
from ._environment import EVENT_PREFIX, FAILED_AT_ENV, node_outputs
from ._manifest import (
    MANIFEST_NAME,
    JobManifest,
    TaskOutcome,
    TaskStatus,
    read_manifest,
    write_manifest,
)
from ._processes import end_group
from ._runner import STOP_SIGNAL, SUPERVISOR_ENV, TASK_PROCESS


NODES_FILE = "nodes.json"
CANCELLED_MARKER = "cancelled"
_WORKER_MARGIN_SECONDS = 5.0
_POLL_SECONDS = 0.1
NOT_STARTED = 127
"""The status recorded for a node whose worker could not be started (as a shell's)."""


def write_plan(
    run_dir: Path,
    *,
    job: str,
    timeout_seconds: float,
    stop_grace_seconds: float,
    nodes: Sequence[tuple[Sequence[str], dict[str, str], Path]],
    setup_seconds: float = 0.0,
) -> Path:
    """Write the workers to start (each node's argv, its own variables and its log file) atomically.

    The variables hold no secrets: secrets reach the workers through the environment the
    supervisor inherits. ``setup_seconds`` is how long a worker may take to begin its job
    beyond the job's timeout (an environment to install first).
    """
    plan = {
        "job": job,
        "timeout_seconds": timeout_seconds,
        "stop_grace_seconds": stop_grace_seconds,
        "setup_seconds": setup_seconds,
        "nodes": [{"argv": list(argv), "env": env, "log": str(log)} for argv, env, log in nodes],
    }
    path = run_dir / NODES_FILE
    write_atomically(path, json.dumps(plan, indent=2))
    return path


def describe_status(code: int) -> str:
    """A worker's exit status in words.

    Example:
        >>> from substrax.compute._supervisor import describe_status
        >>> describe_status(-9), describe_status(3)
        ('killed by SIGKILL', 'exit status 3')
    """
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _say(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a full disk under the log stops nothing
        sys.stdout.write(f"{EVENT_PREFIX}{text}\n")
        sys.stdout.flush()


def _start(
    run_dir: Path, entry: dict[str, Any], ended: queue.Queue[tuple[int, int]], node: int
) -> int | None:
    """Start one node's worker and a thread that reports its exit, in the order exits happen.

    A worker that cannot be started is reported at once as ended with ``NOT_STARTED``.
    """
    env = {
        **os.environ,
        **entry["env"],
        FAILED_AT_ENV: str(failed_at(run_dir, node)),
        SUPERVISOR_ENV: str(os.getpid()),
    }
    try:
        with Path(entry["log"]).open("ab") as log:
            process = subprocess.Popen(
                entry["argv"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
    except OSError as error:
        _say(f"node {node}'s worker could not start: {error}")
        ended.put((node, NOT_STARTED))
        return None
    threading.Thread(target=lambda: ended.put((node, process.wait())), daemon=True).start()
    return process.pid


def _finished(root: Path) -> bool:
    """Whether the node whose outputs are ``root`` wrote a finished manifest."""
    try:
        return read_manifest(root / MANIFEST_NAME).finished
    except (OSError, ValueError, TypeError):
        return False


def _end_orphan(
    root: Path, plan: dict[str, Any], node: int, *, status: TaskStatus
) -> threading.Thread | None:
    """End the task a dead worker left running (in its own session); add it to its manifest.

    Its group gets SIGTERM, then SIGKILL after the job's grace, in the thread returned.
    """
    path = root / TASK_PROCESS
    try:
        record = json.loads(path.read_text())
        pid, started = int(record["pid"]), str(record["start"])
    except (OSError, ValueError, KeyError, TypeError):  # none: its worker was between tasks
        return None
    _say(f"node {node}'s worker left its task running (pid {pid}); ending it")

    def end() -> None:
        end_group(pid, started, float(plan["stop_grace_seconds"]))
        path.unlink(missing_ok=True)

    thread = threading.Thread(target=end)
    thread.start()
    manifest_path = root / MANIFEST_NAME
    try:
        manifest = read_manifest(manifest_path)
    except (OSError, ValueError, TypeError):  # none yet, or cut short
        manifest = JobManifest(job=plan["job"], node=node, nodes=len(plan["nodes"]))
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        outcome = TaskOutcome(
            name=str(record["task"]),
            argv=tuple(str(arg) for arg in record["argv"]),
            status=status,
            returncode=None,
            seconds=max(0.0, time.time() - float(record["time"])),
        )
        write_manifest(
            manifest_path, dataclasses.replace(manifest, tasks=(*manifest.tasks, outcome))
        )
    return thread


def _ended(
    run_dir: Path, plan: dict[str, Any], exit: tuple[int, int], stopped: bool, cancelled: bool
) -> tuple[bool, threading.Thread | None]:
    """After a worker's exit: whether it fails the job, and the thread ending the task it left.

    A node of a multi-node job fails it with any non-zero status; a one-node job's worker only
    when it ended before finishing the job (a job whose tasks failed is no node's failure). A
    node stopped, or a cancelled run, fails nothing.
    """
    node, code = exit
    root = node_outputs(run_dir / "outputs", node)
    status = TaskStatus.CANCELLED if stopped or cancelled else TaskStatus.FAILED
    ending = _end_orphan(root, plan, node, status=status)
    if code == 0 or stopped or cancelled:
        return False, ending
    died = not _finished(root)
    if died:
        _say(f"node {node}'s worker ended before the job finished ({describe_status(code)})")
    return died or len(plan["nodes"]) > 1, ending


class _Deadline:
    """When the supervisor stops the nodes: the job's timeout and a margin after their start.

    Until every node's worker has begun its job (written its manifest), the plan's
    ``setup_seconds`` is allowed on top, from the supervisor's own start.
    """

    def __init__(self, run_dir: Path, plan: dict[str, Any]) -> None:
        self.outputs = run_dir / "outputs"
        self.nodes = len(plan["nodes"])
        self.timeout = float(plan["timeout_seconds"])
        self.setup = float(plan.get("setup_seconds", 0.0))
        self.at = time.monotonic() + self.setup + self.timeout + _WORKER_MARGIN_SECONDS
        self.begun: dict[int, float] = {}

    def passed(self) -> bool:
        """Whether the deadline has passed, once the nodes seen beginning their jobs count."""
        if self.setup and len(self.begun) < self.nodes:
            now = time.monotonic()
            for node in range(self.nodes):
                manifest = node_outputs(self.outputs, node) / MANIFEST_NAME
                if node not in self.begun and manifest.exists():
                    self.begun[node] = now
            if len(self.begun) == self.nodes:
                last = max(self.begun.values())
                self.at = min(self.at, last + self.timeout + _WORKER_MARGIN_SECONDS)
        return time.monotonic() > self.at

    def reason(self) -> str:
        """Why the nodes are stopped, in words."""
        if self.setup and len(self.begun) < self.nodes:
            waiting = sorted(set(range(self.nodes)) - set(self.begun))
            nodes = "node" + ("s" if len(waiting) > 1 else "")
            return (
                f"{nodes} {', '.join(map(str, waiting))} had not begun the job "
                f"{self.setup + self.timeout:g} s after the run started (its environment's "
                f"setup allowance of {self.setup:g} s plus the job's timeout); stopping the nodes"
            )
        return f"job timed out after {self.timeout:g} s; stopping the nodes"


def supervise(run_dir: Path) -> int:
    """Run the planned workers until all ended; 0 when none failed, else 1.

    When a worker exits with a non-zero status, the others are sent ``STOP_SIGNAL`` (their
    tasks get SIGTERM, then SIGKILL after the job's ``stop_grace_seconds``) and are killed
    themselves when still running ``_WORKER_MARGIN_SECONDS`` after that; when its task stopped
    because a peer died (and no node's own failure is on record), only once the others had
    ``stop_grace_seconds`` to end on their own. The failed node is the one whose task failed
    first, by the time each worker wrote when it saw its task fail (a peer's failure makes the
    others' tasks fail too, and their workers may exit in any order), a task that stopped
    because a peer died coming after any other; without such a record, the first worker to
    exit non-zero. A node stopped so is never the one blamed.
    """
    plan = cast("dict[str, Any]", json.loads((run_dir / NODES_FILE).read_text()))
    deadline = _Deadline(run_dir, plan)
    grace = float(plan["stop_grace_seconds"]) + _WORKER_MARGIN_SECONDS
    cancelled = False
    timed_out = False

    ended: queue.Queue[tuple[int, int]] = queue.Queue()
    running: dict[int, int | None] = {}

    def on_term(signum: int, frame: object) -> None:  # noqa: ARG001
        nonlocal cancelled
        cancelled = True  # a cancel: the run reads so, and its workers stop their tasks
        with contextlib.suppress(OSError):
            (run_dir / CANCELLED_MARKER).touch()
        _signal_all(running, signal.SIGTERM)  # sent to this process alone (`kill PID`) too

    signal.signal(signal.SIGTERM, on_term)
    exits: dict[int, NodeExit] = {}
    endings: list[threading.Thread] = []
    for node, entry in enumerate(plan["nodes"]):
        if cancelled or deadline.passed():
            break
        running[node] = _start(run_dir, entry, ended, node)
    failed: tuple[int, int] | None = None
    stop = _Stopping(running, grace)
    while running:
        if not stop.begun and failed is None and deadline.passed():
            timed_out = True
            _say(deadline.reason())
            stop.now()
        try:
            node, code = ended.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            pass
        else:
            del running[node]
            exits[node] = NodeExit(code, time.time(), stopped=stop.begun)
            cancelled = cancelled or (run_dir / CANCELLED_MARKER).exists()
            failing, ending = _ended(run_dir, plan, (node, code), stop.begun, cancelled)
            endings += [ending] if ending is not None else []
            if failing:
                failed = failed or (node, code)
                _stop_after(run_dir, plan, (node, code), stop)
        stop.tick()
    for ending in endings:
        ending.join()
    if failed is None:
        return 1 if timed_out else 0
    first, failed = failed[0], blame(run_dir, exits, first_exit=failed)
    if failed[0] != first:
        _say(
            f"node {failed[0]} failed ({describe_status(failed[1])}) first: node {first}'s "
            "task failed after it or stopped because a peer died"
        )
    _record_failure(run_dir, job=plan["job"], nodes=len(plan["nodes"]), failed=failed)
    return 1


class _Stopping:
    """When the running workers are sent ``STOP_SIGNAL``, and when SIGKILL (``grace`` after)."""

    def __init__(self, running: dict[int, int | None], grace: float) -> None:
        self.running, self.grace = running, grace
        self.kill_at: float | None = None
        self.stop_at: float | None = None  # after a peer failure only: when they are stopped
        self.begun = False

    def now(self) -> None:
        """Stop the running workers now (their tasks get SIGTERM and the job's grace)."""
        _signal_all(self.running, STOP_SIGNAL)
        self.kill_at, self.stop_at, self.begun = time.monotonic() + self.grace, None, True

    def tick(self) -> None:
        """Stop the workers, or kill them, once it is time to."""
        if self.stop_at is not None and time.monotonic() > self.stop_at:
            _say("stopping the other nodes")
            self.now()
        if self.kill_at is not None and time.monotonic() > self.kill_at:
            _signal_all(self.running, signal.SIGKILL)
            self.kill_at = None


def _stop_after(
    run_dir: Path, plan: dict[str, Any], exit: tuple[int, int], stop: _Stopping
) -> None:
    """Stop the other nodes once ``exit`` failed the job: at once, or a grace after a peer failure.

    A task that stopped because a peer died may have a peer still ending on its own (a process
    that raised lingers while jax shuts down): the others get ``stop_grace_seconds`` first.
    """
    node, code = exit
    what = f"node {node} failed ({describe_status(code)})"
    if stop.running and stopped_for_a_peer(run_dir, node, len(plan["nodes"])):
        grace = float(plan["stop_grace_seconds"])
        _say(
            f"{what}: its task stopped because a peer died; the other nodes get up to "
            f"{grace:g} s to end before they are stopped"
        )
        stop.stop_at = stop.stop_at or time.monotonic() + grace
        return
    if len(plan["nodes"]) > 1:
        _say(what + ("; stopping the other nodes" if stop.running else ""))
    stop.now()


def _signal_all(running: dict[int, int | None], sig: signal.Signals) -> None:
    """Send ``sig`` to each running worker (None: one that could not start)."""
    for pid in running.values():
        if pid is not None and pid > 0:  # never 0 or -1: this group, every process
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _record_failure(run_dir: Path, *, job: str, nodes: int, failed: tuple[int, int]) -> None:
    path = node_outputs(run_dir / "outputs", 0) / MANIFEST_NAME
    try:
        manifest = read_manifest(path)
    except (OSError, ValueError, TypeError):  # node 0 died before writing it, or mid-way
        manifest = JobManifest(job=job, node=0, nodes=nodes)
    node, code = failed
    try:
        write_manifest(
            path, dataclasses.replace(manifest, failed_node=node, failed_node_status=code)
        )
    except OSError as error:  # a full disk: the run still reads as failed, from its manifest
        _say(f"could not record node {node}'s failure in {path}: {error}")


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
