"""The worker: environment per task, logs, timeouts, failures, manifest, probe, secrets."""

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from substrax.compute import (
    DEVICES_LOG,
    STDERR_LOG,
    STDOUT_LOG,
    JobSpec,
    Task,
    TaskStatus,
    read_job_spec,
    read_manifest,
    run_job,
)
from substrax.compute._environment import node_outputs
from substrax.compute._manifest import MANIFEST_NAME
from substrax.testing import run_python


def _task(name, code, timeout=60.0):
    return Task(name=name, argv=("python", "-c", code), timeout_seconds=timeout)


def _spec(*tasks, timeout=60.0, **fields):
    fields.setdefault("probe_devices", False)
    return JobSpec(name="w", tasks=tasks, timeout_seconds=timeout, **fields)


ENV_DUMP = (
    "import json, os, pathlib; keys = ['AVITAI_OUTPUT_DIR', 'JAX_PLATFORMS', 'XLA_FLAGS', "
    "'JAX_ENABLE_X64', 'GREETING', 'SUBSTRAX_MOUNT_DATA']; print(json.dumps({k: os.environ.get(k) for k in keys})); "
    "print(json.dumps({'cwd': os.getcwd()}))"
)


@pytest.mark.usefixtures("child_processes")
def test_each_task_runs_from_the_project_with_the_job_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--inherited=1")  # the parent's jax settings are dropped
    spec = _spec(
        _task("env", ENV_DUMP),
        runtime={"platforms": ["cpu"], "enable_x64": True, "xla_flags": ["--xla_cpu_a=1"]},
        env={"GREETING": "hi"},
        mounts=({"name": "data", "path": "/data"},),
    )
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "out", echo=False)
    assert manifest.succeeded
    lines = (tmp_path / "out" / "env" / "stdout.log").read_text().splitlines()
    env, where = json.loads(lines[0]), json.loads(lines[1])
    assert env == {
        "AVITAI_OUTPUT_DIR": str((tmp_path / "out" / "env").resolve()),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_cpu_a=1",
        "JAX_ENABLE_X64": "true",
        "GREETING": "hi",
        "SUBSTRAX_MOUNT_DATA": "/data",
    }
    assert where == {"cwd": str(tmp_path.resolve())}


@pytest.mark.usefixtures("child_processes")
def test_logs_outputs_and_echo(tmp_path, capfd):
    code = (
        "import os, sys, pathlib; print('out line'); print('err line', file=sys.stderr); "
        "d = pathlib.Path(os.environ['AVITAI_OUTPUT_DIR']); (d / 'sub').mkdir(); "
        "(d / 'sub' / 'a.txt').write_text('a'); (d / 'b.json').write_text('{}')"
    )
    manifest = run_job(_spec(_task("t", code)), project=tmp_path, outputs=tmp_path / "o")
    task = manifest.tasks[0]
    assert task.outputs == ("b.json", "sub/a.txt")  # the logs are not outputs
    task_dir = tmp_path / "o" / "t"
    assert sorted(p.name for p in task_dir.iterdir()) == sorted(
        ["b.json", "sub", STDOUT_LOG, STDERR_LOG]
    )
    assert (task_dir / STDOUT_LOG).read_text() == "out line\n"
    assert (task_dir / STDERR_LOG).read_text() == "err line\n"
    echoed = capfd.readouterr().out
    assert "[t] out line" in echoed
    assert "[t] err line" in echoed
    assert "[substrax] task t started (1/1)" in echoed
    assert "[substrax] job w succeeded" in echoed


@pytest.mark.usefixtures("child_processes")
def test_links_left_in_the_outputs_are_named_as_not_fetched(tmp_path, capfd):
    """Hostile finding: a `latest -> step_100` link was dropped from the outputs without a word."""
    saves = [
        "d = pathlib.Path(os.environ['AVITAI_OUTPUT_DIR'])",
        "(d / 'step_100').mkdir()",
        "(d / 'step_100' / 'w.bin').write_text('w')",
        "(d / 'latest').symlink_to('step_100')",
        "(d / 'best.bin').symlink_to('step_100/w.bin')",
    ]
    task = _task("t", "; ".join(["import os, pathlib", *saves]))
    assert run_job(_spec(task), project=tmp_path, outputs=tmp_path / "o").tasks[0].outputs == (
        "step_100/w.bin",
    )
    echoed = capfd.readouterr().out
    assert (
        "[substrax] task t left 2 symbolic links in its outputs (best.bin, latest), which are "
        "not fetched: links are never followed; write a file in their place"
    ) in echoed


