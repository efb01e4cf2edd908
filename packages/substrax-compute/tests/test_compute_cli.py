"""substrax-compute: run, status, logs, fetch, cancel and list; exit codes 0, 1 and 2."""

import errno
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from substrax.compute import RunStore
from substrax.compute.cli import main


JOBS = """\
[tool.substrax.compute.jobs.ok]
commands = { writes = ["python", "writes.py"] }
timeout_seconds = 60
probe_devices = false

[tool.substrax.compute.jobs.bad]
commands = { fails = ["python", "-c", "raise SystemExit(4)"], writes = ["python", "writes.py"] }
timeout_seconds = 60
probe_devices = false

[tool.substrax.compute.jobs.race]
commands = { t = ["python", "-c", "import os, sys, time; r = int(os.environ['JAX_PROCESS_ID']); time.sleep(r / 2); sys.exit(4 * r)"] }
timeout_seconds = 60
probe_devices = false
nodes = 2

[tool.substrax.compute.jobs.slow]
commands = { sleeps = ["python", "-c", "import time; print('sleeping now', flush=True); time.sleep(600)"] }
timeout_seconds = 600
probe_devices = false
"""

WRITES = """\
import os, pathlib
print("hello from the task", flush=True)
(pathlib.Path(os.environ["AVITAI_OUTPUT_DIR"]) / "value.txt").write_text("42")
"""


@pytest.fixture
def project(local_project):
    return local_project(JOBS, {"writes.py": WRITES})


def _run_id(out):
    return re.search(r"Submitted (\S+) to local\.", out).group(1)


def _edit_pyproject(project, old, new):
    """Replace ``old``, which must be there, with ``new`` in the project's pyproject.toml."""
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text()
    assert old in text, old
    pyproject.write_text(text.replace(old, new))
    return pyproject


def _refused(capsys, argv, status=2):
    """Run the command line on ``argv``, which must exit ``status`` and print nothing; its stderr."""
    assert main(argv) == status, argv
    captured = capsys.readouterr()
    assert status == 2 or captured.out == "", captured.out
    return captured.err


