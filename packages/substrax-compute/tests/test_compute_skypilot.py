"""The skypilot backend: the real sky.Task built and validated from a job; stand-ins only for
SkyPilot's API calls (launch, queue, cancel)."""

import dataclasses
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from substrax.compute import (
    BackendRequestError,
    ComputeConfigError,
    JobSpec,
    RunState,
    SkyPilotBackend,
    Task,
    read_job_spec,
)
from substrax.compute._skypilot_backend import SPEC_ENV, _sky, run_script


@pytest.fixture(scope="module")
def sky():
    try:
        return _sky()
    except ImportError:
        pytest.skip("SkyPilot (substrax-compute[skypilot]) is not installed")


def _spec(**fields):
    fields.setdefault("timeout_seconds", 1800.0)
    return JobSpec(
        name="train",
        tasks=(Task(name="fit", argv=("python", "fit.py"), timeout_seconds=600),),
        **fields,
    )


def _backend(tmp_path, **settings):
    return SkyPilotBackend(
        {"outputs_bucket": "gs://sx-runs", "state_dir": str(tmp_path / "s"), **settings}
    )


def test_task_carries_the_job(sky, tmp_path, monkeypatch):
    monkeypatch.setenv("SX_TOKEN", "tok-5678")
    spec = _spec(
        extras=("cuda12",),
        resources={"accelerator": {"kind": "A100", "count": 8}, "cpu": 16, "memory_mib": 65536},
        mounts=({"name": "datasets", "path": "/data"},),
        secrets=("SX_TOKEN",),
        nodes=2,
    )
    backend = _backend(tmp_path, buckets={"datasets": "s3://my-data"}, infra="gcp", use_spot=True)
    project = tmp_path / "project"
    project.mkdir()
    run_id = "train-20260101T000000Z-abcdef"
    task = backend.build_task(spec, project=project, run_id=run_id)
    assert isinstance(task, sky.Task)
    assert task.num_nodes == 2
    assert task.workdir == str(backend.upload_dir(run_id))
    (resources,) = task.resources
    assert resources.accelerators == {"A100": 8}
    assert (resources.cpus, resources.memory, resources.use_spot) == ("16+", "64+", True)
    assert str(resources.cloud) == "GCP"
    mounts = {
        path: (storage.source, storage.mode.value) for path, storage in task.storage_mounts.items()
    }
    assert mounts == {"/outputs": ("gs://sx-runs", "MOUNT"), "/data": ("s3://my-data", "MOUNT")}
    assert read_job_spec(json.loads(task.envs[SPEC_ENV])) == spec
    assert "tok-5678" not in json.dumps(task.envs)
    assert task.secrets["SX_TOKEN"].get_secret_value() == "tok-5678"
    assert "uv sync --frozen --extra cuda12" in task.setup
    assert "python -m substrax.compute.worker" in task.run


def _synced(sky, workdir, tmp_path):
    """The files SkyPilot's own upload code puts in its archive of ``workdir``."""
    from sky.data import storage_utils

    archive = tmp_path / "workdir.zip"
    storage_utils.zip_files_and_folders([str(workdir)], archive)
    with zipfile.ZipFile(archive) as opened:
        names = [n for n in opened.namelist() if not n.endswith("/")]
    return sorted(os.path.relpath(f"/{n}", workdir) for n in names)


def test_the_workdir_skypilot_syncs_is_the_upload_set(sky, tmp_path, write_files):
    project = tmp_path / "project"
    write_files(
        project,
        {
            "pyproject.toml": "[project]\nname = 'p'\n",
            "fit.py": "print(1)\n",
            ".gitignore": "data/\n",
            "data/train.csv": "1,2\n",
            ".env": "TOKEN=1\n",
            ".env.prod": "TOKEN=2\n",
            "id_rsa": "key\n",
            ".skyignore": "nothing\n",
            ".substraxignore": "drafts/\n",
            "drafts/a.md": "a\n",
        },
    )
    backend = _backend(tmp_path)
    spec = _spec(include_files=(".env.prod",))
    task = backend.build_task(spec, project=project, run_id="r")
    expected = [
        ".env.prod", ".gitignore", ".skyignore", ".substraxignore", "fit.py", "pyproject.toml",
    ]  # fmt: skip
    assert list(backend.upload_set(spec, project=project).files) == expected
    assert _synced(sky, task.workdir, tmp_path) == [f for f in expected if f != ".skyignore"]
    assert (project / ".skyignore").read_text() == "nothing\n", "the project was changed"


