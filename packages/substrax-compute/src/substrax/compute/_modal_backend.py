"""The ``modal`` backend: the worker in a Modal function, outputs on a Modal volume.

The image is ``debian_slim`` with the locked project synced by uv (``uv sync --frozen`` with the
job's extras) and the project's upload set (``collect_upload``: what git would track, less
``.substraxignore`` and anything that looks like a secret, plus the job's ``include_files``)
copied to ``/project``. The function gets the job's GPU, CPU,
memory and timeout, the outputs volume at ``/outputs``, one volume per mount, and the job's
secrets as a ``modal.Secret`` built from this environment. A job with ``nodes > 1`` runs as a
clustered function (``modal.clustered``); each container runs the worker with its rank and the
coordinator at the first container's address. The function is pickled by reference to this
module, so the image's Python need not match this interpreter.

Settings (``[tool.substrax.compute.backends.modal]``): ``outputs_volume`` (required),
``volumes`` (``{mount name: volume name}``), ``environment``, ``python`` (default: the
project's ``.python-version``, else this interpreter's), ``ignore`` (more gitignore patterns left
out of the project copy) and ``state_dir``.

Example:
    >>> from substrax.compute import ModalBackend
    >>> ModalBackend({"outputs_volume": "demo-outputs"}).name
    'modal'
"""

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, Field, JsonValue

from substrax.support import require, write_atomically

from ._backend import RunHandle, RunState, new_run
from ._config import read_backend_settings
from ._errors import BackendRequestError, SecretNotSetError
from ._files import inside
from ._manifest import DAMAGED, MANIFEST_NAME, read_manifest
from ._modal_requests import REQUEST_SECONDS, call_outcome, unanswered, within
from ._mounts import MountSources
from ._run_errors import RecordFormatError
from ._spec import JobSpec, Record
from ._spec_types import Component
from ._upload import UploadSet, collect_upload


if TYPE_CHECKING:
    import modal


OUTPUTS = "/outputs"
PROJECT = "/project"
COORDINATOR_PORT = 8476
_LOG_RANGE = timedelta(days=34)
"""The longest time range ``logs`` asks ``modal app logs`` for (it refuses more than 35 days)."""


def _modal_name(name: str) -> str:
    """A volume name as Modal takes it: letters, digits, '-', '.', '_', at most 64 of them."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
        raise ValueError("must be a Modal name: 1 to 64 letters, digits, '-', '.' or '_'")
    return name


def _python_version(version: str) -> str:
    if not re.fullmatch(r"3\.\d{1,2}(\.\d{1,3})?", version):
        raise ValueError("must be a Python version such as '3.12'")
    return version


class ModalSettings(Record):
    """The ``modal`` backend's settings table (names checked before any request is sent)."""

    outputs_volume: Annotated[str, AfterValidator(_modal_name)]
    volumes: dict[Component, Annotated[str, AfterValidator(_modal_name)]] = Field(
        default_factory=dict
    )
    environment: str | None = None
    python: Annotated[str, AfterValidator(_python_version)] | None = None
    ignore: tuple[str, ...] = ()
    state_dir: str | None = None


_SDK = {"who": "the modal backend", "distribution": "substrax-compute", "extra": "modal"}
_VOLUMES = MountSources("backends.modal.volumes", "Modal volume", "<volume name>")


def remote_worker(spec_json: str, run_id: str) -> int:
    """The function body Modal runs: the worker for this container's node.

    In a clustered function the rank and container addresses come from Modal's cluster info;
    ``JAX_COORDINATOR_ADDRESS``/``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID`` are set from them.
    """
    modal = require("modal", **_SDK)
    spec = json.loads(spec_json)
    outputs = Path(OUTPUTS) / run_id
    outputs.mkdir(parents=True, exist_ok=True)
    spec_path = Path("/tmp") / f"{run_id}.spec.json"  # noqa: S108 - the container's own /tmp
    spec_path.write_text(spec_json)
    env = dict(os.environ)
    rank = 0
    if spec.get("nodes", 1) > 1:
        cluster = modal.experimental.get_cluster_info()
        rank = cluster.rank
        ips = cluster.container_ipv4_ips or cluster.container_ips
        env |= {
            "JAX_COORDINATOR_ADDRESS": f"{ips[0]}:{COORDINATOR_PORT}",
            "JAX_NUM_PROCESSES": str(len(ips)),
            "JAX_PROCESS_ID": str(rank),
        }
    argv = [
        sys.executable, "-m", "substrax.compute.worker", "--spec", str(spec_path),
        "--project", PROJECT, "--outputs", str(outputs), "--node-rank", str(rank),
    ]  # fmt: skip
    code = subprocess.run(argv, env=env, cwd=PROJECT, check=False).returncode
    modal.Volume.from_name(env["SUBSTRAX_OUTPUTS_VOLUME"]).commit()
    return code