@pytest.mark.usefixtures("child_processes")
def test_failed_and_unstartable_tasks_do_not_stop_the_next(tmp_path):
    spec = _spec(
        _task("fails", "raise SystemExit(3)"),
        Task(name="missing", argv=("no-such-program-xyz",), timeout_seconds=5),
        _task("after", "print('still ran')"),
    )
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=False)
    assert [(t.name, t.status, t.returncode) for t in manifest.tasks] == [
        ("fails", TaskStatus.FAILED, 3),
        ("missing", TaskStatus.FAILED, None),
        ("after", TaskStatus.SUCCEEDED, 0),
    ]
    assert manifest.finished
    assert not manifest.succeeded
    assert "no-such-program-xyz" in (tmp_path / "o" / "missing" / "stderr.log").read_text()


@pytest.mark.usefixtures("child_processes")
def test_a_node_of_a_multi_node_job_starts_no_task_after_one_that_failed(tmp_path, capfd):
    """Hostile finding: node 1 failed task A before jax started and went on to task B, which
    joined node 0's A at the shared coordinator address: two programs formed one jax run and
    both read as succeeded. A node now ends failed instead; its peers are stopped."""
    spec = _spec(
        _task("a", "raise SystemExit(7)"),
        _task("b", "print('b ran')"),
        _task("c", "print('c ran')"),
        nodes=2,
    )
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", node=1)
    assert [(t.name, t.status, t.returncode) for t in manifest.tasks] == [
        ("a", TaskStatus.FAILED, 7),
        ("b", TaskStatus.CANCELLED, None),
        ("c", TaskStatus.CANCELLED, None),
    ]
    assert manifest.finished
    assert not manifest.succeeded
    echoed = capfd.readouterr().out
    assert "b ran" not in echoed
    assert "this node starts no further task (b, c cancelled)" in echoed
    assert read_manifest(node_outputs(tmp_path / "o", 1) / MANIFEST_NAME) == manifest


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_cancelled_run_lists_every_task_the_later_ones_cancelled(tmp_path, nodes):
    """Hostile finding: a cancelled (or stopped) node's manifest listed only the task it was
    running: the job's later tasks were missing from it and from the run's table."""
    spec = _spec(_task("a", "print('a ran')"), _task("b", "print('b ran')"), nodes=nodes)
    manifest = run_job(
        spec, project=tmp_path, outputs=tmp_path / "o", echo=False, runner_hook=_cancel
    )
    assert [(t.name, t.status) for t in manifest.tasks] == [
        ("a", TaskStatus.CANCELLED),
        ("b", TaskStatus.CANCELLED),
    ]
    assert not manifest.finished
    assert read_manifest(tmp_path / "o" / MANIFEST_NAME) == manifest


def _cancel(runner):
    runner.cancel()  # before the first task starts: none does


@pytest.mark.usefixtures("child_processes")
def test_why_a_task_could_not_start_is_echoed_like_its_output(tmp_path, capfd):
    # it was only in the task's stderr.log: the console said "task missing failed", no reason
    spec = _spec(Task(name="missing", argv=("no-such-program-xyz",), timeout_seconds=5))
    run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=True)
    echoed = capfd.readouterr().out
    assert "[missing] could not start 'no-such-program-xyz': [Errno 2]" in echoed


def test_task_timeout_kills_the_task_and_its_children(tmp_path, spawns_a_child, gone):
    # the grace bounds the wait for the SIGTERMed child: an orphan, a member of the task's group
    # (a zombie) until init reaps it
    spec = _spec(
        _task("slow", spawns_a_child, timeout=1.5),
        _task("next", "print(1)"),
        stop_grace_seconds=0.5,
    )
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=False)
    assert manifest.tasks[0].status is TaskStatus.TIMED_OUT
    assert manifest.tasks[1].status is TaskStatus.SUCCEEDED
    lines = (tmp_path / "o" / "slow" / "stdout.log").read_text().splitlines()
    assert lines[1] == "sleeping now"
    assert gone(int(lines[0].split()[-1])), "the timed-out task's child outlived it"


@pytest.mark.usefixtures("child_processes")
def test_job_budget_bounds_later_tasks(tmp_path, capfd):
    """Hostile finding: the task the job's timeout left no time was logged "task b started
    (2/2)" (`run` showed "--- running b"), though no process of it ever started."""
    spec = _spec(
        _task("a", "import time; time.sleep(30)", timeout=30),
        _task("b", "print(1)", timeout=30),
        timeout=0.5,
    )
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=True)
    assert [t.status for t in manifest.tasks] == [TaskStatus.TIMED_OUT, TaskStatus.TIMED_OUT]
    assert manifest.tasks[1].returncode is None
    assert (tmp_path / "o" / "b" / "stdout.log").read_text() == ""
    echoed = capfd.readouterr().out
    assert "[substrax] task a started (1/2)\n" in echoed
    assert "task b started" not in echoed
    assert "[substrax] task b not started: the job's timeout_seconds ran out (2/2)\n" in echoed


