"""The skypilot backend: the real sky.Task built and validated from a job; stand-ins only for
SkyPilot's API calls (launch, queue, cancel)."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from substrax.compute import (
    BackendRequestError,
    ComputeConfigError,
    JobSpec,
    RecordFormatError,
    RunHandle,
    RunState,
    SkyPilotBackend,
    Task,
    new_run_id,
    read_job_spec,
)
from substrax.compute._skypilot_backend import SPEC_ENV, _sky, run_script
from substrax.compute._skypilot_task import CLUSTER_NAME_MAX, cluster_name


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
    monkeypatch.setattr(sky.jobs, "cancel", record("jobs.cancel", None))
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
        ("", 'must be one command line that starts Python, got ""'),
        ("python\nrm -rf /", "control character '\\n'"),
        ("'unclosed", 'is not a command line (No closing quotation), got "\'unclosed"'),
        (3, "worker_python"),
    ],
)
def test_worker_python_refuses_what_is_not_one_command(tmp_path, value, message):
    with pytest.raises(ComputeConfigError, match=r"backends\.skypilot\.worker_python") as error:
        _backend(tmp_path, worker_python=value)
    assert message in str(error.value)
    assert str(error.value).count(", got ") == 1  # it said `got ''` and then `got ""`


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("# nothing", "holds a '#' outside quotes"),
        ("  #python", "holds a '#' outside quotes"),
        ("python #-X dev", "holds a '#' outside quotes"),
        ("python\r-c", "control character '\\r'"),
        ("python\t-X dev", "control character '\\t'"),
        ("python\x00", "control character '\\x00'"),
        ("python\x85", "control character '\\x85'"),
    ],
)
def test_worker_python_refuses_a_comment_or_a_control_character_naming_the_value(
    tmp_path, value, message
):
    # the run line became a shell comment or split in two: the worker never started
    with pytest.raises(ComputeConfigError, match=r"backends\.skypilot\.worker_python") as error:
        _backend(tmp_path, worker_python=value)
    assert message in str(error.value)
    assert str(error.value).endswith(f", got {json.dumps(value)}")


def test_worker_python_takes_a_quoted_or_escaped_hash(sky, tmp_path):
    for number, value in enumerate(("python -X 'a#b'", "python \\#x", 'uv run "#py"')):
        task = _backend(tmp_path, worker_python=value).build_task(
            _spec(), project=tmp_path, run_id=f"r{number}"
        )
        assert task.run.splitlines()[-1].startswith(f"{value} -m substrax.compute.worker")


@pytest.mark.parametrize(
    "job",
    ["train-transformer-language-model-large-v2", "x" * 60, "x" * 59 + "y", "A.b_c---d", "j"],
)
def test_every_run_gets_a_cluster_of_its_own(sky, tmp_path, job):
    from sky.skylet.constants import CLUSTER_NAME_VALID_REGEX
    from sky.utils.common_utils import check_cluster_name_is_valid

    backend = _backend(tmp_path)
    spec = _spec()
    moment = datetime(2026, 1, 1, tzinfo=UTC)  # runs of one second: only the random part differs
    run_ids = {new_run_id(job, now=moment) for _ in range(40)} | {
        f"{'x' * 60}-20260101T000000Z-abcdef"
    }
    names = {backend.task_config(spec, run_id=run_id)["name"] for run_id in run_ids}
    assert len(names) == len(run_ids)
    for name in names:
        assert len(name) <= CLUSTER_NAME_MAX
        assert re.fullmatch(CLUSTER_NAME_VALID_REGEX, name), name
        check_cluster_name_is_valid(name)
        sky.Task(name=name).validate_name()  # the rule for task names too
    assert cluster_name(f"{'x' * 60}-20260101T000000Z-abcdef") != cluster_name(
        f"{'x' * 59}y-20260101T000000Z-abcdef"
    )


def _handle(managed=False):
    return RunHandle(
        run_id="train-20260101T000000Z-abcdef",
        backend="skypilot",
        job="train",
        project="/p",
        submitted_at=datetime(2026, 1, 1, tzinfo=UTC),
        details={"managed": str(managed).lower(), "job_id": "7", "cluster": "sx-train-1"},
    )


def _bin(tmp_path, monkeypatch, *, alone=True, **scripts):
    """Commands (``name=shell script body``) on a PATH of their own, ``alone`` or before PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir) if alone else f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize(
    ("gcloud", "problem"),
    [
        (None, r"the `gcloud` command is not on PATH; install it and log in"),
        (
            'echo "ERROR: (gcloud.storage.cat) HTTPError 401: Anonymous caller" >&2; exit 1',
            r"`gcloud` exited 1: ERROR: \(gcloud\.storage\.cat\) HTTPError 401",
        ),
    ],
    ids=["no-gcloud", "refused"],
)
def test_a_manifest_that_cannot_be_read_is_no_failed_run(
    sky, tmp_path, monkeypatch, gcloud, problem
):
    _stand_ins(monkeypatch, sky, queue=[])  # the job is gone: the manifest decides
    _bin(tmp_path, monkeypatch, **({"gcloud": gcloud} if gcloud else {}))
    backend = _backend(tmp_path)
    with pytest.raises(BackendRequestError) as unknown:
        backend.status(_handle())
    assert re.fullmatch(
        r"the skypilot backend could not read the manifest of run train-20260101T000000Z-abcdef "
        r"\(gs://sx-runs/train-20260101T000000Z-abcdef/manifest\.json\), so its state is "
        rf"unknown: {problem}.*",
        str(unknown.value),
    ), str(unknown.value)


