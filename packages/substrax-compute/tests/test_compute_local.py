"""The local backend passes the backend contract for real, plus its own behaviour."""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from substrax.compute import (
    ComputeConfigError,
    JobSpec,
    LocalBackend,
    RunState,
    Task,
    read_manifest,
)
from substrax.compute._environment import FAILED_AT_ENV
from substrax.compute._manifest import MANIFEST_NAME
from substrax.testing.compute import BackendContract, wait_until_final


@pytest.mark.usefixtures("child_processes")
class TestLocalContract(BackendContract):
    def make_backend(self, state_dir: Path) -> LocalBackend:
        return LocalBackend({"state_dir": str(state_dir)})


def _spec(*tasks, **fields):
    fields.setdefault("probe_devices", False)
    fields.setdefault("timeout_seconds", 120.0)
    return JobSpec(name="local", tasks=tasks, **fields)


def _task(name, code, timeout=120.0):
    return Task(name=name, argv=("python", "-c", code), timeout_seconds=timeout)


def _submit_sleeper(backend, project, code):
    """Submit one task running ``code`` (``spawns_a_child``); its handle and child's pid once asleep."""
    handle = backend.submit(_spec(_task("sleeper", code)), project=project)
    child = None
    for line in backend.logs(handle, follow=True):
        if line.startswith("[sleeper] child "):
            child = int(line.split()[-1])
        if "sleeping now" in line:
            break
    return handle, child


def test_worker_command_without_extras_is_the_project_interpreter(tmp_path):
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    argv, env = backend.worker_command(_spec(_task("t", "")), tmp_path)
    assert (argv, env) == ([sys.executable], {})
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    argv, _ = backend.worker_command(_spec(_task("t", "")), tmp_path)
    assert argv == [str(tmp_path / ".venv" / "bin" / "python")]


def test_a_relative_python_setting_is_taken_from_the_project_not_the_working_directory(
    tmp_path, monkeypatch
):
    """Hostile finding: `python = "venv/bin/python"` ran the interpreter of the directory `run`
    was typed in (another project's), as a relative state_dir is not."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    for root in (project, elsewhere):
        (root / "venv" / "bin").mkdir(parents=True)
        (root / "venv" / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.chdir(elsewhere)
    backend = LocalBackend({"state_dir": str(tmp_path / "s"), "python": "venv/bin/python"})
    argv, _ = backend.worker_command(_spec(_task("t", "")), project)
    assert argv == [str(project / "venv" / "bin" / "python")]
    (project / "venv" / "bin" / "python").unlink()  # only the working directory's is left
    with pytest.raises(ComputeConfigError) as caught:
        backend.submit(_spec(_task("t", "print(1)")), project=project)
    assert (
        f"'venv/bin/python' ({project / 'venv' / 'bin' / 'python'}: relative to the project's "
        "directory) is no executable on this machine"
    ) in str(caught.value)


def test_declared_extras_are_installed_by_uv_into_a_run_environment(tmp_path):
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    argv, env = backend.worker_command(_spec(_task("t", ""), extras=("cuda12", "plots")), tmp_path)
    assert Path(argv[0]).name == "uv"
    assert argv[1:] == [
        "run",
        "--project",
        str(tmp_path),
        "--frozen",
        "--extra",
        "cuda12",
        "--extra",
        "plots",
        "python",
    ]
    environment = Path(env["UV_PROJECT_ENVIRONMENT"])
    assert environment.parent == tmp_path / "s" / "envs"
    _other, _ = backend.worker_command(_spec(_task("t", ""), extras=("plots",)), tmp_path)
    assert backend.worker_command(_spec(_task("t", ""), extras=("plots",)), tmp_path)[1] != env


def test_cancel_kills_the_whole_process_group(tmp_path, spawns_a_child, gone):
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle, child = _submit_sleeper(backend, tmp_path, spawns_a_child)
    backend.cancel(handle)
    assert backend.status(handle) is RunState.CANCELLED
    assert child is not None
    assert gone(child), "a task's child outlived cancel"
    manifest = read_manifest(Path(handle.details["run_dir"]) / "outputs" / MANIFEST_NAME)
    assert [t.status for t in manifest.tasks] == ["cancelled"]
    assert not manifest.finished


SAVES_ON_SIGTERM = """\
import os, pathlib, signal, sys, time
def on_term(signum, frame):
    pathlib.Path(os.environ["AVITAI_OUTPUT_DIR"], "saved.txt").write_text("saved")
    sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