def test_manifest_is_rewritten_after_every_task(tmp_path, wall_clock):
    gate = tmp_path / "gate"
    spec = _spec(
        _task("first", "print(1)"),
        _task(
            "second",
            f"import pathlib, time\nwhile not pathlib.Path({str(gate)!r}).exists(): wall_clock.sleep(0.05)",
        ),
    )
    thread = threading.Thread(
        target=run_job,
        args=(spec,),
        kwargs={"project": tmp_path, "outputs": tmp_path / "o", "echo": False},
    )
    thread.start()
    path = tmp_path / "o" / MANIFEST_NAME
    deadline = time.monotonic() + 30
    seen = None
    while time.monotonic() < deadline:
        if path.exists() and (seen := read_manifest(path)).tasks:
            break
        wall_clock.sleep(0.02)
    gate.touch()
    thread.join(30)
    assert seen is not None
    assert [t.name for t in seen.tasks] == ["first"]
    assert not seen.finished
    final = read_manifest(path)
    assert final.finished
    assert [t.name for t in final.tasks] == ["first", "second"]
    assert not [p.name for p in path.parent.iterdir() if p.name.startswith(".")], "temp files left"


@pytest.mark.usefixtures("child_processes")
def test_secrets_pass_through_and_are_redacted_from_logs(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("SX_TOKEN", "tok-9f8e7d6c")
    spec = _spec(
        _task("s", "import os; v = os.environ['SX_TOKEN']; print('token is', v); print(len(v))"),
        secrets=("SX_TOKEN",),
    )
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o")
    assert manifest.succeeded
    stdout = (tmp_path / "o" / "s" / "stdout.log").read_text()
    assert stdout == "token is ***\n12\n"
    assert "tok-9f8e7d6c" not in capfd.readouterr().out
    assert "tok-9f8e7d6c" not in (tmp_path / "o" / MANIFEST_NAME).read_text()


@pytest.mark.usefixtures("child_processes")
def test_a_secret_too_short_to_mask_is_not_masked_and_the_log_names_it(
    tmp_path, monkeypatch, capfd
):
    """Hostile finding: SHORT_SECRET=1 turned "step 1 loss 0.11" into "step *** loss 0.******"."""
    monkeypatch.setenv("SHORT_SECRET", "1")
    monkeypatch.setenv("SX_TOKEN", "tok-9f8e7d6c")
    code = "import os; print('step 1 loss 0.11 token', os.environ['SX_TOKEN'])"
    spec = _spec(_task("s", code), secrets=("SHORT_SECRET", "SX_TOKEN"))
    assert run_job(spec, project=tmp_path, outputs=tmp_path / "o").succeeded
    assert (tmp_path / "o" / "s" / STDOUT_LOG).read_text() == "step 1 loss 0.11 token ***\n"
    echoed = capfd.readouterr().out
    assert (
        "[substrax] secret SHORT_SECRET is not masked in the logs: its value is shorter than 4 "
        "characters, and masking it would mask them in every line\n"
    ) in echoed
    assert "[s] step 1 loss 0.11 token ***\n" in echoed


class _Chunks:
    """A task's pipe that hands out ``chunks`` one read at a time, and records each read's size."""

    def __init__(self, chunks, log=None):
        self.chunks, self.log, self.asked, self.written_before = list(chunks), log, [], []

    def read1(self, size):
        self.asked.append(size)
        if self.log is not None:
            self.written_before.append(len(self.log.getvalue()))
        return self.chunks.pop(0) if self.chunks else b""

    def close(self):
        pass


class _Log(io.BytesIO):
    def close(self):  # the pump closes its log; the test reads it after
        pass


def test_output_without_newlines_is_read_in_bounded_chunks_and_written_as_it_comes():
    """Hostile finding: a 219 MB progress bar on one line (tqdm's \\r) was held whole in memory
    by the pump (a 974 MiB worker), and nothing of it reached the log until it ended."""
    from substrax.compute._pump import CHUNK_BYTES, ECHO_LINE_CHARS, Pump, Redactor

    log = _Log()
    bar = [f"\r{i:3d}%|{'#' * 30000}|".encode() for i in range(100)]
    stream = _Chunks(bar, log)
    pump = Pump(stream, log, STDOUT_LOG, None, Redactor({}))
    pump.run()
    assert log.getvalue() == b"".join(bar)
    assert set(stream.asked) == {CHUNK_BYTES}
    assert stream.written_before[1:4] == [len(bar[0]), 2 * len(bar[0]), 3 * len(bar[0])]

    lines = []
    echoed = Pump(
        _Chunks([b"x" * (3 * ECHO_LINE_CHARS), b"\r 1%\r 2%\n"]), _Log(), "", "", Redactor({})
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "substrax.compute._pump.echo", lambda _prefix, line: lines.append(line) or True
        )
        echoed.run()
    assert lines == ["x" * ECHO_LINE_CHARS] * 3 + [" 1%", " 2%"]


@pytest.mark.parametrize("read_bytes", [1 << 20, 64 * 1024, 1000, 17001])
def test_every_echoed_line_is_cut_at_the_limit_whatever_the_reads(read_bytes):
    """Hostile finding: a line that came whole in one read was echoed whole (17006 and 40006
    characters in worker.log) and only a held one was cut: the cut depended on the reads."""
    from substrax.compute._pump import ECHO_LINE_CHARS, Pump, Redactor

    data = ("a" * 17000 + "\n" + "b" * 40000 + "\n" + "c" * 200000 + "\n").encode()
    chunks = [data[i : i + read_bytes] for i in range(0, len(data), read_bytes)]
    lines = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "substrax.compute._pump.echo", lambda _prefix, line: lines.append(line) or True
        )
        Pump(_Chunks(chunks), _Log(), STDOUT_LOG, "[out] ", Redactor({})).run()
    expected = [
        text[i : i + ECHO_LINE_CHARS]
        for text in ("a" * 17000, "b" * 40000, "c" * 200000)
        for i in range(0, len(text), ECHO_LINE_CHARS)
    ]
    assert lines == expected


