"""The run manifest: what the worker did, rewritten atomically after every task.

The records are frozen keyword-only dataclasses read strictly without pydantic, so that
``substrax-compute status`` starts quickly; ``to_dict`` gives the JSON form.

Example:
    >>> from substrax.compute import JobManifest, read_manifest
    >>> manifest = JobManifest(job="demo")
    >>> manifest.succeeded
    False
    >>> read_manifest(manifest.to_dict()) == manifest
    True
"""

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from substrax.support import write_atomically

from ._records import read_fields, strings
from ._run_errors import RecordFormatError, RecordVersionError


MANIFEST_VERSION = 4
"""The version of ``manifest.json`` this release writes and reads."""

MANIFEST_NAME = "manifest.json"
"""The manifest's file name: in a node's output root, and in a fetched run's directory."""
_OTHER_RELEASE = "was not written by this substrax-compute release"
DAMAGED = f"it is damaged, or {_OTHER_RELEASE}"
"""Why a manifest may not read: the ``cause`` of its :class:`RecordFormatError`."""
STDOUT_LOG = "stdout.log"
"""A task's standard output, in its directory ``<outputs>/<task>/`` (secrets redacted).

Example:
    >>> from substrax.compute import DEVICES_LOG, STDERR_LOG, STDOUT_LOG
    >>> STDOUT_LOG, STDERR_LOG, DEVICES_LOG
    ('stdout.log', 'stderr.log', 'devices.log')
"""
STDERR_LOG = "stderr.log"
"""A task's standard error, beside its ``STDOUT_LOG``."""
DEVICES_LOG = "devices.log"
"""The device probe's output when it failed, in the output root beside ``MANIFEST_NAME``."""


_ONLY_WHEN_LOST = frozenset({"lost_log_bytes", "lost_log_reason"})  # what older releases read


class TaskStatus(StrEnum):
    """How one task ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunDevices:
    """What the device probe saw on the machine the worker ran on.

    Example:
        >>> from substrax.compute import RunDevices
        >>> RunDevices.from_dict({"platform": "cpu", "kinds": ["cpu"], "count": 8}).count
        8
    """

    platform: str
    kinds: tuple[str, ...]
    count: int

    @classmethod
    def from_dict(cls, data: object, *, source: object = "device probe") -> "RunDevices":
        """Read the probe's JSON object strictly.

        Raises:
            RecordFormatError: A field is unknown, missing or of the wrong type.
        """
        fields = read_fields(
            data, source=source, required={"platform": str, "kinds": list, "count": int}
        )
        return cls(
            platform=fields["platform"],
            kinds=strings(fields["kinds"], source=source, field="kinds"),
            count=fields["count"],
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskOutcome:
    """One task's result; ``outputs`` lists its files relative to its directory, logs excluded.

    ``lost_log_bytes`` counts the bytes of the task's output that never reached its logs, once
    writing them failed (a full disk, a file size limit), and ``lost_log_reason`` says why;
    ``manifest.json`` holds the two only when output was lost.
    """

    name: str
    argv: tuple[str, ...]
    status: TaskStatus
    returncode: int | None
    seconds: float
    outputs: tuple[str, ...] = ()
    lost_log_bytes: int = 0
    lost_log_reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobManifest:
    """The worker's record of a run on one node (node 0 writes ``outputs/manifest.json``).

    In a multi-node job, node 0's manifest is the job's: when a node's worker fails, the
    launcher stops the others and records there the node that failed first (``failed_node``:
    the one whose task failed first, or whose worker exited first without a failed task) and
    its worker's exit status (``failed_node_status``; negative: killed by that signal).
    """

    schema_version: Literal[4] = MANIFEST_VERSION
    job: str
    node: int = 0
    nodes: int = 1
    tasks: tuple[TaskOutcome, ...] = ()
    finished: bool = False
    devices: RunDevices | None = None
    failed_node: int | None = None
    failed_node_status: int | None = None

    @property
    def succeeded(self) -> bool:
        """Whether the run finished with every task succeeded and no node of the job failed."""
        return (
            self.finished
            and self.failed_node is None
            and all(t.status is TaskStatus.SUCCEEDED for t in self.tasks)
        )

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON-ready data (what ``manifest.json`` holds).

        Example:
            >>> from substrax.compute import JobManifest
            >>> JobManifest(job="j").to_dict()["tasks"]
            []
        """
        data = dataclasses.asdict(self)
        data["tasks"] = [
            {
                **{k: v for k, v in task.items() if k not in _ONLY_WHEN_LOST or v},
                "argv": list(task["argv"]),
                "outputs": list(task["outputs"]),
            }
            for task in data["tasks"]
        ]
        if data["devices"] is not None:
            data["devices"]["kinds"] = list(data["devices"]["kinds"])
        return data