def _python(project, *args):
    """``python ARGS`` in a fresh interpreter in ``project``, with this test's environment."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=os.environ,
        cwd=project,
    )


def test_run_follows_fetches_outside_the_project_and_exits_0(project, tmp_path, capsys):
    assert main(["run", "ok"]) == 0
    out = capsys.readouterr().out
    run_id = _run_id(out)
    assert "[writes] hello from the task" in out
    fetched = tmp_path / "state" / "compute" / "fetched" / run_id
    assert f"{run_id} succeeded; outputs in {fetched}" in out
    assert (fetched / "writes" / "value.txt").read_text() == "42"
    assert re.search(r"writes\s+succeeded\s+\S+s\s+value.txt", out)
    assert not any(p.name == run_id for p in project.rglob("*")), "outputs landed in the project"


def test_run_of_a_failing_job_exits_1_and_runs_the_next_task(project, capsys):
    assert main(["run", "bad", "--into", str(project.parent / "mine")]) == 1
    out = capsys.readouterr().out
    run_id = _run_id(out)
    manifest = json.loads((project.parent / "mine" / run_id / "manifest.json").read_text())
    assert [(t["name"], t["status"], t["returncode"]) for t in manifest["tasks"]] == [
        ("fails", "failed", 4),
        ("writes", "succeeded", 0),
    ]
    assert f"{run_id} failed" in out
    assert main(["status", run_id]) == 1
    captured = capsys.readouterr()
    assert re.search(rf"{run_id}\s+local\s+bad\s+failed", captured.out)
    assert captured.err == (
        f"substrax-compute: error: run {run_id} failed; `substrax-compute logs {run_id}` shows why\n"
    )


def test_run_of_a_multi_node_job_names_the_node_that_failed(project, capsys):
    assert main(["run", "race", "--into", str(project.parent / "mine")]) == 1
    out = capsys.readouterr().out
    fetched = project.parent / "mine" / _run_id(out)
    assert (
        f"Node 1 of 2 failed first (exit status 1); the other nodes were stopped. Its logs: {fetched / 'nodes' / '1'}"
        in out
    )
    manifest = json.loads((fetched / "manifest.json").read_text())
    assert (manifest["failed_node"], manifest["failed_node_status"]) == (1, 1)


def test_detached_run_then_status_logs_fetch_list(project, tmp_path, capsys):
    assert main(["run", "ok", "--detach", "--accelerator", "H100:8"]) == 0
    run_id = _run_id(capsys.readouterr().out)
    handle = RunStore().load(run_id)
    spec = json.loads((Path(handle.details["run_dir"]) / "spec.json").read_text())
    assert spec["resources"]["accelerator"] == {"kind": "H100", "count": 8}
    assert main(["logs", run_id, "--follow"]) == 0
    assert "[writes] hello from the task" in capsys.readouterr().out
    assert main(["status", run_id]) == 0
    assert re.search(rf"{run_id}\s+local\s+ok\s+succeeded", capsys.readouterr().out)
    assert main(["logs", run_id]) == 0
    assert "[substrax] job ok succeeded" in capsys.readouterr().out
    assert main(["fetch", run_id, "--into", str(tmp_path / "here")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "here" / run_id)
    assert main(["list"]) == 0
    assert run_id in capsys.readouterr().out
    assert main(["status"]) == 0
    assert run_id in capsys.readouterr().out


def test_stored_run_uses_the_settings_it_was_submitted_with(project, tmp_path, capsys):
    assert main(["run", "ok", "--detach"]) == 0
    run_id = _run_id(capsys.readouterr().out)
    _edit_pyproject(project, "local-state", "moved-state")
    assert main(["logs", run_id, "--follow"]) == 0
    assert main(["status", run_id]) == 0
    assert "succeeded" in capsys.readouterr().out


def test_cancel(project, capsys):
    assert main(["run", "slow", "--detach"]) == 0
    run_id = _run_id(capsys.readouterr().out)
    handle = RunStore().load(run_id)
    log = Path(handle.details["run_dir"]) / "worker.log"
    import time

    deadline = time.monotonic() + 60
    while (
        "sleeping now" not in (log.read_text() if log.exists() else "")
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert main(["cancel", run_id]) == 0
    assert f"{run_id} cancelled" in capsys.readouterr().out
    # A cancelled run's status is a successful query: exit 0, no error line.
    assert main(["status", run_id]) == 0
    captured = capsys.readouterr()
    assert re.search(rf"{run_id}\s+local\s+slow\s+cancelled", captured.out)
    assert captured.err == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["run", "nope"],
            "no job 'nope' in [tool.substrax.compute.jobs]; configured: bad, ok, race, slow",
        ),
        (
            ["run", "ok", "--backend", "nowhere"],
            "no compute backend 'nowhere'; registered: local, modal, skypilot",
        ),
        (["run", "ok", "--accelerator", "H100:x"], "accelerator 'H100:x' must read KIND or KIND:N"),
        (
            ["run", "ok", "--accelerator", "H100:99999999999999999999"],
            "accelerator 'H100:99999999999999999999' must read KIND or KIND:N, KIND of letters, "
            "digits, '.', '_' or '-' and N from 1 to 64",
        ),
        (["run", "ok", "--accelerator", "H100:0"], "accelerator 'H100:0' must read KIND or KIND:N"),
        (["run", "ok", "--accelerator", "H1 00:8"], "accelerator 'H1 00:8' must read KIND"),
        (["run", "ok", "--accelerator", ":8"], "accelerator ':8' must read KIND"),
        (["run", "ok", "--accelerator", ""], "accelerator '' must read KIND"),
        (
            ["run", "ok", "--backend", "modal"],
            "tool.substrax.compute.backends.modal.outputs_volume: is required",
        ),
        (["status", "missing-run"], "no run 'missing-run' in"),
        (["logs", "../x"], "no run '../x' in"),
    ],
)
def test_refusals_exit_2(project, capsys, argv, message):
    err = _refused(capsys, argv)
    assert err.startswith(f"substrax-compute: error: {message}"), err
    assert err.count("\n") == 1, err  # one line, never pydantic's report


def test_no_pyproject_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUBSTRAX_STATE_DIR", str(tmp_path / "state"))
    assert "no pyproject.toml" in _refused(capsys, ["run", "ok"])


def test_a_run_outlives_the_command_that_submitted_it(project, tmp_path):
    from substrax.compute import RunState, load_backend

    child = _python(project, "-m", "substrax.compute.cli", "run", "slow", "--detach")
    assert child.returncode == 0, child.stderr
    run_id = _run_id(child.stdout)
    handle = RunStore().load(run_id)
    backend = load_backend(handle.backend, handle.settings)
    assert backend.status(handle) in {RunState.PENDING, RunState.RUNNING}
    backend.cancel(handle)
    assert backend.status(handle) is RunState.CANCELLED


def test_into_a_file_is_refused_before_anything_is_submitted(project, tmp_path, capsys):
    blocker = tmp_path / "results.txt"
    blocker.write_text("mine")
    for into, says in (
        (blocker, f"--into {blocker} is a file, not a directory"),
        (blocker / "out", f"--into {blocker / 'out'} cannot be a directory: {blocker} is a file"),
    ):
        assert main(["run", "ok", "--into", str(into)]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith(f"substrax-compute: error: {says}; pass a directory"), (
            captured.err
        )
        assert "Submitted" not in captured.out
    assert RunStore().handles() == []
    assert blocker.read_text() == "mine"


def test_a_state_directory_that_is_a_file_is_refused(project, tmp_path, monkeypatch, capsys):
    state = tmp_path / "state-file"
    state.write_text("not a directory")
    monkeypatch.setenv("SUBSTRAX_STATE_DIR", str(state))
    for argv in (["run", "ok"], ["list"], ["status"]):
        err = _refused(capsys, argv)
        assert err == (
            f"substrax-compute: error: the state directory ($SUBSTRAX_STATE_DIR) {state} is a file, "
            "not a directory; point $SUBSTRAX_STATE_DIR at a directory\n"
        )


def test_a_backend_state_dir_under_a_file_is_refused(project, tmp_path, capsys):
    text = (project / "pyproject.toml").read_text()
    blocker = tmp_path / "local-state"
    blocker.write_text("x")
    assert f'state_dir = "{blocker}"' in text
    err = _refused(capsys, ["run", "ok"])
    assert err.startswith(
        f"substrax-compute: error: the local backend's state_dir {blocker} is a file"
    )


def test_malformed_pyproject_exits_2_naming_the_file(project, capsys):
    pyproject = _edit_pyproject(project, 'backend = "local"', "backend = local")
    err = _refused(capsys, ["run", "ok"])
    assert err.startswith(f"substrax-compute: error: {pyproject}:6:11: not valid TOML: "), err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "timeout_seconds = 60\nprobe_devices = false\n\n[tool.substrax.compute.jobs.bad]",
            "timeout_seconds = -1\nprobe_devices = false\n\n[tool.substrax.compute.jobs.bad]",
            "tool.substrax.compute.jobs.ok.timeout_seconds: must be positive and finite, got -1"
            " (in {pyproject})\n",
        ),
        (
            "[tool.substrax.compute.jobs.ok]\n",
            '[tool.substrax.compute.jobs.ok]\nruntime = { platforms = ["gpuu"] }\n',
            "tool.substrax.compute.jobs.ok.runtime.platforms: JaxRuntime.platforms entry 'gpuu'"
            " is not a platform jax knows (use one of: cpu, cuda, gpu, METAL,",
        ),
    ],
)
def test_a_bad_job_exits_2_naming_the_field_and_the_file(project, capsys, old, new, message):
    _edit_pyproject(project, old, new)
    err = _refused(capsys, ["run", "ok"])
    expected = message.format(pyproject=project / "pyproject.toml")
    assert err.startswith(f"substrax-compute: error: {expected}"), err
    assert err.count("\n") == 1


def test_dry_run_on_local_submits_nothing(project, capsys):
    assert main(["run", "ok", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "Job ok on local: 1 task(s): writes" in out
    assert f"The local backend uploads nothing; it runs the job in {project}." in out
    assert RunStore().handles() == []


def test_a_lock_without_substrax_is_refused_naming_the_file_before_submitting(project, capsys):
    lock = project / "uv.lock"
    lock.write_text('version = 1\n[[package]]\nname = "numpy"\nversion = "2.0.0"\n')
    for argv in (["run", "ok"], ["run", "ok", "--dry-run"]):
        err = _refused(capsys, argv)
        assert err == (
            f"substrax-compute: error: substrax-compute is not in {lock}: "
            "`uv add substrax-compute` so the worker can run\n"
        )
    assert RunStore().handles() == []


def test_a_remote_backend_needs_a_uv_lock(project, capsys):
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + '\n[tool.substrax.compute.backends.modal]\noutputs_volume = "v"\n'
    )
    assert _refused(capsys, ["run", "ok", "--backend", "modal", "--dry-run"]) == (
        f"substrax-compute: error: no uv.lock in {project}: run `uv lock` so the job runs what "
        "you tested\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "ok", "--backend", "local", "--accelerator", "H100:8", "--project", ".",
         "--detach", "--into", "out"],
        ["status"],
        ["status", "ok-20260101T000000Z-abc123"],
        ["logs", "ok-20260101T000000Z-abc123", "--follow"],
        ["fetch", "ok-20260101T000000Z-abc123", "--into", "out"],
        ["cancel", "ok-20260101T000000Z-abc123"],
    ],
    ids=["run", "status", "status-run", "logs", "fetch", "cancel"],
)  # fmt: skip
def test_every_0_1_22_command_line_still_parses(argv):
    from substrax.compute._cli import _parser

    assert _parser().parse_args(argv).command == argv[0]


def test_dry_run_on_modal_lists_the_upload_and_holds_back_secrets(project, capsys):
    (project / "uv.lock").write_text(
        '[[package]]\nname = "substrax-compute"\nversion = "0.2.0"\n'
        'source = { registry = "https://pypi.org/simple" }\n'
    )
    (project / ".env").write_text("TOKEN=secret\n")
    (project / "id_ed25519").write_text("key\n")
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + '\n[tool.substrax.compute.backends.modal]\noutputs_volume = "v"\n'
    )
    assert main(["run", "ok", "--backend", "modal", "--dry-run"]) == 0
    out = capsys.readouterr().out
    files = ["pyproject.toml", "uv.lock", "writes.py"]
    total = sum((project / f).stat().st_size for f in files)
    for name in files:
        assert re.search(rf"^\s*[\d.]+ (B|KiB)\s+{re.escape(name)}\s*$", out, re.M), out
    assert "Would upload 3 file(s), " in out
    assert f"({total} bytes) from {project}" in out
    assert "Held back as secrets: .env, id_ed25519 (name one in the job's include_files" in out
    assert "Dry run: nothing was submitted." in out
    assert RunStore().handles() == []


def test_json_output_of_status_list_and_a_dry_run(project, capsys):
    assert main(["run", "ok", "--detach", "--json"]) == 0
    captured = capsys.readouterr()
    submitted = json.loads(captured.out)
    run_id = submitted["run"]
    assert submitted == {"run": run_id, "backend": "local", "job": "ok"}
    assert f"Submitted {run_id} to local." in captured.err
    assert main(["logs", run_id, "--follow"]) == 0
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"run": run_id, "backend": "local", "job": "ok", "state": "succeeded"}
    ]
    assert main(["list", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["run"], listed["job"]) == (run_id, "ok")
    assert listed["submitted_at"].startswith(RunStore().load(run_id).submitted_at.isoformat()[:19])
    assert main(["run", "ok", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "job": "ok",
        "backend": "local",
        "tasks": ["writes"],
        "submitted": False,
        "upload": None,
    }


def test_run_with_json_prints_the_report_as_json_and_the_log_on_stderr(project, capsys):
    assert main(["run", "bad", "--json", "--into", str(project.parent / "mine")]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["state"] == "failed"
    assert [(t["task"], t["status"], t["returncode"]) for t in report["tasks"]] == [
        ("fails", "failed", 4),
        ("writes", "succeeded", 0),
    ]
    assert "[writes] hello from the task" in captured.err


def test_status_reads_runs_without_importing_pydantic(project):
    assert main(["run", "ok"]) == 0
    code = (
        "import sys; from substrax.compute.cli import main; code = main(['status']); "
        "heavy = [m for m in ('pydantic', 'pathspec', 'jax') if m in sys.modules]; "
        "print(heavy, file=sys.stderr); sys.exit(code or bool(heavy))"
    )
    child = _python(project, "-c", code)
    assert child.returncode == 0, child.stderr
    assert re.search(r"\s+local\s+ok\s+succeeded", child.stdout), child.stdout
    assert child.stderr.strip() == "[]"


def test_bad_arguments_exit_2_with_the_error_line(project, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--no-such-flag"])
    assert exited.value.code == 2
    assert "substrax-compute: error: " in capsys.readouterr().err
    assert _refused(capsys, ["cancel", "no-such-run"]).startswith(
        "substrax-compute: error: no run 'no-such-run' in "
    )


def test_a_huge_node_count_is_refused_with_one_line(project, capsys):
    _edit_pyproject(
        project,
        "probe_devices = false\nnodes = 2\n",
        "probe_devices = false\nnodes = 99999999999999999999\n",
    )
    for argv in (["run", "race", "--dry-run"], ["run", "race"]):
        err = _refused(capsys, argv)
        assert err == (
            "substrax-compute: error: tool.substrax.compute.jobs.race.nodes: must be between 1 "
            f"and 1024, got 99999999999999999999 (in {project / 'pyproject.toml'})\n"
        )
    assert RunStore().handles() == []


def _finished_run(capsys, job="ok"):
    (run_id,) = _finished_runs(capsys, 1, job)
    return run_id


def _finished_runs(capsys, count, job="ok"):
    """``count`` runs of ``job``, submitted together, once each has finished."""
    run_ids = []
    for _ in range(count):
        assert main(["run", job, "--detach"]) == 0
        run_ids.append(_run_id(capsys.readouterr().out))
    for run_id in run_ids:
        assert main(["logs", run_id, "--follow"]) == 0
    capsys.readouterr()
    return run_ids


def test_damaged_run_records_are_skipped_and_reported_once(project, capsys):
    run_id = _finished_run(capsys)
    store = RunStore()
    truncated = store.root / "trunc-1.json"
    truncated.write_text('{"run_id": ')
    directory = store.root / "dir-1.json"
    directory.mkdir()
    unknown = store.root / "nosuch-1.json"
    good = store.load(run_id)
    unknown.write_text(
        good.to_json()
        .replace('"backend": "local"', '"backend": "nosuch"')
        .replace(run_id, "nosuch-1")
    )
    for argv in (["list"], ["list", "--json"], ["status"], ["status", "--json"]):
        assert main(argv) == 0, argv
        captured = capsys.readouterr()
        if "--json" in argv:
            assert [row["run"] for row in json.loads(captured.out)] == [run_id]
        else:
            assert run_id in captured.out
        lines = captured.err.splitlines()
        assert len(lines) == 3, captured.err
        for path in (truncated, directory):
            assert (
                sum(
                    line.startswith(f"substrax-compute: warning: skipped run record {path} ")
                    for line in lines
                )
                == 1
            ), captured.err
        assert sum(str(unknown) in line and "'nosuch'" in line for line in lines) == 1
        assert all(line.endswith("remove it") for line in lines), captured.err
    for name, path, says in (
        ("trunc-1", truncated, "not JSON"),
        ("dir-1", directory, "it is a directory, not a run record"),
        ("nosuch-1", unknown, "its backend 'nosuch' can't be loaded"),
    ):
        for command in ("status", "logs", "fetch", "cancel"):
            assert main([command, name]) == 2, (command, name)
            err = capsys.readouterr().err
            assert err.startswith(
                f"substrax-compute: error: run record {path} can't be used: {says}"
            ), err
            assert err.endswith("remove it\n"), err
            assert err.count("\n") == 1, err


def test_logs_and_fetch_of_a_run_whose_directory_is_gone_exit_1_naming_it(
    project, tmp_path, capsys
):
    import shutil

    run_id = _finished_run(capsys)
    run_dir = Path(RunStore().load(run_id).details["run_dir"])
    shutil.rmtree(run_dir)
    into = tmp_path / "here"
    for argv in (
        ["logs", run_id],
        ["logs", run_id, "--follow"],
        ["fetch", run_id, "--into", str(into)],
    ):
        assert _refused(capsys, argv, status=1) == (
            f"substrax-compute: error: run {run_id}'s directory {run_dir} is gone, so its logs and "
            "outputs can't be read; the run's record stays in `substrax-compute list` until you remove it\n"
        )
    assert not (into / run_id).exists()


def test_fetch_of_an_ended_run_whose_outputs_are_gone_exits_1_naming_them(
    project, tmp_path, capsys
):
    """Hostile finding: it exited 0 with the worker log alone, and no word of the outputs."""
    import shutil

    run_id = _finished_run(capsys)
    outputs = Path(RunStore().load(run_id).details["run_dir"]) / "outputs"
    shutil.rmtree(outputs)
    into = tmp_path / "here"
    error = _refused(capsys, ["fetch", run_id, "--into", str(into)], status=1)
    assert error.startswith(f"substrax-compute: error: run {run_id}'s directory {outputs} is gone")
    assert not (into / run_id).exists()


def test_an_unreadable_runs_directory_exits_1_naming_it(project, tmp_path, capsys):
    runs = tmp_path / "state" / "compute" / "runs"
    runs.parent.mkdir(parents=True)
    runs.write_text("not a directory")
    for argv in (["status"], ["list"], ["list", "--json"]):
        assert _refused(capsys, argv, status=1) == (
            f"substrax-compute: error: cannot read the runs directory {runs}: it is not a directory; "
            "make it a directory this user can read, or move it away\n"
        )


def test_fetch_replaces_files_whole_never_in_place(project, tmp_path, capsys):
    run_id = _finished_run(capsys)
    into = tmp_path / "here"
    assert main(["fetch", run_id, "--into", str(into)]) == 0
    manifest = into / run_id / "manifest.json"
    fresh = manifest.read_text()
    manifest.write_text("old")
    held = tmp_path / "held.json"
    held.hardlink_to(manifest)  # a reader holding the old file, as a kill -9 mid-copy would leave
    assert main(["fetch", run_id, "--into", str(into)]) == 0
    assert manifest.read_text() == fresh
    assert held.read_text() == "old", "the manifest was rewritten in place"
    assert not [p for p in (into / run_id).rglob("*") if p.name.endswith(".tmp")]


def test_status_skips_a_run_whose_backend_sdk_is_missing(project, tmp_path, capsys):
    from datetime import UTC, datetime

    from substrax.compute import RunHandle

    run_id = _finished_run(capsys)
    modal_run = RunHandle(
        run_id="m-1",
        backend="modal",
        job="ok",
        project=str(project),
        submitted_at=datetime.now(UTC),
        details={"call_id": "fc-none"},
        settings={"outputs_volume": "v", "state_dir": str(tmp_path / "modal-state")},
    )
    RunStore().save(modal_run)
    broken = tmp_path / "no-sdk" / "modal"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('modal is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": str(broken.parent)}

    def cli(*argv):
        return subprocess.run(
            [sys.executable, "-m", "substrax.compute.cli", *argv],
            capture_output=True, text=True, timeout=60, check=False, env=env, cwd=project,
        )  # fmt: skip

    every = cli("status")
    assert every.returncode == 0, every.stderr
    assert run_id in every.stdout
    assert "m-1" not in every.stdout
    record = RunStore().root / "m-1.json"
    assert every.stderr.startswith(
        f"substrax-compute: warning: skipped run record {record} can't be used: its backend 'modal'"
    ), every.stderr
    assert every.stderr.endswith("; install that, or remove it\n"), every.stderr
    assert every.stderr.count("\n") == 1
    one = cli("status", "m-1")
    assert one.returncode == 2, one.stderr
    assert one.stderr.startswith(f"substrax-compute: error: run record {record} can't be used"), (
        one.stderr
    )
    assert one.stderr.count("\n") == 1


def test_ctrl_c_while_run_follows_cancels_the_run_and_exits_130_with_one_line(project):
    from substrax.compute import RunState, load_backend

    command = subprocess.Popen(
        [sys.executable, "-m", "substrax.compute", "run", "slow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ,
        cwd=project,
    )
    try:
        lines = []
        for line in command.stdout:  # the run's followed log, as the user sees it
            lines.append(line)
            if "sleeping now" in line:
                break
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=60)
    finally:
        command.kill()
    assert command.returncode == 130, err
    assert err == "substrax-compute: interrupted\n"  # no traceback
    run_id = _run_id("".join(lines))
    assert f"Interrupted: cancelling {run_id}" in out
    handle = RunStore().load(run_id)
    assert load_backend(handle.backend, handle.settings).status(handle) is RunState.CANCELLED


def test_a_damaged_manifest_fails_its_run_s_status_naming_it_and_the_others_are_listed(
    project, capsys
):
    damaged, good = _finished_runs(capsys, 2)
    handle = RunStore().load(damaged)
    manifest = Path(handle.details["run_dir"]) / "outputs" / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])  # cut short
    assert main(["status", damaged]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"substrax-compute: error: {manifest}: is not JSON (")
    assert err.endswith(  # it read "cut short, or; it was not written" (a hostile finding)
        "); it is damaged or cut short, or was not written by this substrax-compute release\n"
    )
    assert err.count("\n") == 1, err
    assert main(["status"]) == 0
    captured = capsys.readouterr()
    assert good in captured.out
    assert damaged not in captured.out
    assert captured.err.startswith(f"substrax-compute: warning: skipped run {damaged}: {manifest}")


def test_a_manifest_that_is_no_manifest_is_refused_by_status_and_fetch_naming_it(
    project, capsys, tmp_path
):
    """Hostile finding: '{"x":1}' gave "manifest version None is not 4: fetch it with the
    substrax release that ran it", naming no file; `fetch` took it, `status` refused it."""
    (run_id,) = _finished_runs(capsys, 1)
    handle = RunStore().load(run_id)
    manifest = Path(handle.details["run_dir"]) / "outputs" / "manifest.json"
    manifest.write_text('{"x": 1}')
    why = (
        ": is no run manifest (it has no schema_version); it is damaged or another file, or was "
        "not written by this substrax-compute release\n"
    )
    assert main(["status", run_id]) == 2
    assert capsys.readouterr().err == f"substrax-compute: error: {manifest}{why}"
    assert main(["fetch", run_id, "--into", str(tmp_path / "f")]) == 2
    fetched = tmp_path / "f" / run_id
    captured = capsys.readouterr()
    assert captured.out == f"{fetched}\n"  # the files are fetched all the same
    assert captured.err == f"substrax-compute: error: {fetched / 'manifest.json'}{why}"