def test_a_secret_split_between_two_reads_is_still_masked():
    from substrax.compute._pump import Pump, Redactor

    log = _Log()
    chunks = [b"token tok-9f", b"8e7d6c and tok-9f8e7d6c", b" again tok-9", b"f8e7d6c"]
    Pump(_Chunks(chunks), log, STDOUT_LOG, None, Redactor({"SX_TOKEN": "tok-9f8e7d6c"})).run()
    assert log.getvalue() == b"token *** and *** again ***"


@pytest.mark.usefixtures("child_processes")
def test_the_shell_s_jax_variables_a_task_does_not_get_are_named_in_the_log(
    tmp_path, monkeypatch, capfd
):
    """Hostile finding: a shell's JAX_ENABLE_X64=1 was dropped silently (the task computed in
    float32), with no word in the guide or the log."""
    for name in os.environ:
        if name.startswith(("JAX_", "XLA_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/dump")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # what the runtime table sets too: it gets it
    code = "import os; print(os.environ.get('JAX_ENABLE_X64'), os.environ.get('JAX_PLATFORMS'))"
    spec = _spec(_task("t", code), runtime={"platforms": ["cpu"]})
    assert run_job(spec, project=tmp_path, outputs=tmp_path / "o").succeeded
    assert (tmp_path / "o" / "t" / STDOUT_LOG).read_text() == "None cpu\n"
    assert (
        "[substrax] the tasks do not get this environment's JAX_ENABLE_X64, XLA_FLAGS: substrax "
        "sets JAX_* and XLA_* variables from the job's runtime table and env only; set them there\n"
    ) in capfd.readouterr().out


def test_a_shell_variable_the_task_gets_with_the_same_meaning_is_not_named(tmp_path, monkeypatch):
    """Hostile finding: with JAX_ENABLE_X64=1 exported and enable_x64 = true, the log said the
    tasks do not get JAX_ENABLE_X64, though they got JAX_ENABLE_X64=true."""
    from substrax.compute._runner import TaskRunner

    for name in os.environ:
        if name.startswith(("JAX_", "XLA_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    monkeypatch.setenv("JAX_DEBUG_NANS", "yes")  # the job sets it false: the task gets another
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/dump")
    spec = _spec(_task("t", "pass"), runtime={"enable_x64": True, "debug_nans": False})
    runner = TaskRunner(spec, project=tmp_path, root=tmp_path / "o", echo=False, python="python")
    assert runner.dropped() == ["JAX_DEBUG_NANS", "XLA_FLAGS"]


def test_missing_secret_fails_the_task_without_running_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SX_ABSENT", raising=False)
    spec = _spec(_task("s", "print(1)"), secrets=("SX_ABSENT",))
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=False)
    assert manifest.tasks[0].status is TaskStatus.FAILED
    assert manifest.tasks[0].returncode is None
    assert "SX_ABSENT" in (tmp_path / "o" / "s" / "stderr.log").read_text()


@pytest.mark.usefixtures("child_processes")
def test_device_probe_is_recorded_and_a_failed_probe_is_logged(tmp_path):
    spec = _spec(
        _task("t", "print(1)"), runtime={"platforms": ["cpu"], "cpu_devices": 2}, probe_devices=True
    )
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=False)
    assert manifest.devices is not None
    assert (manifest.devices.platform, manifest.devices.kinds, manifest.devices.count) == (
        "cpu",
        ("cpu",),
        2,
    )
    bad = _spec(_task("t", "print(1)"), probe_devices=True)
    manifest = run_job(
        bad, project=tmp_path, outputs=tmp_path / "p", echo=False, python="/nonexistent/python"
    )
    assert manifest.devices is None
    assert "device probe failed" in (tmp_path / "p" / DEVICES_LOG).read_text()


@pytest.mark.usefixtures("child_processes")
def test_other_nodes_write_under_nodes(tmp_path):
    manifest = run_job(
        _spec(_task("t", "print(1)")), project=tmp_path, outputs=tmp_path / "o", echo=False, node=1
    )
    assert manifest.node == 1
    assert node_outputs(tmp_path / "o", 1) == tmp_path / "o" / "nodes" / "1"
    assert (tmp_path / "o" / "nodes" / "1" / MANIFEST_NAME).is_file()


@pytest.mark.usefixtures("child_processes")
def test_worker_command_line_exit_codes(tmp_path):
    for code, expected in (("print(1)", 0), ("raise SystemExit(2)", 1)):
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(_spec(_task("t", code)).model_dump(mode="json")))
        child = subprocess.run(
            [
                sys.executable,
                "-m",
                "substrax.compute.worker",
                "--spec",
                str(spec_path),
                "--project",
                str(tmp_path),
                "--outputs",
                str(tmp_path / "o"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert child.returncode == expected, child.stderr


_LEAVES_A_SESSION = (
    "import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(600)'], start_new_session=True, stdout=sys.stdout); "
    "print(child.pid, flush=True)"
)


@pytest.mark.usefixtures("child_processes")
def test_the_worker_ends_what_a_task_left_in_a_session_of_its_own(tmp_path):
    """Hostile finding: a child in its own session outlived the job, held the task's output
    5 s longer, and nothing said so; the worker adopts (and ends) what its tasks leave."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(_spec(_task("t", _LEAVES_A_SESSION)).model_dump(mode="json")))
    argv = ["--spec", str(spec_path), "--project", str(tmp_path), "--outputs", str(tmp_path / "o")]
    started = time.monotonic()
    worker = subprocess.run(
        [sys.executable, "-m", "substrax.compute.worker", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert worker.returncode == 0, worker.stderr
    assert time.monotonic() - started < 20  # its 600 s, or the log pump's wait, never held it
    left = int((tmp_path / "o" / "t" / STDOUT_LOG).read_text().split()[0])
    assert not Path(f"/proc/{left}").exists()
    assert f"task t left processes running [{left}]; they were ended" in worker.stdout


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize(
    ("spec_text", "says"),
    [
        (None, "No such file"),
        ("{not json", "Expecting property name"),
        ('{"schema_version": 2}', "job spec version 2 is not 4"),
        (
            json.dumps(
                {
                    **_spec(_task("t", "print(1)")).model_dump(mode="json"),
                    "resources": {"accelerator": {"kind": "H100", "count": 10**20}},
                }
            ),
            "spec.resources.accelerator.count: must be between 1 and 64, got 100000000000000000000",
        ),
    ],
)
def test_worker_refuses_a_bad_spec_with_exit_2_and_one_line(tmp_path, spec_text, says):
    spec_path = tmp_path / "spec.json"
    if spec_text is not None:
        spec_path.write_text(spec_text)
    child = subprocess.run(
        [
            sys.executable, "-m", "substrax.compute.worker", "--spec", str(spec_path),
            "--project", str(tmp_path), "--outputs", str(tmp_path / "o"),
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert child.returncode == 2, child.stderr
    assert child.stderr.startswith(
        f"python -m substrax.compute.worker: error: --spec {spec_path}: "
    ), child.stderr
    assert says in child.stderr
    assert child.stderr.count("\n") == 1, child.stderr


def test_spec_of_another_version_is_refused(tmp_path):
    data = _spec(_task("t", "print(1)")).model_dump(mode="json")
    assert read_job_spec(data).tasks[0].name == "t"
    with pytest.raises(ValueError, match="job spec version 2 is not 4"):
        read_job_spec({**data, "schema_version": 2})
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        read_job_spec({**data, "colour": "red"})


@pytest.mark.usefixtures("child_processes")
def test_importing_compute_does_not_import_jax():
    code = (
        "import sys, substrax.compute, substrax.compute.worker, substrax.compute.cli; "
        "from substrax.compute import LocalBackend, ModalBackend, SkyPilotBackend; "
        "bad = [m for m in ('jax', 'modal', 'sky', 'rich') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert child.returncode == 0, child.stdout + child.stderr


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ["--project", "{tmp}/misspelled"],
            "--project '{tmp}/misspelled' is not a directory; pass the project root",
        ),
        (["--node-rank", "-1"], "--node-rank -1 is outside this 1-node job; pass 0 to 0"),
        (
            ["--node-rank", "99999999999999999999"],
            "--node-rank 99999999999999999999 is outside this 1-node job",
        ),
        (["--outputs", ""], "--outputs is empty; pass the run's output directory"),
        (
            ["--outputs", "{tmp}/file"],
            "--outputs '{tmp}/file' cannot be a directory: {tmp}/file is a file",
        ),
        (
            ["--outputs", "{tmp}/file/o"],
            "--outputs '{tmp}/file/o' cannot be a directory: {tmp}/file is a file",
        ),
    ],
)
def test_worker_refuses_bad_arguments_with_exit_2_and_one_line(tmp_path, flags, says):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(_spec(_task("t", "print(1)")).model_dump(mode="json")))
    (tmp_path / "file").write_text("mine")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    child = subprocess.run(
        [
            sys.executable, "-m", "substrax.compute.worker", "--spec", str(spec_path),
            "--project", str(tmp_path), "--outputs", str(tmp_path / "o"),
            *(flag.format(tmp=tmp_path) for flag in flags),
        ],
        capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
    )  # fmt: skip
    assert child.returncode == 2, child.stderr
    assert child.stderr.startswith(
        f"python -m substrax.compute.worker: error: {says.format(tmp=tmp_path)}"
    ), child.stderr
    assert child.stderr.count("\n") == 1, child.stderr
    assert not (tmp_path / "o").exists()
    assert list(cwd.iterdir()) == []
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.usefixtures("child_processes")
def test_a_hung_device_probe_is_bounded_by_the_job_timeout(tmp_path):
    hangs = tmp_path / "hangs"
    hangs.write_text("#!/bin/sh\nexec sleep 600\n")
    hangs.chmod(0o755)
    spec = JobSpec(
        name="w",
        tasks=(Task(name="t", argv=(sys.executable, "-c", "print(1)"), timeout_seconds=2),),
        timeout_seconds=1,
        probe_devices=True,
    )
    start = time.monotonic()
    manifest = run_job(
        spec, project=tmp_path, outputs=tmp_path / "o", echo=False, python=str(hangs)
    )
    assert time.monotonic() - start < 30
    assert manifest.finished
    assert manifest.devices is None
    assert manifest.tasks[0].status is TaskStatus.TIMED_OUT
    assert "device probe failed" in (tmp_path / "o" / "devices.log").read_text()


def test_the_worker_module_serves_the_manifest_names_where_0_1_22_did():
    import substrax.compute
    from substrax.compute import worker

    for name in ("JobManifest", "RunDevices", "TaskOutcome", "read_manifest"):
        assert getattr(worker, name) is getattr(substrax.compute, name)
        assert name in worker.__all__


def test_a_full_disk_under_the_run_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    import errno

    from substrax.compute import _worker

    def full(path, manifest):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(_worker, "write_manifest", full)  # as the disk refuses the manifest
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(_spec(_task("t", "print(1)")).model_dump(mode="json")))
    argv = ["--spec", str(spec_path), "--project", str(tmp_path), "--outputs", str(tmp_path / "o")]
    assert _worker.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m substrax.compute.worker: error: [Errno 28] No space left")
    assert err.count("\n") == 1, err


UNDECODABLE = (
    "import sys; w = sys.stdout.buffer.write; w(b'\\xff first caf\\xc3\\xa9\\n'); "
    "[w(b'plain ascii line number %d\\n' % i) for i in range(20000)]; w(b'END-OF-OUTPUT\\n')"
)


@pytest.mark.usefixtures("child_processes")
def test_logs_are_utf_8_whatever_the_locale_and_output_past_the_pipe_never_hangs(tmp_path):
    """Hostile finding: under LC_ALL=C the log was ASCII: a non-ASCII line stopped the pump
    quietly (an empty stdout.log on a run that succeeded, or a task blocked on its full pipe)."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(
        json.dumps(_spec(_task("t", UNDECODABLE, timeout=20)).model_dump(mode="json"))
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_")}
    child = subprocess.run(
        [
            sys.executable, "-m", "substrax.compute.worker", "--spec", str(spec_path),
            "--project", str(tmp_path), "--outputs", str(tmp_path / "o"),
        ],
        capture_output=True, timeout=60, check=False,
        env={**env, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""},
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    manifest = read_manifest(tmp_path / "o" / MANIFEST_NAME)
    assert [(t.status, t.lost_log_bytes) for t in manifest.tasks] == [(TaskStatus.SUCCEEDED, 0)]
    lines = (tmp_path / "o" / "t" / STDOUT_LOG).read_text(encoding="utf-8").splitlines()
    assert lines[0] == "\ufffd first caf\u00e9"
    assert (len(lines), lines[-1]) == (20002, "END-OF-OUTPUT")
    assert b"[t] END-OF-OUTPUT" in child.stdout  # the echo, in the worker's log


class _FillsUp:
    """A task's log on a disk that fills after ``room`` bytes: then each write is ENOSPC."""

    def __init__(self, file, room):
        self.file, self.room = file, room

    def write(self, data):
        import errno

        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


@pytest.mark.usefixtures("child_processes")
def test_a_full_disk_under_a_tasks_log_is_counted_and_never_blocks_the_task(tmp_path, monkeypatch):
    """Hostile finding: ENOSPC killed the log pump quietly; the task then blocked on its full
    pipe until the job timeout and read as timed out."""

    real_open = Path.open

    def open_(self, *args, **kwargs):
        file = real_open(self, *args, **kwargs)
        return _FillsUp(file, 1000) if self.name == STDOUT_LOG else file

    monkeypatch.setattr(Path, "open", open_)
    code = (
        "import sys; [print('x' * 40, i) for i in range(20000)]; print('err line', file=sys.stderr)"
    )
    spec = _spec(_task("big", code, timeout=10), _task("after", "print('after ran')"))
    start = time.monotonic()
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=False)
    assert time.monotonic() - start < 8, "the task blocked on its pipe"
    big, after = manifest.tasks
    assert (big.status, after.status) == (TaskStatus.SUCCEEDED, TaskStatus.SUCCEEDED)
    total = sum(len(f"{'x' * 40} {i}\n") for i in range(20000))
    written = (tmp_path / "o" / "big" / STDOUT_LOG).stat().st_size
    assert big.lost_log_bytes == total - written
    assert big.lost_log_reason == "writing stdout.log failed: [Errno 28] No space left on device"
    assert (tmp_path / "o" / "big" / STDERR_LOG).read_text() == "err line\n"
    assert read_manifest(tmp_path / "o" / MANIFEST_NAME) == manifest


@pytest.mark.usefixtures("child_processes")
def test_a_timed_out_task_gets_sigterm_and_the_grace_to_save_before_sigkill(tmp_path):
    """Hostile finding: a task timeout was an immediate SIGKILL, so no final checkpoint."""
    saves = (
        "import os, pathlib, signal, sys, time\n"
        "def on_term(signum, frame):\n"
        "    pathlib.Path(os.environ['AVITAI_OUTPUT_DIR'], 'last.ckpt').write_text('saved')\n"
        "    sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    spec = _spec(
        Task(name="saves", argv=("python", "-c", saves), timeout_seconds=1),
        Task(name="stubborn", argv=("python", "-c", stubborn), timeout_seconds=1),
        stop_grace_seconds=0.5,
    )
    start = time.monotonic()
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=False)
    assert time.monotonic() - start < 20
    assert [(t.status, t.returncode) for t in manifest.tasks] == [
        (TaskStatus.TIMED_OUT, 7),  # its own exit, after it saved
        (TaskStatus.TIMED_OUT, -9),  # killed once the grace had passed
    ]
    assert (tmp_path / "o" / "saves" / "last.ckpt").read_text() == "saved"


@pytest.mark.usefixtures("child_processes")
def test_a_task_under_a_wrapper_that_dies_of_sigterm_gets_it_once_and_the_rest_of_the_grace(
    tmp_path,
):
    """Hostile finding: a task run through a wrapper (``bash train.sh``) got SIGTERM twice at
    once: the wrapper died of the first, and ending what it left sent the second, which ran the
    save handler again."""
    (tmp_path / "saver.py").write_text(
        "import os, pathlib, signal, sys, time\n"
        "out = pathlib.Path(os.environ['AVITAI_OUTPUT_DIR'])\n"
        "def on_term(signum, frame):\n"
        "    on_term.calls = getattr(on_term, 'calls', 0) + 1\n"
        "    (out / f'sigterm-{on_term.calls}').write_text('')\n"
        "    time.sleep(1)  # saving\n"
        "    (out / 'last.ckpt').write_text('saved')\n"
        "    sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "time.sleep(60)\n"
    )
    wrapper = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, 'saver.py']))"
    spec = _spec(_task("wrapped", wrapper, timeout=5), stop_grace_seconds=20)
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=False)
    assert [(t.status, t.returncode) for t in manifest.tasks] == [(TaskStatus.TIMED_OUT, -15)]
    task_dir = tmp_path / "o" / "wrapped"
    assert sorted(p.name for p in task_dir.glob("sigterm-*")) == ["sigterm-1"]
    assert (task_dir / "last.ckpt").read_text() == "saved"


