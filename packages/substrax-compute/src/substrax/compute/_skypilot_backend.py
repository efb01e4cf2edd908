"""The ``skypilot`` backend: the worker as a SkyPilot task on any cloud SkyPilot reaches.

The task (built with ``sky.Task.from_yaml_config``, so SkyPilot validates it) uploads the
project's upload set as its workdir, asks for the job's accelerators, CPUs and memory, mounts the outputs
bucket at ``/outputs`` and each job mount's bucket at its path, syncs the locked project with
uv in ``setup`` and starts the worker in ``run``. With ``nodes > 1`` every node runs the worker
with its ``SKYPILOT_NODE_RANK`` and the jax coordinator on the first of ``SKYPILOT_NODE_IPS``.
With ``recover = true`` (spot recovery) the task goes through managed jobs (``sky.jobs.launch``);
otherwise ``sky.launch`` starts a cluster that is torn down when the job ends. Each run has a
cluster of its own (``cluster_name``). Once the job is over its manifest, read from the outputs
bucket with the cloud's CLI (``_buckets``; R2 at Cloudflare's endpoint), decides its state; a
state that cannot be read raises ``BackendRequestError`` and never reads as failed.

SkyPilot syncs a workdir by its own rules (a ``.skyignore`` if there is one, else ``.gitignore``
through git). So that it sends exactly what Modal gets, the backend stages the upload set
(``collect_upload``: what git would track, less ``.substraxignore`` and anything that looks like a
secret, plus the job's ``include_files``) in ``<state_dir>/uploads/<run_id>`` with a ``.skyignore``
that leaves out only itself, points the workdir there, and removes it once SkyPilot has it.

Settings (``[tool.substrax.compute.backends.skypilot]``): ``outputs_bucket`` (``gs://``,
``s3://`` or ``r2://``; required), ``buckets`` (``{mount name: bucket URI}``), ``infra``,
``use_spot``, ``recover``, ``recovery_strategy``, ``max_restarts_on_errors``, ``state_dir``,
``worker_python`` (the command that starts Python on a node for the worker; default
``WORKER_PYTHON``, the locked project's interpreter through uv).

Example:
    >>> from substrax.compute import SkyPilotBackend
    >>> SkyPilotBackend({"outputs_bucket": "gs://my-outputs"}).name
    'skypilot'
"""

import json
import os
import shlex
import shutil
import unicodedata
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, JsonValue, field_validator

from substrax.support import require

from ._backend import RunHandle, RunState, new_run
from ._buckets import read_object, sync_to
from ._config import read_backend_settings
from ._errors import BackendRequestError, SecretNotSetError
from ._manifest import DAMAGED, MANIFEST_NAME, read_manifest
from ._mounts import MountSources
from ._run_errors import RecordFormatError
from ._skypilot_task import SPEC_ENV, WORKER_PYTHON, cluster_name, run_script, setup_script
from ._spec import JobSpec, Record
from ._spec_types import Component
from ._upload import UploadSet, collect_upload


if TYPE_CHECKING:
    import sky


_SCHEMES = ("gs://", "s3://", "r2://")
_BUCKETS = MountSources("backends.skypilot.buckets", "bucket", "gs://...")
SKYIGNORE = "# substrax-compute staged this workdir: every file here is uploaded\n/.skyignore\n"
"""The ``.skyignore`` of a staged workdir: SkyPilot then applies no ``.gitignore`` of its own."""


def _sky() -> Any:  # noqa: ANN401 - the SDK module
    """SkyPilot with its jobs API, imported without the deprecation warnings its imports raise.

    Raises:
        MissingExtraError: SkyPilot is not installed (the message names the extra).
    """
    with warnings.catch_warnings():
        # SkyPilot's own modules use sqlalchemy 1.x and passlib APIs that warn on import.
        warnings.filterwarnings(
            "ignore", message=r"The ..declarative_base", category=DeprecationWarning
        )
        warnings.filterwarnings(
            "ignore", message="'crypt' is deprecated", category=DeprecationWarning
        )
        sdk = {
            "who": "the skypilot backend",
            "distribution": "substrax-compute",
            "extra": "skypilot",
        }
        require("sky.jobs", **sdk)
        return require("sky", **sdk)