def test_a_run_whose_backend_does_not_answer_is_listed_as_unknown_and_the_others_read(
    project, capsys, monkeypatch
):
    # one run whose backend could not be asked stopped the whole listing
    from substrax.compute._errors import BackendRequestError
    from substrax.compute._local import LocalBackend

    silent, good = _finished_runs(capsys, 2)
    status = LocalBackend.status

    def answer(self, handle):
        if handle.run_id == silent:
            raise BackendRequestError("local", f"read the state of run {silent}", "timed out")
        return status(self, handle)

    monkeypatch.setattr(LocalBackend, "status", answer)
    assert main(["status"]) == 0
    captured = capsys.readouterr()
    rows = {line.split()[0]: line.split()[-1] for line in captured.out.splitlines()[2:]}
    assert rows[silent] == "unknown"
    assert rows[good] == "succeeded"
    assert captured.err == (
        f"substrax-compute: warning: the local backend could not read the state of run {silent}: "
        "timed out\n"
    )
    assert main(["status", silent]) == 1  # asked for that run: its error, on one line
    assert capsys.readouterr().err.count("\n") == 1


def test_a_relative_state_dir_is_the_project_s_and_its_run_is_found_from_anywhere(
    project, capsys, monkeypatch, tmp_path
):
    # it was taken from the working directory, and recorded as given: `status` run from another
    # directory looked for the run somewhere else
    _edit_pyproject(project, f'state_dir = "{tmp_path / "local-state"}"', 'state_dir = "mine"')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["run", "ok", "--project", str(project)]) == 0
    run_id = _run_id(capsys.readouterr().out)
    assert (project / "mine" / "runs").is_dir()
    assert not (elsewhere / "mine").exists()
    monkeypatch.chdir(tmp_path)
    assert RunStore().load(run_id).settings["state_dir"] == str(project / "mine")
    assert main(["status", run_id]) == 0
    assert "succeeded" in capsys.readouterr().out