class _Runner:
    def __init__(self):
        self.stopped = 0

    def stop(self):
        self.stopped += 1


def test_a_worker_whose_supervisor_is_gone_stops_its_task():
    from substrax.compute._worker import watch_supervisor

    lives = iter([True, True, True, False])
    asked = []

    def alive(pid, since):
        asked.append((pid, since))
        return next(lives)

    runner, naps = _Runner(), []
    watch_supervisor(41, runner, alive=alive, started=lambda _pid: "12.500", sleep=naps.append)
    assert runner.stopped == 1
    assert len(naps) == 3
    assert set(asked) == {(41, "12.500")}  # its start time: a pid reused later is not it


class _NappedError(Exception):
    pass


def _nap(seconds):
    raise _NappedError


def test_the_supervisor_watch_sees_a_live_process_and_not_a_reused_pid(monkeypatch):
    """Hostile finding: with extras the worker runs under `uv run`, which stays its parent, so
    a watch of os.getppid() stopped every such job's task at once (cancelled after 0.0 s)."""
    from substrax.compute._worker import watch_supervisor

    monkeypatch.setattr(os, "getppid", lambda: 4242)  # an intermediate parent, as uv run
    runner = _Runner()
    with pytest.raises(_NappedError):  # this process lives: the watch waits on
        watch_supervisor(os.getpid(), runner, sleep=_nap)
    assert runner.stopped == 0
    watch_supervisor(os.getpid(), runner, started=lambda _pid: "1.000", sleep=_nap)
    assert runner.stopped == 1  # another process than the one started then: gone
    watch_supervisor(os.getpid(), runner, started=lambda _pid: "", sleep=_nap)
    assert runner.stopped == 2  # gone before the watch began


