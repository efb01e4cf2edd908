"""The modal backend: the real modal.Image/App/Function built from a job, a stand-in only for the
network (App.run, Function.spawn, FunctionCall, Volume reads)."""

import contextlib
import json
import re
import threading
from datetime import UTC, datetime, timedelta

import pytest

from substrax.compute import (
    BackendRequestError,
    ComputeConfigError,
    JobManifest,
    JobSpec,
    ModalBackend,
    RecordFormatError,
    RunHandle,
    RunState,
    Task,
    TaskOutcome,
    TaskStatus,
    _modal_backend as modal_backend,
    read_job_spec,
)


modal = pytest.importorskip(
    "modal", reason="the modal SDK (substrax-compute[modal]) is not installed"
)


def _spec(**fields):
    fields.setdefault("timeout_seconds", 1800.0)
    return JobSpec(
        name="train",
        tasks=(Task(name="fit", argv=("python", "fit.py"), timeout_seconds=600),),
        **fields,
    )


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'p'\nversion = '0'\n")
    (root / "uv.lock").write_text("version = 1\n")
    (root / ".python-version").write_text("3.13.1\n")
    return root


@pytest.fixture
def spy(monkeypatch):
    calls = {}

    def wrap(owner, name):
        original = getattr(owner, name)

        def recorder(*args, **kwargs):
            calls.setdefault(name, []).append((args[1:] if name != "clustered" else args, kwargs))
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorder)

    wrap(modal.Image, "uv_sync")
    wrap(modal.Image, "add_local_dir")
    wrap(modal, "clustered")
    return calls


def _backend(tmp_path, **settings):
    return ModalBackend(
        {"outputs_volume": "runs", "state_dir": str(tmp_path / "state"), **settings}
    )


def test_plan_builds_the_function_from_the_job(tmp_path, project, spy, monkeypatch):
    monkeypatch.setenv("SX_TOKEN", "tok-1234")
    spec = _spec(
        extras=("cuda12",),
        resources={"accelerator": {"kind": "L4", "count": 2}, "cpu": 8, "memory_mib": 32768},
        mounts=(
            {"name": "datasets", "path": "/data"},
            {"name": "scratch", "path": "/scratch", "access": "read-write"},
        ),
        secrets=("SX_TOKEN",),
    )
    backend = _backend(tmp_path, volumes={"datasets": "ds-volume", "scratch": "scratch-volume"})
    plan = backend.plan(spec, project=project, run_id="train-1")
    assert isinstance(plan.app, modal.App)
    assert isinstance(plan.image, modal.Image)
    assert isinstance(plan.function, modal.Function)
    function_spec = plan.function._spec_
    assert function_spec.gpus == "L4:2"
    assert (function_spec.cpu, function_spec.memory) == (8.0, 32768)
    assert sorted(function_spec.volumes) == ["/data", "/outputs", "/scratch"]
    assert len(function_spec.secrets) == 2
    assert plan.options["timeout"] == 1800 + 300
    assert plan.options["serialized"] is True
    assert spy["uv_sync"] == [
        ((), {"uv_project_dir": str(project), "frozen": True, "extras": ["cuda12"]})
    ]
    (local_dir, remote), options = spy["add_local_dir"][0]
    assert (local_dir, remote, options["copy"]) == (project, "/project", True)
    assert plan.upload.files == (".python-version", "pyproject.toml", "uv.lock")
    assert "clustered" not in spy
    assert read_job_spec(json.loads(plan.spec_json)) == spec
    assert "tok-1234" not in plan.spec_json