@dataclass(frozen=True, slots=True)
class _LeftOut:
    """Modal's ``ignore`` predicate: a path (relative to the project) not in the upload set."""

    kept: frozenset[str]

    def __call__(self, path: Path) -> bool:
        return path.as_posix() not in self.kept


@dataclass(frozen=True, slots=True, kw_only=True)
class ModalPlan:
    """What the backend built for one run: the real Modal objects and the options behind them."""

    app: Any
    function: Any
    image: Any
    options: dict[str, Any]
    clustered: int | None
    spec_json: str
    run_id: str
    upload: UploadSet
    secret_names: tuple[str, ...] = field(default=())


class ModalBackend:
    """Runs the worker as a Modal function.

    Args:
        settings: The ``[tool.substrax.compute.backends.modal]`` table.

    Raises:
        ComputeConfigError: ``outputs_volume`` is missing, or a setting is unknown or malformed.
    """

    name = "modal"

    def __init__(self, settings: Mapping[str, JsonValue] | None = None) -> None:
        self.raw_settings, self.settings, self.state_dir = read_backend_settings(
            ModalSettings, self.name, settings
        )

    def _python(self, project: Path) -> str:
        if self.settings.python:
            return self.settings.python
        pinned = project / ".python-version"
        if pinned.is_file():
            return ".".join(pinned.read_text().strip().split(".")[:2])
        return f"{sys.version_info.major}.{sys.version_info.minor}"

    def _volume(self, name: str) -> "modal.Volume":
        return require("modal", **_SDK).Volume.from_name(
            name, environment_name=self.settings.environment, create_if_missing=True
        )

    def upload_set(self, spec: JobSpec, *, project: Path) -> UploadSet:
        """The project files the image gets: the shared upload rule plus the ``ignore`` setting.

        Raises:
            UploadFileNotFoundError: A file in the job's ``include_files`` is not in the project.
        """
        return collect_upload(
            project,
            include_files=spec.include_files,
            ignore=self.settings.ignore,
            state_dirs=(self.state_dir,),
        )

    def plan(self, spec: JobSpec, *, project: Path, run_id: str) -> ModalPlan:
        """Build the image, app and function for ``spec`` (no network is reached).

        Raises:
            MountNotConfiguredError: A mount has no volume in the settings.
            SecretNotSetError: A secret the job names is not set here.
            UploadFileNotFoundError: A file in the job's ``include_files`` is not in the project.
        """
        modal = require("modal", **_SDK)
        missing = [name for name in spec.secrets if name not in os.environ]
        if missing:
            raise SecretNotSetError(missing)
        upload = self.upload_set(spec, project=project)
        image = (
            modal.Image.debian_slim(python_version=self._python(project))
            .uv_sync(uv_project_dir=str(project), frozen=True, extras=list(spec.extras))
            .add_local_dir(
                upload.root, PROJECT, copy=True, ignore=_LeftOut(frozenset(upload.files))
            )
        )
        volumes: dict[str, Any] = {OUTPUTS: self._volume(self.settings.outputs_volume)}
        for mount, name in _VOLUMES.of(spec.mounts, self.settings.volumes):
            volume = self._volume(name)
            volumes[mount.path] = volume.read_only() if mount.access == "read-only" else volume
        secrets = [
            modal.Secret.from_dict({"SUBSTRAX_OUTPUTS_VOLUME": self.settings.outputs_volume})
        ]
        if spec.secrets:
            secrets.append(modal.Secret.from_dict({k: os.environ[k] for k in spec.secrets}))
        accelerator = spec.resources.accelerator
        options: dict[str, Any] = {
            "image": image,
            "gpu": accelerator.label if accelerator else None,
            "cpu": spec.resources.cpu,
            "memory": spec.resources.memory_mib,
            "timeout": int(-(-spec.timeout_seconds // 1)) + 300,
            "volumes": volumes,
            "secrets": secrets,
            "serialized": True,
            "name": "substrax-worker",
        }
        app = modal.App(f"substrax-{run_id}")
        body: Any = remote_worker
        if spec.nodes > 1:
            body = modal.clustered(size=spec.nodes)(body)
        function = app.function(**options)(body)
        spec_json = json.dumps(spec.model_dump(mode="json"))
        return ModalPlan(
            app=app, function=function, image=image, options=options,
            clustered=spec.nodes if spec.nodes > 1 else None, spec_json=spec_json,
            run_id=run_id, upload=upload, secret_names=spec.secrets,
        )  # fmt: skip

    def submit(self, spec: JobSpec, *, project: Path) -> RunHandle:
        """Build the run's app and spawn the worker function, detached."""
        run = new_run(spec, project)
        plan = self.plan(spec, project=run.project, run_id=run.run_id)
        try:  # the network: no token, a name Modal refuses, no connection
            with plan.app.run(detach=True, environment_name=self.settings.environment):
                call = plan.function.spawn(plan.spec_json, run.run_id)
        except Exception as error:
            raise BackendRequestError.of(self.name, "submit the run", error) from error
        details = {"app_id": str(plan.app.app_id), "call_id": str(call.object_id)}
        return run.handle(self.name, details, self.raw_settings)

    def _marker(self, handle: RunHandle) -> Path:
        return self.state_dir / "cancelled" / handle.run_id

    def _read(self, path: str) -> bytes:
        volume = self._volume(self.settings.outputs_volume)
        return b"".join(volume.read_file(path))

    def status(self, handle: RunHandle) -> RunState:
        """Cancelled marker first; then whether the call is done; then the manifest.

        Each request to Modal gets ``REQUEST_SECONDS`` to answer.

        Raises:
            BackendRequestError: Modal did not answer: the run's state is unknown.
            RecordFormatError: The run's manifest is damaged.
        """
        if self._marker(handle).exists():
            return RunState.CANCELLED
        modal = require("modal", **_SDK)
        call = modal.FunctionCall.from_id(handle.details["call_id"])
        unknown = f"read the state of run {handle.run_id}, which may still be running"
        try:
            state = within(REQUEST_SECONDS, lambda: call_outcome(call, modal), operation=unknown)
        except unanswered(modal) as error:
            raise BackendRequestError.of(self.name, unknown, error) from error
        if state is not None:
            return state
        path = f"{handle.run_id}/{MANIFEST_NAME}"
        where = f"volume {self.settings.outputs_volume}: {path}"
        unread = f"read the manifest of run {handle.run_id} ({where}), so its state is unknown"
        try:
            data = within(REQUEST_SECONDS, lambda: self._read(path), operation=unread)
        except modal.exception.NotFoundError:  # the call is over; its worker wrote no manifest
            return RunState.FAILED
        except Exception as error:
            raise BackendRequestError.of(self.name, unread, error) from error
        try:
            loaded = json.loads(data)
        except ValueError as error:
            raise RecordFormatError(where, f"is not JSON ({error})", cause=DAMAGED) from None
        return RunState.SUCCEEDED if read_manifest(loaded).succeeded else RunState.FAILED

    def logs(self, handle: RunHandle, *, follow: bool) -> Iterator[str]:
        """The app's logs from ``modal app logs``, streamed until the app stops with ``follow``.

        Without ``follow``, the lines written since the run was submitted, and no more.

        Raises:
            BackendRequestError: ``modal app logs`` failed (its own message went to stderr).
        """
        argv = [sys.executable, "-m", "modal", "app", "logs", handle.details["app_id"]]
        if follow:
            argv.append("--follow")
        else:  # a minute early, for the clocks; Modal fetches no more than 35 days
            since = max(handle.submitted_at - timedelta(minutes=1), datetime.now(UTC) - _LOG_RANGE)
            argv += ["--since", since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as process:
            if process.stdout is None:  # pragma: no cover - PIPE given
                return
            try:
                for line in process.stdout:
                    yield line.rstrip("\n")
            except GeneratorExit:  # the reader stopped early
                process.terminate()
                raise
            code = process.wait()
        if code != 0:
            cause = f"`modal app logs` exited {code} (its message is above)"
            raise BackendRequestError(self.name, f"read the logs of run {handle.run_id}", cause)

    def fetch(self, handle: RunHandle, destination: Path) -> Path:
        """Copy ``/outputs/<run_id>`` from the outputs volume to ``destination/<run_id>``."""
        volume = self._volume(self.settings.outputs_volume)
        target = destination / handle.run_id
        target.mkdir(parents=True, exist_ok=True)
        prefix = f"{handle.run_id}/"
        for entry in volume.listdir(handle.run_id, recursive=True):
            if entry.type != require("modal", **_SDK).volume.FileEntryType.FILE:
                continue
            relative = entry.path.removeprefix("/").removeprefix(prefix)
            path = inside(target, relative)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, self._read(entry.path))
        return target

    def cancel(self, handle: RunHandle) -> None:
        """Terminate the function's containers; a finished run is left alone.

        A run whose state cannot be read is cancelled all the same; it is marked cancelled only
        once Modal took the request.

        Raises:
            BackendRequestError: Modal did not take the request: the run may still be running.
        """
        try:
            if self.status(handle).is_final:
                return
        except (BackendRequestError, RecordFormatError):
            pass  # unknown is not over: cancel it
        call = require("modal", **_SDK).FunctionCall.from_id(handle.details["call_id"])
        try:
            call.cancel(terminate_containers=True)
        except Exception as error:
            operation = f"cancel run {handle.run_id}, which may still be running"
            raise BackendRequestError.of(self.name, operation, error) from error
        marker = self._marker(handle)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