def test_a_task_does_not_inherit_the_supervisor_pid_and_the_worker_keeps_it(monkeypatch):
    # the worker once popped the variable from its own os.environ (process state changed by a
    # library function), so that its tasks would not see it
    from substrax.compute._runner import SUPERVISOR_ENV, _task_parent

    monkeypatch.setenv(SUPERVISOR_ENV, "4242")
    assert SUPERVISOR_ENV not in _task_parent()
    assert os.environ[SUPERVISOR_ENV] == "4242"


def test_a_task_whose_job_env_contradicts_its_runtime_blames_the_env_not_the_interpreter(tmp_path):
    """Hostile finding: "could not start '/.../python': env sets JAX_ENABLE_X64='0' ...", as if
    the interpreter were missing. (A spec is refused this way when made; one written by hand
    reaches the worker.)"""
    valid = _spec(_task("t", "print(1)"), _task("after", "print(2)"), runtime={"enable_x64": True})
    spec = valid.model_copy(update={"env": {"JAX_ENABLE_X64": "0"}})  # past the spec's checks
    manifest = run_job(spec, project=tmp_path, outputs=tmp_path / "o", echo=False)
    assert [(t.status, t.returncode) for t in manifest.tasks] == [("failed", None)] * 2
    reason = (tmp_path / "o" / "t" / STDERR_LOG).read_text()
    assert reason.startswith("task 't' not started: the job's env conflicts with its settings: ")
    assert "env sets JAX_ENABLE_X64='0'" in reason
    assert "enable_x64) sets it to 'true'" in reason
    assert "could not start" not in reason
    assert sys.executable not in reason