@pytest.fixture
def mounts(monkeypatch):
    """Every real ``modal.Mount`` the image builds for a local directory."""
    built = []
    original = modal.mount._Mount._add_local_dir

    def recorder(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(modal.mount._Mount, "_add_local_dir", staticmethod(recorder))
    return built


def _uploaded(mount):
    """What Modal itself selects for upload from ``mount``: paths under /project."""
    selected = modal.mount._select_files(mount._entries)
    return sorted(str(remote.relative_to("/project")) for _local, remote in selected)


def test_the_image_gets_the_upload_set_and_never_an_unnamed_secret(
    tmp_path, project, mounts, write_files
):
    write_files(
        project,
        {
            ".env": "TOKEN=1\n",
            ".substrax.env": "X=1\n",
            "keys/id_ed25519": "key\n",
            "deploy.key": "key\n",
            ".gitignore": "data/\n",
            "data/train.csv": "1,2\n",
            ".substraxignore": "notes/\n",
            "notes/draft.md": "draft\n",
            "fit.py": "print(1)\n",
            "scratch.tmp": "x\n",
            ".venv/bin/python": "",
            "pkg/__pycache__/m.pyc": "",
        },
    )
    spec = _spec(include_files=("deploy.key",))
    plan = _backend(tmp_path, ignore=["*.tmp"]).plan(spec, project=project, run_id="r")
    expected = [
        ".gitignore", ".python-version", ".substraxignore", "deploy.key", "fit.py",
        "pyproject.toml", "uv.lock",
    ]  # fmt: skip
    assert list(plan.upload.files) == expected
    assert plan.upload.held_back == (".env", ".substrax.env", "keys/id_ed25519")
    (mount,) = mounts
    assert _uploaded(mount) == expected


def test_a_named_file_that_is_missing_is_refused_before_anything_is_built(tmp_path, project):
    with pytest.raises(FileNotFoundError, match=r"'absent\.key', which is not a file in"):
        _backend(tmp_path).plan(_spec(include_files=("absent.key",)), project=project, run_id="r")


def test_read_only_mount_gets_a_read_only_volume(tmp_path, project):
    spec = _spec(mounts=({"name": "datasets", "path": "/data"},))
    plan = _backend(tmp_path, volumes={"datasets": "ds"}).plan(spec, project=project, run_id="r")
    volumes = plan.function._spec_.volumes
    assert volumes["/data"]._read_only is True
    assert getattr(volumes["/outputs"], "_read_only", False) is False


def test_multi_node_job_is_a_clustered_function(tmp_path, project, spy):
    spec = _spec(nodes=4, resources={"accelerator": {"kind": "H100", "count": 8}})
    plan = _backend(tmp_path).plan(spec, project=project, run_id="r")
    assert plan.clustered == 4
    assert spy["clustered"] == [((), {"size": 4})]
    assert plan.function._spec_.gpus == "H100:8"


def test_image_python_follows_the_project_not_this_interpreter(tmp_path, project, monkeypatch):
    calls = []
    original = modal.Image.debian_slim
    monkeypatch.setattr(modal.Image, "debian_slim", lambda **kw: calls.append(kw) or original(**kw))
    _backend(tmp_path).plan(_spec(), project=project, run_id="r")
    _backend(tmp_path, python="3.12").plan(_spec(), project=project, run_id="r")
    assert calls == [{"python_version": "3.13"}, {"python_version": "3.12"}]


def test_refusals(tmp_path, project, monkeypatch):
    with pytest.raises(ComputeConfigError, match=r"backends\.modal\.outputs_volume: is required"):
        ModalBackend({})
    with pytest.raises(ComputeConfigError, match=r"backends\.modal\.gpu: unknown key"):
        ModalBackend({"outputs_volume": "x", "gpu": "A100"})
    for settings, where in (  # names Modal would refuse at the request, refused here first
        ({"outputs_volume": "my vol!"}, "outputs_volume: must be a Modal name"),
        ({"outputs_volume": "x" * 65}, "outputs_volume: must be a Modal name"),
        ({"outputs_volume": "x", "volumes": {"d": "a/b"}}, "volumes.d: must be a Modal name"),
        ({"outputs_volume": "x", "python": "banana"}, "python: must be a Python version"),
    ):
        with pytest.raises(ComputeConfigError, match=rf"backends\.modal\.{re.escape(where)}"):
            ModalBackend(settings)
    with pytest.raises(LookupError, match=r"backends\.modal\.volumes\.datasets"):
        _backend(tmp_path).plan(
            _spec(mounts=({"name": "datasets", "path": "/data"},)), project=project, run_id="r"
        )
    monkeypatch.delenv("SX_ABSENT", raising=False)
    with pytest.raises(LookupError, match="SX_ABSENT"):
        _backend(tmp_path).plan(_spec(secrets=("SX_ABSENT",)), project=project, run_id="r")


class _Call:
    def __init__(self, outcome):
        self.object_id = "fc-123"
        self.outcome = outcome
        self.cancelled_with = None

    def get(self, timeout=None):  # noqa: ARG002 - FunctionCall.get's signature
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self, terminate_containers=False):
        self.cancelled_with = terminate_containers