def test_submit_removes_the_staged_workdir_whatever_happens(sky, tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "fit.py").write_text("print(1)\n")
    seen = []

    def launch(task, **_options):
        seen.append(sorted(p.name for p in Path(task.workdir).iterdir()))
        raise ConnectionError("no API server\n here")

    monkeypatch.setattr(sky, "launch", launch)
    backend = _backend(tmp_path)
    with pytest.raises(BackendRequestError) as refused:  # one error, exit 1 on the command line
        backend.submit(_spec(), project=project)
    assert str(refused.value) == (
        "the skypilot backend could not launch the run: ConnectionError: no API server here"
    )
    assert isinstance(refused.value.__cause__, ConnectionError)
    assert seen == [[".skyignore", "fit.py"]]
    assert list((backend.state_dir / "uploads").iterdir()) == []


def test_sky_refuses_what_it_cannot_run(sky, tmp_path):
    with pytest.raises(
        ComputeConfigError, match=r"backends\.skypilot\.outputs_bucket: must be a bucket URI"
    ):
        SkyPilotBackend({"outputs_bucket": "/local/dir"})
    with pytest.raises(
        ComputeConfigError, match=r"skypilot\.sky: 0\.1\.22's `sky` command is not run"
    ):
        SkyPilotBackend({"outputs_bucket": "gs://b", "sky": "/opt/sky/bin/sky"})
    with pytest.raises(ComputeConfigError, match=r"skypilot\.skyy: unknown key; allowed keys: "):
        SkyPilotBackend({"outputs_bucket": "gs://b", "skyy": "x"})
    with pytest.raises(LookupError, match=r"backends\.skypilot\.buckets\.datasets"):
        _backend(tmp_path).build_task(
            _spec(mounts=({"name": "datasets", "path": "/data"},)), project=tmp_path, run_id="r"
        )


