"""The run manifest: what the worker did, rewritten atomically after every task.

Example:
    >>> manifest = JobManifest(job="demo")
    >>> manifest.succeeded
    False
    >>> read_manifest(manifest.model_dump(mode="json")) == manifest
    True
"""

import json
import os
import tempfile
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, cast

from .spec import Record


MANIFEST_VERSION = 4
"""The version of ``manifest.json`` this release writes and reads."""

MANIFEST_NAME = "manifest.json"


class TaskStatus(StrEnum):
    """How one task ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    CANCELLED = "cancelled"


class RunDevices(Record):
    """What the device probe saw on the machine the worker ran on."""

    platform: str
    kinds: tuple[str, ...]
    count: int


class TaskOutcome(Record):
    """One task's result; ``outputs`` lists its files relative to its directory, logs excluded."""

    name: str
    argv: tuple[str, ...]
    status: TaskStatus
    returncode: int | None
    seconds: float
    outputs: tuple[str, ...] = ()


class JobManifest(Record):
    """The worker's record of a run on one node (node 0 writes ``outputs/manifest.json``).

    In a multi-node job, node 0's manifest is the job's: when a node's worker fails, the
    launcher stops the others and records there the first node that failed
    (``failed_node``) and its worker's exit status (``failed_node_status``; negative: killed
    by that signal).
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


def read_manifest(data: Mapping[str, Any] | Path) -> JobManifest:
    """Read a manifest (a mapping or a ``manifest.json`` path), strictly.

    Raises:
        ValueError: The version is not this release's or the record is malformed.

    Example:
        >>> read_manifest({"schema_version": 1, "job": "x"})
        Traceback (most recent call last):
        ...
        ValueError: manifest version 1 is not 4: fetch it with the substrax release that ran it
    """
    if isinstance(data, Path):
        loaded = json.loads(data.read_text())
        if not isinstance(loaded, dict):
            raise TypeError(f"{data} does not hold a manifest object")
        data = cast("dict[str, Any]", loaded)
    version = data.get("schema_version")
    if version != MANIFEST_VERSION:
        raise ValueError(
            f"manifest version {version!r} is not {MANIFEST_VERSION}: "
            "fetch it with the substrax release that ran it"
        )
    return JobManifest.model_validate_json(json.dumps(dict(data)), strict=True)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then replace ``path`` with it.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "x.json"
        >>> write_atomically(target, "{}")
        >>> target.read_text()
        '{}'
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_manifest(path: Path, manifest: JobManifest) -> None:
    """Write ``manifest`` to ``path`` atomically (readers never see half a file).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / MANIFEST_NAME
        >>> write_manifest(target, JobManifest(job="j"))
        >>> read_manifest(target).job
        'j'
    """
    write_atomically(path, json.dumps(manifest.model_dump(mode="json"), indent=2))