def test_submit_spawns_the_worker_and_status_reads_the_volume(tmp_path, project, monkeypatch):
    spawned = []

    @contextlib.contextmanager
    def run(self, detach=False, environment_name=None):
        assert detach is True
        yield self

    def spawn(self, *args):
        spawned.append(args)
        return _Call(0)

    monkeypatch.setattr(modal.App, "run", run)
    monkeypatch.setattr(modal.Function, "spawn", spawn)
    backend = _backend(tmp_path)
    handle = backend.submit(_spec(), project=project)
    assert handle.details["call_id"] == "fc-123"
    assert handle.settings == {"outputs_volume": "runs", "state_dir": str(tmp_path / "state")}
    ((spec_json, run_id),) = spawned
    assert run_id == handle.run_id
    assert json.loads(spec_json)["name"] == "train"

    call = _Call(TimeoutError())
    monkeypatch.setattr(modal.FunctionCall, "from_id", staticmethod(lambda _call_id: call))
    assert backend.status(handle) is RunState.RUNNING
    call.outcome = 0
    manifest = JobManifest(
        job="train",
        finished=True,
        tasks=(
            TaskOutcome(
                name="fit", argv=("python",), status=TaskStatus.SUCCEEDED, returncode=0, seconds=1.0
            ),
        ),
    )
    read = []
    monkeypatch.setattr(
        modal.Volume,
        "read_file",
        lambda _self, path: read.append(path) or iter([json.dumps(manifest.to_dict()).encode()]),
    )
    assert backend.status(handle) is RunState.SUCCEEDED
    assert read == [f"{handle.run_id}/manifest.json"]
    call.outcome = RuntimeError("container crashed")
    assert backend.status(handle) is RunState.FAILED

    call.outcome = TimeoutError()
    backend.cancel(handle)
    assert call.cancelled_with is True
    assert backend.status(handle) is RunState.CANCELLED


@pytest.mark.usefixtures("child_processes")
def test_remote_worker_runs_the_worker_in_the_container_layout(tmp_path, monkeypatch):
    outputs, project = tmp_path / "outputs", tmp_path / "project"
    project.mkdir()
    (project / "fit.py").write_text("print('fitting')\n")
    monkeypatch.setattr(modal_backend, "OUTPUTS", str(outputs))
    monkeypatch.setattr(modal_backend, "PROJECT", str(project))
    monkeypatch.setenv("SUBSTRAX_OUTPUTS_VOLUME", "runs")
    committed = []
    monkeypatch.setattr(modal.Volume, "commit", lambda _self: committed.append(True))
    spec = _spec(probe_devices=False)
    code = modal_backend.remote_worker(json.dumps(spec.model_dump(mode="json")), "train-1")
    assert code == 0
    assert committed == [True]
    assert (outputs / "train-1" / "fit" / "stdout.log").read_text() == "fitting\n"


def test_an_sdk_error_at_submit_is_one_error_naming_the_backend(tmp_path, project, monkeypatch):
    @contextlib.contextmanager
    def run(self, detach=False, environment_name=None):
        raise modal.exception.AuthError("Token missing. Could not authenticate client.")
        yield self

    monkeypatch.setattr(modal.App, "run", run)
    with pytest.raises(BackendRequestError) as refused:
        _backend(tmp_path).submit(_spec(), project=project)
    assert str(refused.value) == (
        "the modal backend could not submit the run: AuthError: Token missing. Could not "
        "authenticate client."
    )
    assert isinstance(refused.value.__cause__, modal.exception.AuthError)