print("sleeping now", flush=True)
time.sleep(300)
"""


def _cancelled_once_sleeping(backend, spec, project):
    """Submit ``spec``, cancel it once its task prints "sleeping now"; its handle, cancelled."""
    handle = backend.submit(spec, project=project)
    for line in backend.logs(handle, follow=True):
        if "sleeping now" in line:
            break
    backend.cancel(handle)
    assert backend.status(handle) is RunState.CANCELLED
    return handle


@pytest.mark.usefixtures("child_processes")
def test_cancel_gives_the_task_sigterm_and_the_grace_to_save(tmp_path):
    """Hostile finding: a cancel (Ctrl-C, SIGTERM or SIGHUP to `run`, `cancel`) SIGKILLed the
    task at once: its SIGTERM handler never ran and it saved no last checkpoint."""
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    spec = _spec(_task("saver", SAVES_ON_SIGTERM, timeout=300), stop_grace_seconds=30)
    handle = _cancelled_once_sleeping(backend, spec, tmp_path)
    outputs = Path(handle.details["run_dir"]) / "outputs"
    manifest = read_manifest(outputs / MANIFEST_NAME)
    assert [(t.status, t.returncode) for t in manifest.tasks] == [("cancelled", 7)]
    assert (outputs / "saver" / "saved.txt").read_text() == "saved"


@pytest.mark.usefixtures("child_processes")
def test_a_cancel_that_comes_as_the_job_ends_leaves_it_succeeded(tmp_path):
    """A third pass: Ctrl-C to `run` after the worker printed "job succeeded", before its
    processes ended, marked the run cancelled for good, though every task had succeeded."""
    from substrax.compute._supervisor import CANCELLED_MARKER

    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(_spec(_task("t", "print(1)")), project=tmp_path)
    assert wait_until_final(backend, handle, 60) is RunState.SUCCEEDED
    (Path(handle.details["run_dir"]) / CANCELLED_MARKER).touch()  # the cancel, a moment late
    assert backend.status(handle) is RunState.SUCCEEDED


def _interpreter(path, script):
    """An executable shell script at ``path`` (an interpreter to name in the python setting)."""
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.usefixtures("child_processes")
def test_a_worker_that_dies_is_a_failed_run(tmp_path):
    # an interpreter that imports substrax (the check at submit) but dies as the worker
    dies = _interpreter(tmp_path / "dies", f'[ "$1" = -m ] && exit 1\nexec {sys.executable} "$@"')
    backend = LocalBackend({"state_dir": str(tmp_path / "s2"), "python": dies})
    handle = backend.submit(_spec(_task("t", "print(1)")), project=tmp_path)
    assert wait_until_final(backend, handle, 30) is RunState.FAILED
    manifest = read_manifest(Path(handle.details["run_dir"]) / "outputs" / MANIFEST_NAME)
    assert (manifest.failed_node, manifest.failed_node_status) == (0, 1)


@pytest.mark.parametrize(
    ("python", "says"),
    [
        ("/nonexistent/python", "'/nonexistent/python' is no executable on this machine"),
        (
            "uv run --no-sync python",
            "'uv run --no-sync python' is a command line, but the setting names one interpreter",
        ),
    ],
)
def test_a_python_setting_that_names_no_program_is_refused_naming_it(tmp_path, python, says):
    """Hostile finding: 0.1.22's `python = "uv run --no-sync python"` gave a bare [Errno 2],
    naming no setting, and left an empty run directory behind."""
    backend = LocalBackend({"state_dir": str(tmp_path / "s"), "python": python})
    with pytest.raises(ValueError, match=r"backends\.local\.python") as caught:
        backend.submit(_spec(_task("t", "print(1)")), project=tmp_path)
    assert says in str(caught.value)
    assert f"{tmp_path / '.venv' / 'bin' / 'python'}" in str(caught.value)
    assert "leave python out" in str(caught.value)
    assert not (tmp_path / "s" / "runs").exists() or not any((tmp_path / "s" / "runs").iterdir())


@pytest.mark.usefixtures("child_processes")
def test_a_python_setting_without_substrax_or_empty_is_refused_before_a_run(tmp_path):
    """Hostile finding: `python = "python3"` (no substrax there) was taken, and the run failed
    with "No module named 'substrax'" in its worker.log only; `python = ""` meant the default."""
    bare = _interpreter(tmp_path / "bare", f'exec {sys.executable} -S "$@"')  # no site-packages
    backend = LocalBackend({"state_dir": str(tmp_path / "s"), "python": bare})
    with pytest.raises(ComputeConfigError) as caught:
        backend.submit(_spec(_task("t", "print(1)")), project=tmp_path)
    assert str(caught.value) == (
        f"tool.substrax.compute.backends.local.python: {bare!r} cannot run the worker: `{bare} "
        "-c 'import substrax.compute'` failed (ModuleNotFoundError: No module named 'substrax'); "
        "name the interpreter of an environment with substrax-compute installed, or leave "
        "python out to use the project's .venv python"
    )
    assert not (tmp_path / "s" / "runs").exists() or not any((tmp_path / "s" / "runs").iterdir())
    with pytest.raises(ComputeConfigError) as caught:
        LocalBackend({"state_dir": str(tmp_path / "s"), "python": ""})
    assert str(caught.value) == (
        "tool.substrax.compute.backends.local.python: is empty; name an interpreter, or leave "
        "python out for the project's .venv python"
    )


def test_submit_takes_a_project_given_as_text_and_refuses_what_is_no_path(tmp_path):
    backend = LocalBackend({"state_dir": str(tmp_path / "s"), "python": "/nonexistent/python"})
    with pytest.raises(
        ValueError, match=r"backends\.local\.python"
    ):  # past the project: it read it
        backend.submit(_spec(_task("t", "print(1)")), project=str(tmp_path))
    with pytest.raises(TypeError, match=r"project=3 must be the project's directory as a path"):
        backend.submit(_spec(_task("t", "print(1)")), project=3)


@pytest.mark.usefixtures("child_processes")
def test_secrets_reach_the_task_but_no_file_of_the_run(tmp_path, monkeypatch):
    secret = "s3cr3t-value-5a4b"  # noqa: S105 - a test value
    monkeypatch.setenv("SX_WANDB_API_KEY", secret)
    code = (
        "import hashlib, os, pathlib; v = os.environ['SX_WANDB_API_KEY']; print('key', v); "
        "pathlib.Path(os.environ['AVITAI_OUTPUT_DIR'], 'digest.txt').write_text(hashlib.sha256(v.encode()).hexdigest())"
    )
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(
        _spec(_task("t", code), secrets=("SX_WANDB_API_KEY",)), project=tmp_path
    )
    assert wait_until_final(backend, handle, 60) is RunState.SUCCEEDED
    fetched = backend.fetch(handle, tmp_path / "fetched")
    assert (fetched / "t" / "digest.txt").read_text() == hashlib.sha256(secret.encode()).hexdigest()
    assert "key ***" in (fetched / "t" / "stdout.log").read_text()
    for root in (tmp_path / "s", tmp_path / "fetched"):
        for path in root.rglob("*"):
            if path.is_file():
                assert secret not in path.read_text(errors="replace"), f"secret written to {path}"
    assert secret not in handle.to_json()


def test_missing_secret_refuses_the_submission(tmp_path, monkeypatch):
    monkeypatch.delenv("SX_NOT_SET", raising=False)
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    with pytest.raises(LookupError, match="SX_NOT_SET"):
        backend.submit(_spec(_task("t", "print(1)"), secrets=("SX_NOT_SET",)), project=tmp_path)


@pytest.mark.usefixtures("child_processes")
def test_mounts_need_a_local_directory(tmp_path):
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    spec = _spec(
        _task("t", "import os; print(os.environ['SUBSTRAX_MOUNT_DATASETS'])"),
        mounts=({"name": "datasets", "path": "/nonexistent-data"},),
    )
    with pytest.raises(FileNotFoundError, match=r"backends\.local\.mounts\.datasets"):
        backend.submit(spec, project=tmp_path)
    (tmp_path / "data").mkdir()
    backend = LocalBackend({"state_dir": str(tmp_path / "s"), "mounts": {"datasets": "data"}})
    handle = backend.submit(spec, project=tmp_path)
    assert wait_until_final(backend, handle, 60) is RunState.SUCCEEDED
    out = backend.fetch(handle, tmp_path / "f") / "t" / "stdout.log"
    assert out.read_text().strip() == str(tmp_path / "data")
    escaping = LocalBackend({"state_dir": str(tmp_path / "s"), "mounts": {"datasets": "../.."}})
    with pytest.raises(ValueError, match="escapes"):
        escaping.submit(spec, project=tmp_path)


@pytest.mark.usefixtures("child_processes")
def test_fetch_never_follows_links_out_of_the_outputs(tmp_path):
    (tmp_path / "private.txt").write_text("private")
    code = (
        "import os, pathlib; d = pathlib.Path(os.environ['AVITAI_OUTPUT_DIR']); "
        f"(d / 'link.txt').symlink_to({json.dumps(str(tmp_path / 'private.txt'))}); (d / 'real.txt').write_text('x')"
    )
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(_spec(_task("t", code)), project=tmp_path)
    assert wait_until_final(backend, handle, 60) is RunState.SUCCEEDED
    fetched = backend.fetch(handle, tmp_path / "f")
    assert (fetched / "t" / "real.txt").read_text() == "x"
    assert not (fetched / "t" / "link.txt").exists()


@pytest.mark.usefixtures("child_processes")
def test_a_fetch_again_copies_over_the_earlier_one_keeping_what_is_gone_at_the_source(tmp_path):
    # as rsync without --delete (the guide says so): files the run removed since stay in the
    # copy, and a file the user put there is never touched
    code = "import os, pathlib; (pathlib.Path(os.environ['AVITAI_OUTPUT_DIR']) / 'a.txt').write_text('1')"
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(_spec(_task("t", code)), project=tmp_path)
    assert wait_until_final(backend, handle, 60) is RunState.SUCCEEDED
    fetched = backend.fetch(handle, tmp_path / "f")
    (fetched / "t" / "notes.txt").write_text("mine")
    outputs = Path(handle.details["run_dir"]) / "outputs" / "t"
    (outputs / "a.txt").unlink()
    (outputs / "b.txt").write_text("2")
    again = backend.fetch(handle, tmp_path / "f")
    assert again == fetched
    assert {p.name for p in (again / "t").iterdir()} >= {"a.txt", "b.txt", "notes.txt"}
    assert (again / "t" / "b.txt").read_text() == "2"
    assert (again / "t" / "notes.txt").read_text() == "mine"


MULTI_NODE = """\
import json, os, pathlib
import jax
jax.distributed.initialize(
    coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
    num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
    process_id=int(os.environ["JAX_PROCESS_ID"]),
    initialization_timeout=60,
)
out = pathlib.Path(os.environ["AVITAI_OUTPUT_DIR"]) / "view.json"
out.write_text(json.dumps({"process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count()}))
jax.distributed.shutdown()
"""


@pytest.mark.usefixtures("child_processes")
def test_multi_node_job_runs_as_wired_local_processes(tmp_path):
    (tmp_path / "multi.py").write_text(MULTI_NODE)
    spec = _spec(
        Task(name="multi", argv=("python", "multi.py"), timeout_seconds=120),
        nodes=2,
        runtime={"platforms": ["cpu"], "cpu_devices": 2},
    )
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(spec, project=tmp_path)
    assert handle.details["nodes"] == "2"
    state = wait_until_final(backend, handle, 180)
    fetched = backend.fetch(handle, tmp_path / "f")
    assert state is RunState.SUCCEEDED, (fetched / "multi" / "stderr.log").read_text()[-3000:]
    views = [
        json.loads((fetched / "multi" / "view.json").read_text()),
        json.loads((fetched / "nodes" / "1" / "multi" / "view.json").read_text()),
    ]
    assert views == [
        {"process": 0, "processes": 2, "devices": 4},
        {"process": 1, "processes": 2, "devices": 4},
    ]
    assert read_manifest(fetched / "nodes" / "1" / MANIFEST_NAME).node == 1
    assert (fetched / "worker-1.log").is_file()


ONE_NODE_DIES = """\
import os, pathlib, signal, time
if os.environ["JAX_PROCESS_ID"] == "1":
    deadline = time.monotonic() + 60
    while not pathlib.Path("running").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(os.getppid(), signal.SIGKILL)  # node 1's worker dies, node 0's task running
else:
    pathlib.Path("running").write_text("")
    time.sleep(300)  # node 0 would run on alone
"""


@pytest.mark.usefixtures("child_processes")
def test_a_failed_node_stops_the_others_and_the_manifest_names_it(tmp_path):
    (tmp_path / "job.py").write_text(ONE_NODE_DIES)
    spec = _spec(Task(name="job", argv=("python", "job.py"), timeout_seconds=300), nodes=2)
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(spec, project=tmp_path)
    assert wait_until_final(backend, handle, 60) is RunState.FAILED
    run_dir = Path(handle.details["run_dir"])
    manifest = read_manifest(run_dir / "outputs" / MANIFEST_NAME)
    assert (manifest.failed_node, manifest.failed_node_status) == (1, -9)
    assert not manifest.succeeded
    assert [t.status for t in manifest.tasks] == ["cancelled"]  # node 0 was stopped
    log = (run_dir / "worker.log").read_text()
    assert "node 1 failed (killed by SIGKILL); stopping the other nodes" in log


NODE_0_CLEANS_UP = """\
import os, pathlib, signal, sys, time
if os.environ["JAX_PROCESS_ID"] == "0":
    def on_term(signum, frame):
        print("node 0 got SIGTERM", flush=True)
        (pathlib.Path(os.environ["AVITAI_OUTPUT_DIR"]) / "cleaned.txt").write_text("yes")
        sys.exit(75)
    signal.signal(signal.SIGTERM, on_term)
    pathlib.Path("ready").write_text("")
    time.sleep(300)
else:
    while not pathlib.Path("ready").exists():
        time.sleep(0.05)
    sys.exit(3)
"""


def _failed_two_node_job(tmp_path, program, **fields):
    """Run ``program`` as a two-node job that fails; its fetched outputs and manifest."""
    (tmp_path / "job.py").write_text(program)
    task = Task(name="job", argv=("python", "job.py"), timeout_seconds=300)
    return _failed_two_node_tasks(tmp_path, task, **fields)


def _failed_two_node_tasks(tmp_path, *tasks, **fields):
    """Run ``tasks`` as a two-node job that fails; its fetched outputs and manifest."""
    spec = _spec(*tasks, nodes=2, **fields)
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(spec, project=tmp_path)
    assert wait_until_final(backend, handle, 60) is RunState.FAILED
    fetched = backend.fetch(handle, tmp_path / "f")
    return fetched, read_manifest(fetched / MANIFEST_NAME)


@pytest.mark.usefixtures("child_processes")
def test_the_surviving_nodes_tasks_get_sigterm_and_time_to_clean_up(tmp_path):
    fetched, manifest = _failed_two_node_job(tmp_path, NODE_0_CLEANS_UP)
    assert (manifest.failed_node, manifest.failed_node_status) == (1, 1)
    assert [(t.status, t.returncode) for t in manifest.tasks] == [("cancelled", 75)]
    assert (fetched / "job" / "cleaned.txt").read_text() == "yes"
    assert "node 0 got SIGTERM" in (fetched / "job" / "stdout.log").read_text()


@pytest.mark.usefixtures("child_processes")
def test_a_surviving_task_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    stubborn = NODE_0_CLEANS_UP.replace("sys.exit(75)", 'print("still here", flush=True)')
    fetched, manifest = _failed_two_node_job(tmp_path, stubborn, stop_grace_seconds=0.5)
    assert manifest.failed_node == 1
    assert [(t.status, t.returncode) for t in manifest.tasks] == [("cancelled", -9)]
    assert "still here" in (fetched / "job" / "stdout.log").read_text()


@pytest.mark.usefixtures("child_processes")
def test_a_multi_node_run_is_final_only_with_the_failed_node_recorded(tmp_path):
    code = "import os, sys, time; r = int(os.environ['JAX_PROCESS_ID']); time.sleep(r / 2); sys.exit(4 * r)"
    spec = _spec(_task("t", code), nodes=2)
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(spec, project=tmp_path)
    manifest_path = Path(handle.details["run_dir"]) / "outputs" / MANIFEST_NAME
    deadline = time.monotonic() + 60
    while not backend.status(handle).is_final:  # polled without pause: no window is missed
        assert time.monotonic() < deadline, "the run did not end"
    manifest = read_manifest(manifest_path)
    assert (manifest.failed_node, manifest.failed_node_status) == (1, 1)
    assert backend.status(handle) is RunState.FAILED


@pytest.mark.usefixtures("child_processes")
def test_cancelling_a_multi_node_job_records_no_failed_node(tmp_path):
    code = "import time; print('sleeping now', flush=True); time.sleep(300)"
    spec = _spec(_task("sleeper", code, timeout=300), nodes=2)
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = _cancelled_once_sleeping(backend, spec, tmp_path)
    manifest = read_manifest(Path(handle.details["run_dir"]) / "outputs" / MANIFEST_NAME)
    assert manifest.failed_node is None
    assert [t.status for t in manifest.tasks] == ["cancelled"]


@pytest.mark.usefixtures("child_processes")
def test_the_job_timeout_bounds_a_multi_node_run_whose_workers_hang(tmp_path):
    import subprocess

    from substrax.compute._supervisor import write_plan

    hang = [sys.executable, "-c", "import time; time.sleep(600)"]
    write_plan(
        tmp_path,
        job="j",
        timeout_seconds=0.5,
        stop_grace_seconds=30,
        nodes=[(hang, {}, tmp_path / "worker.log"), (hang, {}, tmp_path / "worker-1.log")],
    )
    start = time.monotonic()
    child = subprocess.run(
        [sys.executable, "-m", "substrax.compute._supervisor", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert time.monotonic() - start < 60
    assert child.returncode == 1, child.stderr
    assert "job timed out after 0.5 s; stopping the nodes" in child.stdout


def test_the_node_plan_is_replaced_whole(tmp_path):
    from substrax.compute._supervisor import NODES_FILE, write_plan

    plan = tmp_path / NODES_FILE
    plan.write_text("old")
    held = tmp_path / "held.json"
    held.hardlink_to(plan)
    write_plan(
        tmp_path,
        job="j",
        timeout_seconds=5,
        stop_grace_seconds=7,
        nodes=[(["true"], {}, tmp_path / "w.log")],
    )
    assert json.loads(plan.read_text())["stop_grace_seconds"] == 7
    assert held.read_text() == "old"


# The start of a task of a two-node job: ``r``, its node's rank; ``recorded(node)``, which waits
# (60 s at most) until that node's worker has recorded its task's failure (the record the
# supervisor blames by), so that the nodes' failures come in the order a test needs; and
# ``linger(code)``, which leaves a child in the task's group that ignores SIGTERM and runs
# ``code``: once the task ended, its worker waits for that child (the job's grace at most)
# before it goes on, so that the workers' exits come in the order a test needs too.
_RECORDED = f"""\
def recorded(node):
    record = pathlib.Path(os.environ[{FAILED_AT_ENV!r}]).with_name(f"node-{{node}}.failed-at")
    deadline = time.monotonic() + 60
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
"""
_RANKED = f"""\
import os, pathlib, signal, subprocess, sys, time
r = int(os.environ["JAX_PROCESS_ID"])
{_RECORDED}
def linger(code="time.sleep(60)"):
    ready = "import os, pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    program = ready + "; print(flush=True)" + chr(10) + {_RECORDED!r} + code
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
    child.stdout.readline()
"""


@pytest.mark.usefixtures("child_processes")
def test_the_node_whose_task_failed_first_is_named_though_its_worker_exits_later(tmp_path):
    # node 1's task fails at once but its worker is slow to end what the task left; node 0's
    # task fails later (as a peer's would) and its worker exits first
    first = _RANKED + "if r == 0:\n    recorded(1)\nelse:\n    linger()\nsys.exit(5 - 2 * r)\n"
    fetched, manifest = _failed_two_node_tasks(
        tmp_path, _task("fails", first), _task("next", "pass"), stop_grace_seconds=5
    )
    assert (manifest.failed_node, manifest.failed_node_status) == (1, 3)  # its task's status
    assert [(t.name, t.status, t.returncode) for t in manifest.tasks] == [
        ("fails", "failed", 5),
        ("next", "cancelled", None),  # a node starts no task after a failed one
    ]
    node_1 = read_manifest(fetched / "nodes" / "1" / MANIFEST_NAME)
    assert [(t.name, t.status, t.returncode) for t in node_1.tasks] == [
        ("fails", "cancelled", 3),
        ("next", "cancelled", None),  # a stopped node lists the later tasks too
    ]
    log = (fetched / "worker.log").read_text()
    assert "node 0 failed (exit status 1); stopping the other nodes" in log
    assert "first: node 0's task failed after it or stopped because a peer died" in log


@pytest.mark.usefixtures("child_processes")
def test_a_task_that_stopped_for_a_dead_peer_is_not_blamed_though_it_failed_first(tmp_path):
    # node 0's task ends first, with the peer watch's status (a peer died); node 1's task fails
    # later with its own error; node 0's worker exits first, once node 1's failure is on record
    first = _RANKED + (
        "if r == 1:\n    recorded(0)\n    linger()\n"
        "else:\n    linger('recorded(1)')\nsys.exit(1 if r else 75)\n"
    )
    fetched, manifest = _failed_two_node_tasks(
        tmp_path, _task("fails", first), _task("next", "pass"), stop_grace_seconds=5
    )
    assert manifest.failed_node == 1
    node_1 = read_manifest(fetched / "nodes" / "1" / MANIFEST_NAME)
    assert [(t.status, t.returncode) for t in node_1.tasks] == [
        ("cancelled", 1),
        ("cancelled", None),
    ]
    log = (fetched / "worker.log").read_text()
    assert "node 0 failed (exit status 1); stopping the other nodes" in log
    assert "first: node 0's task failed after it or stopped because a peer died" in log


@pytest.mark.usefixtures("child_processes")
def test_a_node_stopped_while_its_own_failure_was_under_way_is_named(tmp_path):
    # node 1's task is failing (it ignores SIGTERM, as a process in jax's shutdown does) when
    # node 0's task stops for the dead peer and node 0's worker exits first
    first = _RANKED + (
        "terms = []\n"
        "signal.signal(signal.SIGTERM, lambda *_: terms.append(1))  # ignored: it runs on\n"
        "running, deadline = pathlib.Path('node-1-running'), time.monotonic() + 60\n"
        "if r == 1:\n"
        "    running.write_text('')\n"
        "while time.monotonic() < deadline and not (terms if r else running.exists()):\n"
        "    time.sleep(0.02)  # node 0: until node 1's task runs; node 1: until it was stopped\n"
        "sys.exit(1 if r else 75)\n"
    )
    fetched, manifest = _failed_two_node_tasks(
        tmp_path, _task("fails", first), _task("next", "pass"), stop_grace_seconds=5
    )
    assert (manifest.failed_node, manifest.failed_node_status) == (1, 1)
    node_1 = read_manifest(fetched / "nodes" / "1" / MANIFEST_NAME)
    assert [(t.status, t.returncode) for t in node_1.tasks] == [
        ("cancelled", 1),
        ("cancelled", None),
    ]
    log = (fetched / "worker.log").read_text()
    assert "node 0 failed (exit status 1): its task stopped because a peer died" in log
    assert "[substrax] stopping the other nodes" in log  # node 1 ran on: stopped after 5 s


RAISES_AND_LINGERS = """\
import atexit, os, pathlib, sys, time
raised, deadline = pathlib.Path("node-1-raised"), time.monotonic() + 60
if os.environ["JAX_PROCESS_ID"] == "1":
    atexit.register(time.sleep, 2)  # after its traceback, as jax's shutdown after an error
    raised.write_text("")
    raise RuntimeError("node 1 fails")
while not raised.exists() and time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(75)  # node 0's peer watch: process 1 stopped sending heartbeats
"""


@pytest.mark.usefixtures("child_processes")
def test_a_node_whose_task_raised_is_named_though_its_peers_watch_ended_first(tmp_path):
    """Hostile finding: a task that raised lingers while jax shuts down, and its peer's watch
    ended the peer first (status 75): the supervisor stopped the raising node at once, named
    the peer as the failed node and recorded the raising task as cancelled (killed by SIGTERM).
    The others get the job's grace to end on their own first."""
    fetched, manifest = _failed_two_node_tasks(
        tmp_path,
        _task("fails", RAISES_AND_LINGERS),
        _task("next", "pass"),
        stop_grace_seconds=15,
    )
    assert (manifest.failed_node, manifest.failed_node_status) == (1, 1)
    assert [(t.status, t.returncode) for t in manifest.tasks] == [
        ("failed", 75),
        ("cancelled", None),
    ]
    node_1 = read_manifest(fetched / "nodes" / "1" / MANIFEST_NAME)
    assert [(t.name, t.status, t.returncode) for t in node_1.tasks] == [
        ("fails", "failed", 1),
        ("next", "cancelled", None),
    ]
    assert (
        "RuntimeError: node 1 fails"
        in (fetched / "nodes" / "1" / "fails" / "stderr.log").read_text()
    )
    log = (fetched / "worker.log").read_text()
    assert "its task stopped because a peer died; the other nodes get up to 15 s" in log


LEAVES_A_CHILD = (
    "import subprocess, sys; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], stdout={out}); "
    "print('child', p.pid, flush=True)"
)


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("holds_stdout", [False, True], ids=["detached", "holding stdout"])
def test_what_a_task_leaves_running_ends_with_it(tmp_path, gone, holds_stdout):
    out = "None" if holds_stdout else "subprocess.DEVNULL"
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    tasks = (
        _task("leaves", LEAVES_A_CHILD.format(out=out), timeout=60),
        _task("next", "print('next ran')"),
    )
    handle = backend.submit(_spec(*tasks, stop_grace_seconds=0.5), project=tmp_path)
    start = time.monotonic()
    assert wait_until_final(backend, handle, 60) is RunState.SUCCEEDED
    assert time.monotonic() - start < 30  # not the child's 600 s, nor the task's 60 s
    fetched = backend.fetch(handle, tmp_path / "fetched")
    child = int((fetched / "leaves" / "stdout.log").read_text().split()[-1])
    assert gone(child, timeout=5), "a task's child outlived its job"
    assert (fetched / "next" / "stdout.log").read_text() == "next ran\n"


@pytest.mark.usefixtures("child_processes")
def test_a_task_timeout_holds_though_a_child_out_of_its_group_keeps_its_output_open(tmp_path):
    escapes = LEAVES_A_CHILD.replace("stdout={out}", "start_new_session=True")  # stdout: the task's
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(
        _spec(_task("hangs", escapes + "; import time; time.sleep(600)", timeout=1)),
        project=tmp_path,
    )
    start = time.monotonic()
    try:
        assert wait_until_final(backend, handle, 60) is RunState.FAILED
        assert time.monotonic() - start < 30  # the timeout, then a bounded wait for its output
        manifest = read_manifest(Path(handle.details["run_dir"]) / "outputs" / MANIFEST_NAME)
        assert [t.status for t in manifest.tasks] == ["timed-out"]
    finally:
        log = Path(handle.details["run_dir"]) / "outputs" / "hangs" / "stdout.log"
        with contextlib.suppress(OSError, ValueError, IndexError):  # out of reach of any group
            os.kill(int(log.read_text().split()[-1]), signal.SIGKILL)


def _worker_pids(supervisor, count, timeout=30.0):
    """The pids of the ``count`` workers the supervisor ``supervisor`` started."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = [p.pid for p in psutil.Process(supervisor).children()]
        if len(workers) == count:
            return workers
        time.sleep(0.05)
    raise AssertionError(f"the supervisor did not start {count} workers")


@pytest.mark.usefixtures("child_processes")
def test_the_supervisor_ends_the_task_of_a_worker_killed_mid_task_and_says_why(
    tmp_path, spawns_a_child, gone, capsys
):
    """Hostile finding: a worker killed mid-task left its task running (in its own session)
    until someone ran cancel, and the run read as failed with no task and no reason."""
    from substrax.compute._report import report

    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle, child = _submit_sleeper(backend, tmp_path, spawns_a_child)
    assert child is not None
    (worker,) = _worker_pids(int(handle.details["pids"]), 1)
    os.kill(worker, signal.SIGKILL)  # as the OOM killer would
    assert wait_until_final(backend, handle, 60) is RunState.FAILED
    assert gone(child, timeout=1), "the killed worker's task outlived the run"
    fetched = backend.fetch(handle, tmp_path / "f")
    manifest = read_manifest(fetched / MANIFEST_NAME)
    assert (manifest.failed_node, manifest.failed_node_status) == (0, -9)
    assert [(t.name, t.status) for t in manifest.tasks] == [("sleeper", "failed")]
    report(handle, RunState.FAILED, fetched, as_json=False)
    out = capsys.readouterr().out
    assert "The worker of node 0 ended before the job finished (killed by SIGKILL)" in out
    assert "node 0's worker left its task running" in (fetched / "worker.log").read_text()


_SAVES_AT_SIGTERM = """
import os, pathlib, signal, sys, time
def save(*_):
    print("SIGTERM: saving a last checkpoint", flush=True)
    print("more than one line of it", file=sys.stderr, flush=True)
    pathlib.Path(os.environ["AVITAI_OUTPUT_DIR"], "last_checkpoint").write_text("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("sleeping now", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.mark.usefixtures("child_processes")
def test_the_task_of_a_killed_worker_still_saves_in_its_grace(tmp_path):
    """Hostile finding: the task's output pipes had lost their reader with the worker, so the
    first print of its SIGTERM handler raised BrokenPipeError, and it died without saving."""
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle, _ = _submit_sleeper(backend, tmp_path, _SAVES_AT_SIGTERM)
    (worker,) = _worker_pids(int(handle.details["pids"]), 1)
    os.kill(worker, signal.SIGKILL)
    assert wait_until_final(backend, handle, 60) is RunState.FAILED
    saved = Path(handle.details["run_dir"]) / "outputs" / "sleeper" / "last_checkpoint"
    assert saved.read_text() == "saved"


@pytest.mark.usefixtures("child_processes")
def test_cancel_ends_a_task_whose_worker_and_supervisor_were_killed(tmp_path, spawns_a_child, gone):
    """Hostile finding: the run read as failed while its orphaned task ran on; cancel must end
    a group whose leader is dead, however the run reads."""
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle, child = _submit_sleeper(backend, tmp_path, spawns_a_child)
    assert child is not None
    supervisor = int(handle.details["pids"])
    (worker,) = _worker_pids(supervisor, 1)
    os.kill(supervisor, signal.SIGKILL)
    os.kill(worker, signal.SIGKILL)
    assert backend.status(handle) is RunState.RUNNING  # its task lives on
    assert not gone(child, timeout=1), "the task ended with its worker: nothing to test"
    backend.cancel(handle)
    assert gone(child), "cancel left the killed worker's task running"
    assert backend.status(handle) is RunState.CANCELLED


def test_sigterm_to_the_supervisor_alone_cancels_the_run(tmp_path, spawns_a_child, gone):
    """Hostile finding: a plain SIGTERM to the local `_supervisor` pid (`kill PID`) did not
    stop the run: its worker and task ran on."""
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle, child = _submit_sleeper(backend, tmp_path, spawns_a_child)
    assert child is not None
    os.kill(int(handle.details["pids"]), signal.SIGTERM)
    assert wait_until_final(backend, handle, 60) is RunState.CANCELLED
    assert gone(child), "the task outlived its supervisor's SIGTERM"
    manifest = read_manifest(Path(handle.details["run_dir"]) / "outputs" / MANIFEST_NAME)
    assert [t.status for t in manifest.tasks] == ["cancelled"]


TWO_TASKS = (
    _task(
        "sleeper", "import time; print('sleeping now', flush=True); time.sleep(120)", timeout=300
    ),
    _task("second", "print('second task ran')"),
)


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("cancel", [False, True], ids=["workers-stop-alone", "cancel"])
def test_a_multi_node_run_whose_supervisor_was_killed_stops_and_can_be_cancelled(
    tmp_path, gone, cancel
):
    """Hostile finding: with its supervisor killed, the run read as failed at once while both
    workers ran on, and cancel ended only their current tasks: each went on to the next."""
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(_spec(*TWO_TASKS, nodes=2, stop_grace_seconds=2), project=tmp_path)
    run_dir = Path(handle.details["run_dir"])
    supervisor = int(handle.details["pids"])
    workers = _worker_pids(supervisor, 2)
    for line in backend.logs(handle, follow=True):
        if "sleeping now" in line:
            break
    # node 1 too: a worker SIGTERMed while still starting dies before writing any manifest
    deadline = time.monotonic() + 60
    while "sleeping now" not in (run_dir / "worker-1.log").read_text():
        assert time.monotonic() < deadline, "node 1's task never started"
        time.sleep(0.05)
    os.kill(supervisor, signal.SIGKILL)
    assert backend.status(handle) is RunState.RUNNING  # its workers live
    if cancel:
        backend.cancel(handle)
        assert backend.status(handle) is RunState.CANCELLED
    else:
        assert wait_until_final(backend, handle, 60) is RunState.FAILED
    assert all(gone(pid, timeout=5) for pid in workers), "a worker outlived its supervisor"
    for node in (0, 1):
        outputs = run_dir / "outputs" / ("nodes/1" if node else "")
        tasks = read_manifest(outputs / MANIFEST_NAME).tasks
        assert [(t.name, t.status, t.returncode) for t in tasks][1:] == [
            ("second", "cancelled", None)  # listed, never started
        ]
        assert not (outputs / "second").exists(), f"node {node} started its next task"


@pytest.mark.usefixtures("child_processes")
def test_a_task_saving_past_the_job_timeout_ends_a_finished_timed_out_run(tmp_path):
    """The supervisor's stop, a margin after the job's timeout, must not turn a task that is
    saving in its grace into a cancelled, unfinished job."""
    saves = (
        "import os, pathlib, signal, sys, time\n"
        "log = pathlib.Path(os.environ['AVITAI_OUTPUT_DIR']).parents[1] / 'worker.log'\n"
        "def on_term(signum, frame):  # saving until the supervisor's stop has come\n"
        "    deadline = time.monotonic() + 60\n"
        "    while 'stopping the nodes' not in log.read_text() and time.monotonic() < deadline:\n"
        "        time.sleep(0.05)\n"
        "    time.sleep(0.5); print('saved', flush=True); sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "time.sleep(60)\n"
    )
    spec = _spec(_task("saves", saves, timeout=60), timeout_seconds=1, stop_grace_seconds=20)
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(spec, project=tmp_path)
    assert wait_until_final(backend, handle, 60) is RunState.FAILED
    fetched = backend.fetch(handle, tmp_path / "f")
    assert "job timed out after 1 s; stopping the nodes" in (fetched / "worker.log").read_text()
    manifest = read_manifest(fetched / MANIFEST_NAME)
    assert manifest.finished
    assert (manifest.failed_node, [(t.status, t.returncode) for t in manifest.tasks]) == (
        None,
        [("timed-out", 3)],
    )
    assert (fetched / "saves" / "stdout.log").read_text() == "saved\n"


_EXTRAS_PROJECT = """\
[project]
name = "p"
version = "0"
requires-python = ">=3.9"
dependencies = []

[project.optional-dependencies]
x = []
"""
_EXTRAS_LOCK = """\
version = 1
revision = 3
requires-python = ">=3.9"

[[package]]
name = "p"
version = "0"
source = { virtual = "." }

[package.metadata]
provides-extras = ["x"]
"""


def _extras_project(tmp_path, monkeypatch):
    """A project with an empty extra that uv installs offline; the worker finds substrax there.

    uv makes the run's environment from this interpreter; a ``sitecustomize`` on PYTHONPATH adds
    this environment's packages to it, as installing substrax there would.
    """
    import sysconfig

    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(_EXTRAS_PROJECT)
    (project / "uv.lock").write_text(_EXTRAS_LOCK)
    site = tmp_path / "site"
    site.mkdir()
    packages = [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    (site / "sitecustomize.py").write_text(
        f"import site\nfor path in {packages!r}:\n    site.addsitedir(path)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("UV_PYTHON", sys.executable)
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    return project


@pytest.mark.usefixtures("child_processes")
def test_a_job_with_extras_runs_under_uv_to_the_end(tmp_path, monkeypatch):
    """Hostile finding: with extras the worker runs under `uv run`, which stays its parent; the
    worker took that for its supervisor being gone and every such job read failed, its task
    cancelled after 0.0 s."""
    project = _extras_project(tmp_path, monkeypatch)
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    code = "import time; print('task ran', flush=True); time.sleep(1.5); print('task done')"
    handle = backend.submit(_spec(_task("hi", code), extras=("x",)), project=project)
    assert wait_until_final(backend, handle, 120) is RunState.SUCCEEDED
    fetched = backend.fetch(handle, tmp_path / "f")
    manifest = read_manifest(fetched / MANIFEST_NAME)
    assert [(t.status, t.returncode) for t in manifest.tasks] == [("succeeded", 0)]
    assert (fetched / "hi" / "stdout.log").read_text() == "task ran\ntask done\n"
    assert "supervisor" not in (fetched / "worker.log").read_text()


@pytest.mark.usefixtures("child_processes")
def test_a_worker_under_a_parent_of_its_own_runs_while_its_supervisor_lives_and_not_after(
    tmp_path, monkeypatch, gone
):
    """The worker's parent is an intermediate process (as `uv run` is): the worker keeps its
    task running while the supervisor lives, and stops it once the supervisor is killed."""
    import psutil

    wrapper = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"
    monkeypatch.setattr(
        LocalBackend,
        "worker_command",
        lambda *_: ([sys.executable, "-c", wrapper, sys.executable], {}),
    )
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    handle = backend.submit(_spec(*TWO_TASKS, stop_grace_seconds=2), project=tmp_path)
    supervisor = int(handle.details["pids"])
    for line in backend.logs(handle, follow=True):
        if "sleeping now" in line:
            break
    everything = psutil.Process(supervisor).children(recursive=True)  # wrapper, worker, task
    assert len(everything) >= 3, "the task did not start under a wrapped worker"
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # the supervisor lives: so does the task
        assert backend.status(handle) is RunState.RUNNING
        time.sleep(0.2)
    os.kill(supervisor, signal.SIGKILL)
    assert wait_until_final(backend, handle, 60) is RunState.FAILED
    assert all(gone(p.pid, timeout=5) for p in everything), "a process outlived its supervisor"
    manifest = read_manifest(Path(handle.details["run_dir"]) / "outputs" / MANIFEST_NAME)
    assert [(t.name, t.status) for t in manifest.tasks] == [
        ("sleeper", "cancelled"),
        ("second", "cancelled"),  # listed, never started
    ]
    assert manifest.tasks[1].returncode is None
    log = (Path(handle.details["run_dir"]) / "worker.log").read_text()
    assert f"the supervisor (pid {supervisor}) is gone; stopping this node" in log


@pytest.mark.usefixtures("child_processes")
def test_a_slow_install_of_the_extras_does_not_turn_a_task_timeout_into_a_cancellation(
    tmp_path, monkeypatch
):
    """Hostile finding: the supervisor's deadline counted uv's install of the extras, so it
    stopped the worker before the worker's own deadline and the task read cancelled."""
    project = _extras_project(tmp_path, monkeypatch)
    slow = tmp_path / "bin" / "uv"
    slow.parent.mkdir()
    # past the deadline the supervisor once counted from its own start: timeout + 5 s margin
    slow.write_text(f'#!/bin/sh\nsleep 6\nexec {shutil.which("uv")} "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow.parent}{os.pathsep}{os.environ['PATH']}")
    backend = LocalBackend({"state_dir": str(tmp_path / "s")})
    sleeps = "import time; print('started', flush=True); time.sleep(60)"
    spec = _spec(_task("long", sleeps), extras=("x",), timeout_seconds=0.5, stop_grace_seconds=1)
    handle = backend.submit(spec, project=project)
    assert wait_until_final(backend, handle, 120) is RunState.FAILED
    manifest = read_manifest(Path(handle.details["run_dir"]) / "outputs" / MANIFEST_NAME)
    assert manifest.finished, "the supervisor stopped the worker before its own deadline"
    assert [t.status for t in manifest.tasks] == ["timed-out"]


def test_a_log_line_without_newlines_is_followed_in_bounded_parts(tmp_path):
    """Hostile finding: 219 MB of a progress bar on one line was read whole by `run` (a 638 MiB
    command) before any of it was shown."""
    from substrax.compute._files import LINE_CHARS, follow_lines

    log = tmp_path / "worker.log"
    bar = "".join(f"\r{i:3d}% caf\u00e9" for i in range(20000))  # no newline, 2-byte characters
    log.write_text(f"first\n{bar}\nlast", encoding="utf-8")
    lines = list(follow_lines(log, done=None))
    assert lines[0] == "first"
    assert lines[-1] == "last"
    assert all(len(line) <= LINE_CHARS for line in lines)
    assert "".join(lines[1:-1]) == bar