def test_a_backend_that_records_no_settings_gets_the_configured_ones_for_later_commands(
    project, capsys, monkeypatch, tmp_path
):
    """A backend written for 0.1.22 calls ``NewRun.handle(backend, details)``: its handle held no
    settings, so ``status`` rebuilt it without its state_dir and looked for the run elsewhere."""
    import dataclasses

    from substrax.compute import LocalBackend

    submit = LocalBackend.submit

    def as_0_1_22(self, spec, *, project):
        return dataclasses.replace(submit(self, spec, project=project), settings={})

    monkeypatch.setattr(LocalBackend, "submit", as_0_1_22)
    _edit_pyproject(project, f'state_dir = "{tmp_path / "local-state"}"', 'state_dir = "mine"')
    assert main(["run", "ok", "--project", str(project)]) == 0
    run_id = _run_id(capsys.readouterr().out)
    assert RunStore().load(run_id).settings["state_dir"] == str(project / "mine")
    assert main(["status", run_id]) == 0
    assert "succeeded" in capsys.readouterr().out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_while_run_follows_cancels_the_run_as_ctrl_c_does(project, sig):
    """Hostile finding: SIGTERM (a CI timeout) or SIGHUP killed the command with no message and
    left the job running."""
    from substrax.compute import RunState, load_backend

    command = subprocess.Popen(
        [sys.executable, "-m", "substrax.compute", "run", "slow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ, cwd=project,
    )  # fmt: skip
    try:
        lines = []
        for line in command.stdout:
            lines.append(line)
            if "sleeping now" in line:
                break
        command.send_signal(sig)
        out, err = command.communicate(timeout=60)
    finally:
        command.kill()
    assert command.returncode == 128 + sig, err
    assert err == f"substrax-compute: interrupted by {sig.name}\n"  # no traceback
    run_id = _run_id("".join(lines))
    assert f"Interrupted: cancelling {run_id}" in out
    handle = RunStore().load(run_id)
    assert load_backend(handle.backend, handle.settings).status(handle) is RunState.CANCELLED


def test_an_empty_backend_is_refused_naming_it(project, capsys):
    """Hostile finding: `--backend ""` silently ran on the configured backend."""
    for empty in ("", " "):
        err = _refused(capsys, ["run", "ok", "--backend", empty])
        assert err == (
            f"substrax-compute: error: --backend {empty!r} is empty; name a registered backend "
            "(local, modal, skypilot, or one of yours), or leave --backend out for the configured one\n"
        )
    assert RunStore().handles() == []


def test_into_a_directory_that_cannot_be_written_is_refused_before_submitting(
    project, tmp_path, capsys, monkeypatch
):
    """Hostile finding: a read-only --into was found only after the run, whose success then
    exited 1 with a bare errno line."""
    read_only = tmp_path / "ro"
    read_only.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: Path(path) != read_only and real_access(path, mode)
    )  # as on a read-only mount (root may write anywhere else)
    for into, says in (
        (read_only, f"--into {read_only} is not writable by this user"),
        (
            read_only / "out",
            f"--into {read_only / 'out'} can't be made: {read_only} is not writable",
        ),
    ):
        err = _refused(capsys, ["run", "ok", "--into", str(into)])
        assert err.startswith(f"substrax-compute: error: {says}"), err
        assert err.endswith("; pass a directory you can write to\n"), err
        assert err.count("\n") == 1
    assert RunStore().handles() == []