def _handle(tmp_path, submitted_at=None):
    return RunHandle(
        run_id="train-20260101T000000Z-abcdef",
        backend="modal",
        job="train",
        project=str(tmp_path),
        submitted_at=submitted_at or datetime(2026, 1, 1, tzinfo=UTC),
        details={"app_id": "ap-123", "call_id": "fc-123"},
    )


def _manifest_bytes(status=TaskStatus.SUCCEEDED):
    outcome = TaskOutcome(name="fit", argv=("python",), status=status, returncode=0, seconds=1.0)
    manifest = JobManifest(job="train", finished=True, tasks=(outcome,))
    return json.dumps(manifest.to_dict()).encode()


def _volume_holds(monkeypatch, content):
    """``Volume.read_file`` returns ``content`` (bytes), or raises it (an exception)."""

    def read_file(_self, _path):
        if isinstance(content, BaseException):
            raise content
        return iter([content])

    monkeypatch.setattr(modal.Volume, "read_file", read_file)


def _call_is(monkeypatch, call):
    monkeypatch.setattr(modal.FunctionCall, "from_id", staticmethod(lambda _call_id: call))


@pytest.mark.parametrize(
    "error",
    [
        modal.exception.ConnectionError("Could not connect to the Modal server."),
        modal.exception.AuthError("Token missing. Could not authenticate client."),
        modal.exception.ServiceError("unavailable"),
    ],
    ids=["no-connection", "no-token", "server-error"],
)
def test_modal_not_answering_is_no_run_state(tmp_path, monkeypatch, error):
    _call_is(monkeypatch, _Call(error))
    with pytest.raises(BackendRequestError) as unknown:
        _backend(tmp_path).status(_handle(tmp_path))
    assert str(unknown.value).startswith(
        "the modal backend could not read the state of run train-20260101T000000Z-abcdef, "
        f"which may still be running: {type(error).__name__}: "
    )