class SkyPilotSettings(Record):
    """The ``skypilot`` backend's settings table."""

    outputs_bucket: str
    buckets: dict[Component, str] = Field(default_factory=dict)
    infra: str | None = None
    use_spot: bool = False
    recover: bool = False
    recovery_strategy: str = "EAGER_NEXT_REGION"
    max_restarts_on_errors: int = 0
    state_dir: str | None = None
    worker_python: str = WORKER_PYTHON

    RETIRED: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "sky": "0.1.22's `sky` command is not run: the backend calls SkyPilot's Python SDK in "
            "this interpreter; add the extra (substrax-compute[skypilot]) to the project instead "
            "(docs/migrating-from-0.1.22.md)"
        }
    )

    @field_validator("worker_python")
    @classmethod
    def _worker_python(cls, value: str) -> str:
        # the run line is `{value} -m substrax.compute.worker ...`: the message says what is
        # wrong, and the settings error names the value (`got "..."`)
        controls = [char for char in value if unicodedata.category(char) == "Cc"]
        if controls:
            raise ValueError(
                f"holds the control character {controls[0]!r}, which splits or garbles the "
                "task's run line; write one command line"
            )
        try:
            words = shlex.split(value)
        except ValueError as error:
            raise ValueError(f"is not a command line ({error})") from None
        if not words:
            raise ValueError("must be one command line that starts Python")
        if shlex.split(value, comments=True) != words:
            raise ValueError(
                "holds a '#' outside quotes, which the task's shell reads as a comment that "
                "hides the worker command; quote it"
            )
        return value

    @field_validator("outputs_bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        if not value.startswith(_SCHEMES) or len(value) <= len("gs://"):
            raise ValueError(f"must be a bucket URI starting with {', '.join(_SCHEMES)}")
        return value.rstrip("/")


class SkyPilotBackend:
    """Runs the worker as a SkyPilot task (a cluster, or a managed job for spot recovery).

    Args:
        settings: The ``[tool.substrax.compute.backends.skypilot]`` table.

    Raises:
        ComputeConfigError: ``outputs_bucket`` is missing or not a bucket URI, or a setting is unknown.
    """

    name = "skypilot"

    def __init__(self, settings: Mapping[str, JsonValue] | None = None) -> None:
        self.raw_settings, self.settings, self.state_dir = read_backend_settings(
            SkyPilotSettings, self.name, settings
        )

    def upload_dir(self, run_id: str) -> Path:
        """Where ``stage`` puts a run's upload set: ``<state_dir>/uploads/<run_id>``."""
        return self.state_dir / "uploads" / run_id

    def upload_set(self, spec: JobSpec, *, project: Path) -> UploadSet:
        """The project files the task's workdir holds (the shared upload rule).

        Raises:
            UploadFileNotFoundError: A file in the job's ``include_files`` is not in the project.
        """
        return collect_upload(
            project, include_files=spec.include_files, state_dirs=(self.state_dir,)
        )

    def stage(self, spec: JobSpec, *, project: Path, run_id: str) -> Path:
        """Copy the upload set to ``upload_dir(run_id)`` (replacing one there) with ``SKYIGNORE``."""
        upload = self.upload_set(spec, project=project)
        target = self.upload_dir(run_id)
        if target.exists():
            shutil.rmtree(target)
        upload.copy_to(target)
        (target / ".skyignore").write_text(SKYIGNORE)
        return target

    def task_config(self, spec: JobSpec, *, run_id: str) -> dict[str, Any]:
        """The task as SkyPilot's YAML schema (a dict); secrets are included by value.

        The workdir is ``upload_dir(run_id)``, where ``stage`` copies the project's upload set.

        Raises:
            MountNotConfiguredError: A mount has no bucket in the settings.
            SecretNotSetError: A secret the job names is not set here.
        """
        missing = [name for name in spec.secrets if name not in os.environ]
        if missing:
            raise SecretNotSetError(missing)
        resources: dict[str, Any] = {"use_spot": self.settings.use_spot}
        if spec.resources.accelerator is not None:
            resources["accelerators"] = spec.resources.accelerator.label
        if spec.resources.cpu is not None:
            resources["cpus"] = f"{spec.resources.cpu:g}+"
        if spec.resources.memory_mib is not None:
            resources["memory"] = f"{spec.resources.memory_mib / 1024:g}+"
        if self.settings.infra:
            resources["infra"] = self.settings.infra
        if self.settings.recover:
            resources["job_recovery"] = {
                "strategy": self.settings.recovery_strategy,
                "max_restarts_on_errors": self.settings.max_restarts_on_errors,
            }
        mounts: dict[str, Any] = {
            "/outputs": {"source": self.settings.outputs_bucket, "mode": "MOUNT"}
        }
        for mount, bucket in _BUCKETS.of(spec.mounts, self.settings.buckets):
            mode = "MOUNT" if mount.access == "read-only" else "MOUNT_CACHED"
            mounts[mount.path] = {"source": bucket, "mode": mode}
        config: dict[str, Any] = {
            "name": cluster_name(run_id),
            "workdir": str(self.upload_dir(run_id)),
            "num_nodes": spec.nodes,
            "resources": resources,
            "file_mounts": mounts,
            "envs": {SPEC_ENV: json.dumps(spec.model_dump(mode="json"))},
            "setup": setup_script(spec),
            "run": run_script(run_id, self.settings.worker_python),
        }
        if spec.secrets:
            config["secrets"] = {name: os.environ[name] for name in spec.secrets}
        return config

    def build_task(self, spec: JobSpec, *, project: Path, run_id: str) -> "sky.Task":
        """Stage the upload set and build the validated ``sky.Task`` (no network is reached)."""
        config = self.task_config(spec, run_id=run_id)
        self.stage(spec, project=project, run_id=run_id)
        return _sky().Task.from_yaml_config(config)

    def _launch(self, sky: Any, task: "sky.Task", cluster: str) -> dict[str, str]:  # noqa: ANN401
        """Launch ``task``; its handle's details (a managed job's id, or the cluster's)."""
        if self.settings.recover:
            job_ids, _ = sky.stream_and_get(sky.jobs.launch(task, name=cluster))
            job_id = job_ids[0] if isinstance(job_ids, list) else job_ids
            return {"managed": "true", "job_id": str(job_id), "cluster": cluster}
        request = sky.launch(task, cluster_name=cluster, down=True, idle_minutes_to_autostop=1)
        job_id, _ = sky.stream_and_get(request)
        return {"managed": "false", "job_id": str(job_id), "cluster": cluster}

    def submit(self, spec: JobSpec, *, project: Path) -> RunHandle:
        """Launch the task: ``sky.jobs.launch`` with recovery, else ``sky.launch`` (torn down after)."""
        sky = _sky()
        run = new_run(spec, project)
        try:
            task = self.build_task(spec, project=run.project, run_id=run.run_id)
            cluster = str(task.name)
            try:  # the network: no API server, no credentials, a request SkyPilot refuses
                details = self._launch(sky, task, cluster)
            except Exception as error:
                raise BackendRequestError.of(self.name, "launch the run", error) from error
        finally:  # the launch request has synced the workdir once it returns
            shutil.rmtree(self.upload_dir(run.run_id), ignore_errors=True)
        return run.handle(self.name, details, self.raw_settings)

    def _manifest_state(self, handle: RunHandle) -> RunState:
        """The ended job's state from its manifest; FAILED when it wrote none.

        Raises:
            BackendRequestError: The manifest cannot be read (no CLI, no credentials, no network).
            RecordFormatError: The manifest is damaged.
        """
        path = f"{self.settings.outputs_bucket}/{handle.run_id}/{MANIFEST_NAME}"
        what = f"the manifest of run {handle.run_id} ({path}), so its state is unknown"
        text = read_object(path, backend=self.name, what=what)
        if text is None:  # the job is over and its worker wrote no manifest
            return RunState.FAILED
        try:
            data = json.loads(text)
        except ValueError as error:
            raise RecordFormatError(path, f"is not JSON ({error})", cause=DAMAGED) from None
        return RunState.SUCCEEDED if read_manifest(data).succeeded else RunState.FAILED

    def status(self, handle: RunHandle) -> RunState:
        """Map SkyPilot's job status; once the job is over, the manifest decides.

        Raises:
            BackendRequestError: SkyPilot or the bucket cannot be reached: the state is unknown.
        """
        sky = _sky()
        job_id = int(handle.details["job_id"])
        try:  # the network: SkyPilot's API server, and the cloud behind it
            if handle.details.get("managed") == "true":
                records = sky.stream_and_get(sky.jobs.queue(refresh=False, job_ids=[job_id]))
            else:
                try:
                    records = sky.stream_and_get(sky.queue(handle.details["cluster"]))
                except sky.exceptions.ClusterDoesNotExist:
                    records = []
        except Exception as error:
            operation = f"read the state of run {handle.run_id}, which may still be running"
            raise BackendRequestError.of(self.name, operation, error) from error
        record = next((r for r in records if int(str(_field(r, "job_id"))) == job_id), None)
        if record is None:
            return self._manifest_state(handle)
        return self._map(str(_field(record, "status")), handle)

    def _map(self, status: str, handle: RunHandle) -> RunState:
        name = status.rpartition(".")[2].upper()
        if name in {"CANCELLED", "CANCELLING"}:
            return RunState.CANCELLED
        if name == "SUCCEEDED":
            return self._manifest_state(handle)
        if name.startswith("FAILED"):
            return RunState.FAILED
        if name in {"INIT", "PENDING", "SETTING_UP", "STARTING", "SUBMITTED"}:
            return RunState.PENDING
        return RunState.RUNNING

    def logs(self, handle: RunHandle, *, follow: bool) -> Iterator[str]:
        """The job's log lines from SkyPilot."""
        sky = _sky()
        job_id = int(handle.details["job_id"])
        if handle.details.get("managed") == "true":
            lines = sky.jobs.tail_logs(job_id=job_id, follow=follow, preload_content=False)
        else:
            lines = sky.tail_logs(handle.details["cluster"], job_id, follow, preload_content=False)
        for line in lines or ():
            if line is not None:
                yield line.rstrip("\n")

    def fetch(self, handle: RunHandle, destination: Path) -> Path:
        """Copy ``<outputs_bucket>/<run_id>`` with the cloud's CLI to ``destination/<run_id>``."""
        source = f"{self.settings.outputs_bucket}/{handle.run_id}"
        target = destination / handle.run_id
        target.mkdir(parents=True, exist_ok=True)
        sync_to(source, target, backend=self.name)
        return target

    def cancel(self, handle: RunHandle) -> None:
        """Cancel the job (and tear its cluster down); a finished run is left alone.

        A run whose state cannot be read is cancelled all the same.
        """
        try:
            if self.status(handle).is_final:
                return
        except (BackendRequestError, RecordFormatError):
            pass  # unknown is not over: cancel it
        sky = _sky()
        job_id = int(handle.details["job_id"])
        try:
            if handle.details.get("managed") == "true":
                sky.stream_and_get(sky.jobs.cancel(job_ids=[job_id]))
            else:
                sky.stream_and_get(sky.cancel(handle.details["cluster"], job_ids=[job_id]))
                sky.stream_and_get(sky.down(handle.details["cluster"]))
        except sky.exceptions.ClusterDoesNotExist:
            return  # its cluster is gone: nothing runs
        except Exception as error:
            operation = f"cancel run {handle.run_id}, which may still be running"
            raise BackendRequestError.of(self.name, operation, error) from error


def _field(record: object, name: str) -> object:
    return record[name] if isinstance(record, Mapping) else getattr(record, name)