def test_run_under_a_c_locale_keeps_and_shows_non_ascii_output(project):
    """Hostile finding: under LC_ALL=C a task's non-ASCII output stopped its log quietly: an
    empty stdout.log on a run reported succeeded."""
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + "\n[tool.substrax.compute.jobs.accents]\n"
        'commands = { t = ["python", "accents.py"] }\ntimeout_seconds = 60\nprobe_devices = false\n'
    )
    (project / "accents.py").write_text(
        "import sys; sys.stdout.buffer.write(b'caf\\xc3\\xa9 \\xff\\n' * 5000)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_")}
    child = subprocess.run(
        [sys.executable, "-m", "substrax.compute", "run", "accents", "--into", "out"],
        capture_output=True, timeout=120, check=False, cwd=project,
        env={**env, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""},
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    assert child.stdout.count(b"[t] caf? ?\n") == 5000  # what an ASCII console can show
    (log,) = (project / "out").glob("*/t/stdout.log")
    assert log.read_text(encoding="utf-8") == "caf\u00e9 \ufffd\n" * 5000


CHATTY = """
[tool.substrax.compute.jobs.chatty]
commands = { talks = ["python", "-c", "import time\\nfor i in range(6000): print('line', i, flush=True); time.sleep(0.1)"] }
timeout_seconds = 600
probe_devices = false
"""


def _state(handle):
    from substrax.compute import load_backend

    return load_backend(handle.backend, handle.settings).status(handle)


@pytest.mark.parametrize(
    ("stopped_by", "status"),
    [("SIGINT", 130), ("SIGTERM", 143), ("record", 1), ("announce", 141)],
)
def test_a_run_stopped_between_submitting_and_following_is_cancelled(
    project, capsys, monkeypatch, stopped_by, status
):
    """Hostile finding: a failure or Ctrl-C between `submit` and following (a read-only state
    directory, Ctrl-C right after the supervisor started) left a running job nothing cancels:
    `list` did not show it and `cancel` could not name it."""
    from substrax.compute import LocalBackend, RunState

    submitted = []
    submit = LocalBackend.submit

    def submit_then(self, spec, *, project):
        submitted.append(submit(self, spec, project=project))
        if stopped_by.startswith("SIG"):  # as the backend returns: held until it has
            signal.raise_signal(getattr(signal, stopped_by))
        return submitted[-1]

    monkeypatch.setattr(LocalBackend, "submit", submit_then)
    if stopped_by == "record":

        def full_disk(self, handle):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(RunStore, "save", full_disk)
    if stopped_by == "announce":
        monkeypatch.setattr(sys, "stdout", _ClosedAfter(0))
    assert main(["run", "slow"]) == status
    (handle,) = submitted
    assert _state(handle) is RunState.CANCELLED
    err = capsys.readouterr().err
    assert err.count("\n") <= 3, err  # no traceback
    if stopped_by != "record":
        assert RunStore().load(handle.run_id) == handle  # `list` shows it, as cancelled
    else:
        assert err.endswith("substrax-compute: error: [Errno 28] No space left on device\n")


class _ClosedAfter:
    """A stdout whose reader goes away after ``lines`` lines (``| head``): then a broken pipe."""

    encoding = "utf-8"

    def __init__(self, lines):
        self.lines, self.text = lines, ""

    def isatty(self):
        return False

    def write(self, text):
        if self.text.count("\n") >= self.lines:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        self.text += text
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):  # what a write left in a real stdout's buffer fails again
        if self.text.count("\n") >= self.lines:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_a_closed_pipe_while_run_follows_cancels_the_run_and_exits_141(
    project, capsys, monkeypatch
):
    """Hostile finding: `run JOB | head -3` exited 1 ("the run failed") with `error: [Errno 32]
    Broken pipe` and left the run going, unnamed. A closed output is a closed terminal's SIGHUP:
    the run is cancelled, with a line on stderr naming it."""
    from substrax.compute import RunState

    (project / "pyproject.toml").write_text((project / "pyproject.toml").read_text() + CHATTY)
    out = _ClosedAfter(3)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["run", "chatty"]) == 141
    run_id = _run_id(out.text)
    err = capsys.readouterr().err
    assert err == (
        f"substrax-compute: stdout was closed (a broken pipe): cancelling {run_id}, its task has "
        "30 s to save (--detach runs a job apart)\n"
    )
    assert _state(RunStore().load(run_id)) is RunState.CANCELLED