def test_status_reaching_no_modal_server_gives_up_in_time(tmp_path, monkeypatch):
    """The real SDK, at a closed port on 127.0.0.1 (no token: it fails at once; with one, it
    would retry for a minute, cut short by REQUEST_SECONDS)."""
    monkeypatch.setenv("MODAL_SERVER_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    monkeypatch.setattr(modal_backend, "REQUEST_SECONDS", 5.0)
    with pytest.raises(BackendRequestError, match="which may still be running"):
        _backend(tmp_path).status(_handle(tmp_path))


def test_status_waits_on_modal_no_longer_than_request_seconds(tmp_path, monkeypatch):
    released = threading.Event()

    class _Hanging(_Call):
        def get(self, timeout=None):  # noqa: ARG002 - FunctionCall.get's signature
            released.wait(30)  # the SDK retrying a connection
            raise TimeoutError

    _call_is(monkeypatch, _Hanging(None))
    monkeypatch.setattr(modal_backend, "REQUEST_SECONDS", 0.1)
    try:
        with pytest.raises(BackendRequestError, match=r"Modal did not answer in 0\.1 s"):
            _backend(tmp_path).status(_handle(tmp_path))
    finally:
        released.set()


@pytest.mark.parametrize(
    ("outcome", "volume", "state"),
    [
        (TimeoutError(), None, RunState.RUNNING),  # no output yet
        (modal.exception.FunctionTimeoutError("timed out"), None, RunState.FAILED),
        (RuntimeError("the worker crashed"), None, RunState.FAILED),
        (modal.exception.InputCancellation("cancelled"), None, RunState.CANCELLED),
        (0, modal.exception.NotFoundError("no such file"), RunState.FAILED),  # no manifest
        (modal.exception.OutputExpiredError(), _manifest_bytes(), RunState.SUCCEEDED),
        (0, _manifest_bytes(TaskStatus.FAILED), RunState.FAILED),
    ],
    ids=["running", "timed-out", "crashed", "cancelled", "no-manifest", "expired", "failed"],
)
def test_status_tells_how_the_call_ended(tmp_path, monkeypatch, outcome, volume, state):
    _call_is(monkeypatch, _Call(outcome))
    _volume_holds(monkeypatch, volume if volume is not None else AssertionError("not read"))
    assert _backend(tmp_path).status(_handle(tmp_path)) is state


def test_a_manifest_that_cannot_be_read_is_no_failed_run(tmp_path, monkeypatch):
    _call_is(monkeypatch, _Call(0))
    backend = _backend(tmp_path)
    _volume_holds(monkeypatch, modal.exception.ConnectionError("Could not connect."))
    with pytest.raises(BackendRequestError, match=r"read the manifest of run train-.*unknown"):
        backend.status(_handle(tmp_path))
    _volume_holds(monkeypatch, b'{"schema_version": 4, "job": ')
    with pytest.raises(RecordFormatError, match=r"volume runs: train-.*/manifest\.json: is not"):
        backend.status(_handle(tmp_path))


def test_cancel_cancels_a_run_whose_state_cannot_be_read(tmp_path, monkeypatch):
    call = _Call(modal.exception.ConnectionError("Could not connect to the Modal server."))
    _call_is(monkeypatch, call)
    backend, handle = _backend(tmp_path), _handle(tmp_path)
    backend.cancel(handle)
    assert call.cancelled_with is True
    assert backend.status(handle) is RunState.CANCELLED


def test_a_cancel_modal_did_not_take_leaves_the_run_unknown(tmp_path, monkeypatch):
    class _Refused(_Call):
        def cancel(self, terminate_containers=False):  # noqa: ARG002 - FunctionCall.cancel's
            raise modal.exception.ConnectionError("Could not connect to the Modal server.")

    _call_is(monkeypatch, _Refused(TimeoutError()))
    backend, handle = _backend(tmp_path), _handle(tmp_path)
    with pytest.raises(
        BackendRequestError, match=r"could not cancel run train-.*may still be running"
    ):
        backend.cancel(handle)
    assert backend.status(handle) is RunState.RUNNING  # not marked cancelled


@pytest.fixture
def fake_modal_cli(tmp_path, monkeypatch):
    """``sys.executable`` as seen by the backend: a script that records its arguments, prints
    three lines and exits with $FAKE_EXIT; the run's state is never asked for."""
    script = tmp_path / "python"
    script.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path / "argv"}\nprintf "one\\ntwo\\nthree\\n"\n'
        'exit "${FAKE_EXIT:-0}"\n'
    )
    script.chmod(0o755)
    monkeypatch.setattr(modal_backend.sys, "executable", str(script))

    def no_status(_call_id):
        raise AssertionError("logs asked for the run's state")

    monkeypatch.setattr(modal.FunctionCall, "from_id", staticmethod(no_status))
    return tmp_path / "argv"


@pytest.mark.usefixtures("child_processes")
def test_logs_without_follow_prints_the_run_log_so_far_and_returns(tmp_path, fake_modal_cli):
    backend = _backend(tmp_path)
    handle = _handle(tmp_path, submitted_at=datetime.now(UTC).replace(microsecond=0))
    assert list(backend.logs(handle, follow=False)) == ["one", "two", "three"]
    since = (handle.submitted_at - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    assert fake_modal_cli.read_text().split() == [
        "-m", "modal", "app", "logs", "ap-123", "--since", since,
    ]  # fmt: skip
    assert list(backend.logs(handle, follow=True)) == ["one", "two", "three"]
    assert fake_modal_cli.read_text().split()[-2:] == ["ap-123", "--follow"]


@pytest.mark.usefixtures("child_processes")
def test_logs_that_modal_cannot_give_are_an_error(tmp_path, fake_modal_cli, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "1")
    lines = _backend(tmp_path).logs(_handle(tmp_path), follow=False)
    assert [next(lines), next(lines), next(lines)] == ["one", "two", "three"]
    with pytest.raises(BackendRequestError, match=r"`modal app logs` exited 1"):
        next(lines)
    assert fake_modal_cli.exists()