def _outcome(data: object, source: object) -> TaskOutcome:
    fields = read_fields(
        data,
        source=source,
        required={
            "name": str,
            "argv": list,
            "status": str,
            "returncode": (int, type(None)),
            "seconds": float,
        },
        optional={"outputs": list, "lost_log_bytes": int, "lost_log_reason": (str, type(None))},
    )
    try:
        status = TaskStatus(fields["status"])
    except ValueError:
        raise RecordFormatError(source, f"task status {fields['status']!r} is unknown") from None
    return TaskOutcome(
        name=fields["name"],
        argv=strings(fields["argv"], source=source, field="argv"),
        status=status,
        returncode=fields["returncode"],
        seconds=float(fields["seconds"]),
        outputs=strings(fields.get("outputs", []), source=source, field="outputs"),
        lost_log_bytes=fields.get("lost_log_bytes", 0),
        lost_log_reason=fields.get("lost_log_reason"),
    )


def read_manifest(data: Mapping[str, Any] | Path) -> JobManifest:
    """Read a manifest (a mapping or a ``manifest.json`` path), strictly.

    Raises:
        RecordVersionError: The version is not this release's (the message names the file).
        RecordFormatError: The record is malformed (both a ``ValueError`` and a ``TypeError``),
            or no manifest at all (no ``schema_version``: damaged, or another file).

    Example:
        >>> from substrax.compute import read_manifest
        >>> read_manifest({"schema_version": 1, "job": "x"})
        Traceback (most recent call last):
        ...
        substrax.compute.RecordVersionError: manifest version 1 is not 4: fetch it with the substrax release that ran it
    """
    source: object = "manifest"
    loaded: object = data
    if isinstance(data, Path):
        try:
            source, loaded = data, json.loads(data.read_text())
        except ValueError as error:  # cut short or damaged
            raise RecordFormatError(
                data,
                f"is not JSON ({error})",
                cause=f"it is damaged or cut short, or {_OTHER_RELEASE}",
            ) from None
    if isinstance(loaded, Mapping):
        loaded = dict(loaded)  # pyright: ignore[reportUnknownArgumentType]
        if "schema_version" not in loaded:  # every release's manifest has one
            raise RecordFormatError(
                source,
                "is no run manifest (it has no schema_version)",
                cause=f"it is damaged or another file, or {_OTHER_RELEASE}",
            )
        if loaded["schema_version"] != MANIFEST_VERSION:
            raise RecordVersionError(
                "manifest" if source == "manifest" else f"manifest {source}",
                loaded["schema_version"],
                MANIFEST_VERSION,
                "fetch it with the substrax release that ran it",
            )
    optional_int = (int, type(None))
    fields = read_fields(
        loaded,
        source=source,
        required={"schema_version": int, "job": str},
        optional={
            "node": int,
            "nodes": int,
            "tasks": list,
            "finished": bool,
            "devices": (dict, type(None)),
            "failed_node": optional_int,
            "failed_node_status": optional_int,
        },
    )
    devices = fields.get("devices")
    return JobManifest(
        job=fields["job"],
        node=fields.get("node", 0),
        nodes=fields.get("nodes", 1),
        tasks=tuple(_outcome(task, source) for task in fields.get("tasks", [])),
        finished=fields.get("finished", False),
        devices=None if devices is None else RunDevices.from_dict(devices, source=source),
        failed_node=fields.get("failed_node"),
        failed_node_status=fields.get("failed_node_status"),
    )


def write_manifest(path: Path, manifest: JobManifest) -> None:
    """Write ``manifest`` to ``path`` atomically (readers never see half a file).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.compute import MANIFEST_NAME, JobManifest, read_manifest
        >>> from substrax.compute._manifest import write_manifest
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     target = Path(directory) / MANIFEST_NAME
        ...     write_manifest(target, JobManifest(job="j"))
        ...     read_manifest(target).job
        'j'
    """
    write_atomically(path, json.dumps(manifest.to_dict(), indent=2))