def test_logs_into_a_closed_pipe_stop_quietly_with_141_and_a_closed_stdout_is_one_line(
    project, capsys, monkeypatch
):
    """Hostile finding: `logs RUN | head -2` exited 1 with `error: [Errno 32] Broken pipe`, and
    `status >&-` or `run quick >&-` printed a traceback ('NoneType' object has no attribute
    'write')."""
    run_id = _finished_run(capsys)
    monkeypatch.setattr(sys, "stdout", _ClosedAfter(1))
    assert main(["logs", run_id]) == 141
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys, "stdout", None)
    for argv in (["status"], ["run", "ok"]):
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            "substrax-compute: error: stdout is closed; run it with stdout open (redirect it to a "
            "file, or to /dev/null to discard what it prints)\n"
        )
    assert RunStore().handles() == [RunStore().load(run_id)]  # `run` submitted nothing


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["status", ""], "RUN '' is empty; name a run (`substrax-compute list` shows them)"),
        (["status", " "], "RUN ' ' is empty; name a run"),
        (["logs", ""], "RUN '' is empty; name a run"),
        (["cancel", ""], "RUN '' is empty; name a run"),
        (["run", "ok", "--into", ""], "--into '' is empty; pass a directory you can write to"),
        (["fetch", "x", "--into", ""], "--into '' is empty; pass a directory you can write to"),
        (["run", "ok", "--project", ""], "--project '' is empty; pass the project root"),
    ],
)
def test_an_empty_argument_is_refused_never_taken_as_every_run_or_here(project, capsys, argv, says):
    """Hostile finding: `status ""` listed every run and exited 0 (`status "$RUN" && deploy`
    with RUN unset always passed), `run --into ""` fetched into the project, and `--project ""`
    meant the working directory."""
    if argv[0] == "fetch":
        argv[1] = _finished_run(capsys)
    err = _refused(capsys, argv)
    assert err.startswith(f"substrax-compute: error: {says}"), err
    assert err.count("\n") == 1
    assert all(h.run_id == argv[1] for h in RunStore().handles())  # `run` submitted nothing