@pytest.mark.usefixtures("child_processes")
def test_a_manifest_that_is_not_there_or_damaged(sky, tmp_path, monkeypatch):
    _stand_ins(monkeypatch, sky, queue=[])  # the job is gone: the manifest decides
    missing = "The following URLs matched no objects or files:"
    missing = f'echo "ERROR: (gcloud.storage.cat) {missing}" >&2; exit 1'
    _bin(tmp_path, monkeypatch, gcloud=missing)
    backend = _backend(tmp_path)
    assert backend.status(_handle()) is RunState.FAILED  # the job ended and wrote none
    _bin(tmp_path, monkeypatch, gcloud='echo \'{"schema_version": 4, "job"\'')
    with pytest.raises(RecordFormatError, match=r"manifest\.json: is not JSON"):
        backend.status(_handle())


@pytest.mark.parametrize("managed", [False, True])
def test_cancel_cancels_a_run_whose_state_cannot_be_read(sky, tmp_path, monkeypatch, managed):
    calls = _stand_ins(monkeypatch, sky)

    def unreachable(*_args, **_kwargs):
        raise ConnectionError("Could not connect to SkyPilot API server at http://127.0.0.1:9")

    monkeypatch.setattr(sky, "queue", unreachable)
    monkeypatch.setattr(sky.jobs, "queue", unreachable)
    backend, handle = _backend(tmp_path), _handle(managed)
    with pytest.raises(BackendRequestError, match=r"state of run train-.*may still be running"):
        backend.status(handle)
    backend.cancel(handle)
    assert [c[0] for c in calls] == (["jobs.cancel"] if managed else ["cancel", "down"])
    monkeypatch.setattr(sky, "cancel", unreachable)
    monkeypatch.setattr(sky.jobs, "cancel", unreachable)
    with pytest.raises(BackendRequestError, match=r"could not cancel run train-.*may still be"):
        backend.cancel(handle)


_R2_AWS = """\
echo "$@ credentials=$AWS_SHARED_CREDENTIALS_FILE" >> {log}
case "$*" in *"--endpoint-url https://acct-1.r2.cloudflarestorage.com --profile r2"*) ;;
  *) echo "An error occurred (InvalidAccessKeyId)" >&2; exit 1 ;; esac
if [ "$2" = cp ]; then cat {bucket}/${{3#s3://sx-r2/}}; fi
if [ "$2" = sync ]; then cp -R {bucket}/${{3#s3://sx-r2/}}/. "$4"; fi
"""


@pytest.mark.usefixtures("child_processes")
def test_r2_outputs_are_read_at_cloudflares_endpoint(sky, tmp_path, monkeypatch):
    from substrax.compute import JobManifest, TaskOutcome, TaskStatus

    run_dir = tmp_path / "bucket" / "train-20260101T000000Z-abcdef"
    (run_dir / "fit").mkdir(parents=True)
    (run_dir / "fit" / "stdout.log").write_text("fitting\n")
    outcome = TaskOutcome(
        name="fit", argv=("python",), status=TaskStatus.SUCCEEDED, returncode=0, seconds=1.0
    )
    (run_dir / "manifest.json").write_text(
        json.dumps(JobManifest(job="train", finished=True, tasks=(outcome,)).to_dict())
    )
    log = tmp_path / "aws.log"
    _bin(
        tmp_path, monkeypatch, alone=False, aws=_R2_AWS.format(log=log, bucket=tmp_path / "bucket")
    )
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _stand_ins(monkeypatch, sky, queue=[])  # the job is gone: the manifest decides
    backend = _backend(tmp_path, outputs_bucket="r2://sx-r2")
    with pytest.raises(BackendRequestError, match=r"home/\.cloudflare/accountid cannot be read"):
        backend.status(_handle())
    (tmp_path / "home" / ".cloudflare").mkdir(parents=True)
    (tmp_path / "home" / ".cloudflare" / "accountid").write_text("acct-1\n")
    assert backend.status(_handle()) is RunState.SUCCEEDED
    fetched = backend.fetch(_handle(), tmp_path / "fetched")
    assert (fetched / "fit" / "stdout.log").read_text() == "fitting\n"
    credentials = f"credentials={tmp_path}/home/.cloudflare/r2.credentials"
    assert [line.split()[:2] + line.split()[-5:] for line in log.read_text().splitlines()] == [
        ["s3", "cp", "--endpoint-url", "https://acct-1.r2.cloudflarestorage.com", "--profile", "r2", credentials],
        ["s3", "sync", "--endpoint-url", "https://acct-1.r2.cloudflarestorage.com", "--profile", "r2", credentials],
    ]  # fmt: skip


@pytest.mark.usefixtures("child_processes")
def test_a_fetch_the_cloud_refuses_is_one_error(sky, tmp_path, monkeypatch):
    _bin(tmp_path, monkeypatch, gcloud='echo "ERROR: 403 Forbidden" >&2; exit 1')
    with pytest.raises(BackendRequestError) as refused:
        _backend(tmp_path).fetch(_handle(), tmp_path / "fetched")
    assert str(refused.value).startswith(
        "the skypilot backend could not copy gs://sx-runs/train-20260101T000000Z-abcdef to "
        f"{tmp_path}/fetched/train-20260101T000000Z-abcdef: CalledProcessError: "
    )