def _ignores_sigterm(pid):
    """Whether process ``pid`` ignores SIGTERM (Linux's /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & 1 << (signal.SIGTERM - 1))
    return False


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("signals", [["cancel"], ["stop", "cancel"], ["cancel", "stop"]])
def test_a_cancel_between_a_tasks_start_and_its_record_still_ends_it(
    tmp_path, monkeypatch, signals
):
    """A flaky multi-node cancel: the worker's SIGTERM handler ran after ``Popen`` returned but
    before the runner held the process, found none to kill, and the task ran on (300 s) in its
    own session after the worker was killed. A cancel, like a stop, gives the task SIGTERM
    and the grace before SIGKILL (a hostile finding: it was SIGKILL at once)."""
    from substrax.compute import _runner

    runners = []
    real_popen = subprocess.Popen

    def popen_then_signals(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        deadline = time.monotonic() + 30
        while not _ignores_sigterm(process.pid):  # else a stop's SIGTERM ends it at start
            assert time.monotonic() < deadline, "the task never ignored SIGTERM"
            time.sleep(0.01)
        for name in signals:  # as the handlers would, with no current task yet
            getattr(runners[0], name)()
        return process

    monkeypatch.setattr(_runner.subprocess, "Popen", popen_then_signals)
    ignores_stops = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    )
    spec = _spec(_task("sleeper", ignores_stops, timeout=300), timeout=300, stop_grace_seconds=2)
    start = time.monotonic()
    manifest = run_job(
        spec, project=tmp_path, outputs=tmp_path / "o", echo=False, runner_hook=runners.append
    )
    assert time.monotonic() - start < 60
    assert [t.status for t in manifest.tasks] == [TaskStatus.CANCELLED]


# The job runs in a child that is its orphans' subreaper and never reaps them, as a container
# whose PID 1 is no init: the task's child, SIGTERMed at the task's end, stays a zombie member
# of the task's group. With a grace of 60 s, the run must not wait it out.
NEVER_REAPED = """
import ctypes, json, sys, time
from substrax.compute import JobSpec, Task, run_job
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print('left a child', flush=True)"
task = Task(name="leaves", argv=(sys.executable, "-c", code), timeout_seconds=30)
spec = JobSpec(name="w", tasks=(task,), timeout_seconds=60, probe_devices=False, stop_grace_seconds=60)
started = time.monotonic()
manifest = run_job(spec, project=sys.argv[1], outputs=sys.argv[1] + "/o", echo=False)
print(json.dumps({"status": manifest.tasks[0].status.value, "seconds": time.monotonic() - started}))
"""


@pytest.mark.usefixtures("child_processes")
def test_a_left_child_that_nobody_reaps_does_not_hold_the_task_for_the_stop_grace(tmp_path):
    # it held it: the leftover's group still answered os.killpg(pgid, 0) as a zombie
    outcome = run_python(NEVER_REAPED, str(tmp_path), timeout=120).check().last_json()
    assert outcome["status"] == "succeeded"
    assert outcome["seconds"] < 30, outcome  # not the 60 s grace