@pytest.mark.parametrize("which", ["SUBSTRAX_STATE_DIR", "backend"])
def test_a_state_directory_that_cannot_be_written_is_refused_before_submitting(
    project, tmp_path, capsys, monkeypatch, which
):
    """Hostile finding: a read-only state directory gave a raw `[Errno 30] ...`, exit 1, after
    the run had started (it kept running)."""
    read_only = tmp_path / ("state" if which == "SUBSTRAX_STATE_DIR" else "local-state")
    read_only.mkdir(exist_ok=True)
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: Path(path) != read_only and real_access(path, mode)
    )  # as on a read-only mount (root may write anywhere else)
    err = _refused(capsys, ["run", "ok"])
    if which == "backend":
        assert err == (
            f"substrax-compute: error: the local backend's state_dir {read_only} is not writable "
            "by this user; set [tool.substrax.compute.backends.local] state_dir to a directory "
            "you can write to\n"
        )
    else:
        assert err == (
            f"substrax-compute: error: the state directory ($SUBSTRAX_STATE_DIR) "
            f"{read_only / 'compute'} can't be made: {read_only} is not writable by this user; "
            "point $SUBSTRAX_STATE_DIR at a directory you can write to\n"
        )
    assert not (tmp_path / "local-state" / "runs").exists()  # nothing was started
    assert main(["list"]) == 0  # reading needs no write


