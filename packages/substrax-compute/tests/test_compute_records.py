"""The records compute writes for itself (run handles, manifests), read strictly without pydantic."""

import dataclasses
import json
from datetime import UTC, datetime

import pytest

from substrax.compute import (
    JobManifest,
    RecordFormatError,
    RecordVersionError,
    RunDevices,
    RunHandle,
    RunNotFoundError,
    RunStore,
    TaskOutcome,
    TaskStatus,
    new_run,
    new_run_id,
    read_manifest,
)
from substrax.compute.cli import main


def _manifest() -> JobManifest:
    outcome = TaskOutcome(
        name="t", argv=("python", "t.py"), status=TaskStatus.FAILED, returncode=3, seconds=1.5,
        outputs=("plot.png",),
    )  # fmt: skip
    return JobManifest(
        job="j",
        nodes=2,
        tasks=(outcome,),
        finished=True,
        devices=RunDevices(platform="cpu", kinds=("cpu",), count=8),
        failed_node=1,
        failed_node_status=-9,
    )


def test_a_manifest_round_trips_through_its_file(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(_manifest().to_dict()))
    assert read_manifest(path) == _manifest()
    assert json.loads(path.read_text())["tasks"][0]["status"] == "failed"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"colour": "red"}, "unknown field(s) 'colour'"),
        ({"finished": 1}, "field 'finished' is int 1, not bool"),
        ({"node": True}, "field 'node' is bool True, not int"),
        ({"job": None}, "field 'job' is NoneType None, not str"),
        ({"tasks": [{"name": "t"}]}, "missing field(s) 'argv', 'returncode', 'seconds', 'status'"),
        (
            {"devices": {"platform": "cpu", "kinds": "cpu", "count": 1}},
            "field 'kinds' is str 'cpu', not list",
        ),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_field(tmp_path, change, says):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({**_manifest().to_dict(), **change}))
    with pytest.raises(RecordFormatError) as caught:
        read_manifest(path)
    assert says in str(caught.value)
    assert caught.value.source == path
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, TypeError)


def test_a_manifest_of_another_version_or_not_an_object_is_refused(tmp_path):
    with pytest.raises(RecordVersionError) as caught:
        read_manifest({**_manifest().to_dict(), "schema_version": 3})
    assert (caught.value.found, caught.value.expected) == (3, 4)
    path = tmp_path / "manifest.json"
    path.write_text("[1, 2]")
    with pytest.raises(RecordFormatError, match="holds list, not an object"):
        read_manifest(path)


@pytest.mark.parametrize("run_id", ["../../escape", "a/b", "", ".hidden", "a\\b"])
def test_a_run_id_that_is_no_file_name_is_refused_and_nothing_is_written(tmp_path, run_id):
    handle = RunHandle.from_json(_HANDLE)
    store = RunStore(tmp_path / "runs")
    with pytest.raises(ValueError, match="must name one file"):
        store.save(dataclasses.replace(handle, run_id=run_id))
    assert not any(tmp_path.rglob("*.json"))  # ../../escape.json was written outside the store


def test_a_backend_written_for_0_1_22_makes_its_handle_without_settings(tmp_path):
    from substrax.compute import JobSpec, Task

    task = Task(name="t", argv=("python", "t.py"), timeout_seconds=60)
    spec = JobSpec(name="demo", tasks=(task,), timeout_seconds=60)
    run = new_run(spec, tmp_path)
    handle = run.handle("mine", {"pid": "42"})  # 0.1.22's NewRun.handle(backend, details)
    assert (handle.backend, handle.details, handle.settings) == ("mine", {"pid": "42"}, {})
    assert RunHandle.from_json(handle.to_json()) == handle


@pytest.mark.parametrize("job", ["a/b", "", "..", 3])
def test_a_new_run_id_needs_a_job_that_names_a_file(job):
    with pytest.raises(ValueError, match=r"job=.* must name one file"):
        new_run_id(job)


_HANDLE = json.dumps(
    {
        "schema_version": 2,
        "run_id": "j-20260101T000000Z-abcdef",
        "backend": "local",
        "job": "j",
        "project": "/p",
        "submitted_at": "2026-01-01T00:00:00Z",
        "details": {},
        "settings": {},
    }
)