@pytest.mark.usefixtures("child_processes")
def test_run_script_wires_the_jax_coordinator_from_skypilot(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_uv = bin_dir / "uv"
    fake_uv.write_text(
        '#!/bin/sh\necho "$JAX_COORDINATOR_ADDRESS $JAX_NUM_PROCESSES $JAX_PROCESS_ID"\necho "$@"\n'
    )
    fake_uv.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NODE_RANK": "1",
        SPEC_ENV: '{"name": "x"}',
    }
    bash = shutil.which("bash")
    result = subprocess.run(
        [bash, "-c", run_script("train-1")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    coordinator, argv = result.stdout.splitlines()
    assert coordinator == "10.0.0.5:8476 2 1"
    assert argv.startswith("run --frozen --no-sync python -m substrax.compute.worker --spec ")
    assert argv.endswith("--project . --outputs /outputs/train-1 --node-rank 1")


def _stand_ins(monkeypatch, sky, queue=()):
    calls = []

    def record(name, result):
        def call(*args, **kwargs):
            calls.append((name, args, kwargs))
            return (name, result)

        return call

    monkeypatch.setattr(sky, "launch", record("launch", (7, None)))
    monkeypatch.setattr(sky.jobs, "launch", record("jobs.launch", ([11], None)))
    monkeypatch.setattr(sky, "queue", record("queue", list(queue)))
    monkeypatch.setattr(sky.jobs, "queue", record("jobs.queue", list(queue)))
    monkeypatch.setattr(sky, "cancel", record("cancel", None))
    monkeypatch.setattr(sky, "down", record("down", None))
    monkeypatch.setattr(sky, "stream_and_get", lambda request: request[1])
    return calls


def test_launch_tears_the_cluster_down_and_status_maps_the_queue(sky, tmp_path, monkeypatch):
    calls = _stand_ins(monkeypatch, sky, queue=[{"job_id": 7, "status": "JobStatus.RUNNING"}])
    backend = _backend(tmp_path)
    handle = backend.submit(_spec(), project=tmp_path)
    ((name, (task,), kwargs),) = calls
    assert name == "launch"
    assert isinstance(task, sky.Task)
    assert kwargs["down"] is True
    assert kwargs["cluster_name"] == task.name
    assert handle.details == {"managed": "false", "job_id": "7", "cluster": task.name}
    assert backend.status(handle) is RunState.RUNNING
    for status, state in (
        ("PENDING", RunState.PENDING),
        ("FAILED_SETUP", RunState.FAILED),
        ("CANCELLED", RunState.CANCELLED),
    ):
        _stand_ins(monkeypatch, sky, queue=[{"job_id": 7, "status": status}])
        assert backend.status(handle) is state
    calls = _stand_ins(monkeypatch, sky, queue=[{"job_id": 7, "status": "RUNNING"}])
    backend.cancel(handle)
    assert [c[0] for c in calls] == ["queue", "cancel", "down"]


def test_spot_recovery_goes_through_managed_jobs(sky, tmp_path, monkeypatch):
    calls = _stand_ins(monkeypatch, sky)
    backend = _backend(tmp_path, use_spot=True, recover=True, max_restarts_on_errors=3)
    handle = backend.submit(_spec(), project=tmp_path)
    ((name, (task,), _kwargs),) = calls
    assert name == "jobs.launch"
    (resources,) = task.resources
    assert resources.use_spot is True
    assert resources.job_recovery == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3}
    assert handle.details["managed"] == "true"
    assert handle.details["job_id"] == "11"


@pytest.mark.usefixtures("child_processes")
def test_finished_job_reads_the_manifest_and_fetches_from_the_bucket(sky, tmp_path, monkeypatch):
    from substrax.compute import JobManifest, TaskOutcome, TaskStatus

    bucket = tmp_path / "bucket"
    run_dir = bucket / "train-1"
    (run_dir / "fit").mkdir(parents=True)
    (run_dir / "fit" / "stdout.log").write_text("fitting\n")
    outcome = TaskOutcome(
        name="fit", argv=("python",), status=TaskStatus.SUCCEEDED, returncode=0, seconds=1.0
    )
    (run_dir / "manifest.json").write_text(
        json.dumps(JobManifest(job="train", finished=True, tasks=(outcome,)).to_dict())
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"  # a stand-in for the cloud's CLI, reading the local "bucket"
    gcloud.write_text(
        "#!/bin/sh\n"
        f"root={bucket}\n"
        'if [ "$2" = cat ]; then cat "$root/${3#gs://sx-runs/}"; fi\n'
        'if [ "$2" = rsync ]; then cp -R "$root/${4#gs://sx-runs/}/." "$5"; fi\n'
    )
    gcloud.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    _stand_ins(monkeypatch, sky, queue=[{"job_id": 7, "status": "SUCCEEDED"}])
    backend = _backend(tmp_path)
    handle = dataclasses.replace(backend.submit(_spec(), project=tmp_path), run_id="train-1")
    assert backend.status(handle) is RunState.SUCCEEDED
    _stand_ins(monkeypatch, sky, queue=[])  # the cluster is gone: the manifest decides
    assert backend.status(handle) is RunState.SUCCEEDED
    fetched = backend.fetch(handle, tmp_path / "fetched")
    assert (fetched / "fit" / "stdout.log").read_text() == "fitting\n"


def test_worker_python_starts_the_worker_in_the_built_task(sky, tmp_path):
    default = _backend(tmp_path).build_task(_spec(), project=tmp_path, run_id="r1")
    assert "uv run --frozen --no-sync python -m substrax.compute.worker" in default.run
    backend = _backend(tmp_path, worker_python="/opt/sx/bin/python -X faulthandler")
    task = backend.build_task(_spec(), project=tmp_path, run_id="r2")
    assert isinstance(task, sky.Task)
    assert "/opt/sx/bin/python -X faulthandler -m substrax.compute.worker --spec" in task.run
    assert "uv run" not in task.run.splitlines()[-1]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must be one command line that starts Python, got ''"),
        ("python\nrm -rf /", "must be one command line that starts Python"),
        ("'unclosed", "is not a command line"),
        (3, "worker_python"),
    ],
)
def test_worker_python_refuses_what_is_not_one_command(tmp_path, value, message):
    with pytest.raises(ComputeConfigError, match=r"backends\.skypilot\.worker_python") as error:
        _backend(tmp_path, worker_python=value)
    assert message in str(error.value)