def test_a_state_directory_in_the_project_is_not_uploaded(project, capsys, monkeypatch, tmp_path):
    """Hostile finding: with the local state_dir ".substrax-state" in the project, `run --backend
    modal --dry-run` listed every earlier local run's outputs, worker.log, spec.json and
    manifest.json for upload; the same with SUBSTRAX_STATE_DIR=relstate."""
    (project / "uv.lock").write_text(
        '[[package]]\nname = "substrax-compute"\nversion = "0.2.0"\n'
        'source = { registry = "https://pypi.org/simple" }\n'
    )
    pyproject = _edit_pyproject(
        project, f'state_dir = "{tmp_path / "local-state"}"', 'state_dir = ".substrax-state"'
    )
    pyproject.write_text(
        pyproject.read_text() + '\n[tool.substrax.compute.backends.modal]\noutputs_volume = "v"\n'
    )
    monkeypatch.setenv("SUBSTRAX_STATE_DIR", "relstate")
    _finished_run(capsys)
    assert list((project / ".substrax-state" / "runs").iterdir())
    assert (project / "relstate" / "compute" / "runs").is_dir()
    assert main(["run", "ok", "--backend", "modal", "--dry-run", "--json"]) == 0
    files = [f["file"] for f in json.loads(capsys.readouterr().out)["upload"]["files"]]
    assert files == ["pyproject.toml", "uv.lock", "writes.py"]


def test_a_command_with_non_ascii_text_under_a_c_locale_fails_its_task_saying_why(project):
    """Hostile finding: with LC_ALL=C PYTHONUTF8=0 a command holding non-ASCII text crashed the
    worker with a UnicodeEncodeError traceback from Popen; the report had no task rows."""
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + "\n[tool.substrax.compute.jobs.accents]\n"
        'commands = { t = ["python", "-c", "print(\'caf\u00e9\')"], after = ["python", "-c", ""] }\n'
        "timeout_seconds = 60\nprobe_devices = false\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_")}
    child = subprocess.run(
        [sys.executable, "-m", "substrax.compute", "run", "accents", "--into", "out"],
        capture_output=True, text=True, timeout=120, check=False, cwd=project,
        env={**env, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""},
    )  # fmt: skip
    assert child.returncode == 1, child.stderr
    assert "Traceback" not in child.stdout + child.stderr
    assert re.search(r"^t\s+failed\s", child.stdout, re.M), child.stdout
    assert re.search(r"^after\s+succeeded\s", child.stdout, re.M), child.stdout
    why = "\"print('caf?')\" (an argument, an env value or the project's path) has text this"
    assert why in child.stdout
    (log,) = (project / "out").glob("*/t/stderr.log")
    assert "run under a UTF-8 locale (LC_ALL=C.UTF-8) or with PYTHONUTF8=1" in log.read_text()