def test_a_handle_written_by_pydantic_before_still_reads(tmp_path):
    text = json.dumps(
        {
            "schema_version": 2,
            "run_id": "j-20260101T000000Z-abcdef",
            "backend": "local",
            "job": "j",
            "project": "/p",
            "submitted_at": "2026-01-01T00:00:00.123456Z",
            "details": {"pid": "1"},
            "settings": {"state_dir": "/s", "mounts": {"d": "/data"}},
        }
    )
    handle = RunHandle.from_json(text)
    assert handle.submitted_at == datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    assert handle.settings == {"state_dir": "/s", "mounts": {"d": "/data"}}
    assert RunHandle.from_json(handle.to_json()) == handle


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ('{"schema_version": 1}', "missing field(s)"),
        (
            '{"schema_version": 2, "run_id": "a", "backend": "local", "job": "j", "project": "/p",'
            ' "submitted_at": "yesterday"}',
            "submitted_at 'yesterday' is not an ISO time",
        ),
        (
            '{"schema_version": 2, "run_id": "a", "backend": "local", "job": "j", "project": "/p",'
            ' "submitted_at": "2026-01-01T00:00:00Z", "details": {"pid": 1}}',
            "field 'details' is {'pid': 1}, not an object of strings",
        ),
    ],
)
def test_a_malformed_handle_is_refused(text, says):
    with pytest.raises(RecordFormatError) as caught:
        RunHandle.from_json(text, source="h.json")
    assert says in str(caught.value)


def test_a_corrupted_handle_file_makes_status_of_it_exit_2_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SUBSTRAX_STATE_DIR", str(tmp_path))
    store = RunStore()
    store.root.mkdir(parents=True)
    (store.root / "j-1.json").write_text('{"schema_version": 2')
    assert main(["status", "j-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"substrax-compute: error: run record {store.root / 'j-1.json'} can't be used: not JSON"
    ), err
    assert err.endswith("; remove it\n"), err
    assert main(["status"]) == 0  # the others are still shown; this one is skipped with a warning
    assert capsys.readouterr().err.startswith(
        f"substrax-compute: warning: skipped run record {store.root / 'j-1.json'} "
    )
    with pytest.raises(RecordFormatError, match="not JSON"):  # still a RecordFormatError
        store.handles()
    with pytest.raises(RunNotFoundError) as caught:
        store.load("j-2")
    assert (caught.value.run_id, caught.value.root) == ("j-2", store.root)


def test_output_lost_from_a_tasks_logs_round_trips_and_is_written_only_when_lost(tmp_path):
    lost = dataclasses.replace(
        _manifest().tasks[0],
        lost_log_bytes=4096,
        lost_log_reason="writing stdout.log failed: [Errno 28] No space left on device",
    )
    manifest = dataclasses.replace(_manifest(), tasks=(lost, _manifest().tasks[0]))
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest.to_dict()))
    assert read_manifest(path) == manifest
    first, second = json.loads(path.read_text())["tasks"]
    assert first["lost_log_bytes"] == 4096
    assert "lost_log_bytes" not in second  # what an older release reads
    assert "lost_log_reason" not in second


def _report_of(tmp_path, manifest, capsys, state="failed"):
    from substrax.compute import RunState
    from substrax.compute._report import report

    fetched = tmp_path / "fetched"
    fetched.mkdir(exist_ok=True)
    (fetched / "manifest.json").write_text(json.dumps(manifest.to_dict()))
    report(RunHandle.from_json(_HANDLE), RunState(state), fetched, as_json=False)
    text = capsys.readouterr().out
    report(RunHandle.from_json(_HANDLE), RunState(state), fetched, as_json=True)
    return fetched, text, json.loads(capsys.readouterr().out)


def test_the_report_says_how_much_output_a_task_lost_and_why(tmp_path, capsys):
    """Hostile finding: a full disk under a task's log went unreported."""
    task = dataclasses.replace(
        _manifest().tasks[0], lost_log_bytes=4096, lost_log_reason="writing stdout.log failed: x"
    )
    manifest = JobManifest(job="j", tasks=(task,), finished=True)
    _, text, data = _report_of(tmp_path, manifest, capsys)
    assert (
        "Task t lost 4096 bytes of its output, not in its logs: writing stdout.log failed: x"
        in text
    )
    assert (data["tasks"][0]["lost_log_bytes"], data["tasks"][0]["lost_log_reason"]) == (
        4096,
        "writing stdout.log failed: x",
    )


def test_the_report_names_a_dead_worker_and_an_unfinished_job(tmp_path, capsys):
    """Hostile finding: a worker killed with kill -9 gave a failed run with no reason."""
    died = JobManifest(job="j", failed_node=0, failed_node_status=-9)
    fetched, text, _ = _report_of(tmp_path, died, capsys)
    assert (
        "The worker of node 0 ended before the job finished (killed by SIGKILL); its log: "
        f"{fetched / 'worker.log'}"
    ) in text
    unfinished = JobManifest(job="j")
    fetched, text, _ = _report_of(tmp_path, unfinished, capsys)
    assert "The job did not finish and no node's failure was recorded" in text
    _, text, _ = _report_of(tmp_path, unfinished, capsys, state="cancelled")
    assert "did not finish" not in text
