"""The ``ComputeBackend`` protocol, run handles and the run store.

Every method but ``submit`` works from a ``RunHandle`` alone, in another process: the handle
carries the backend's settings as they were at submission, so a stored run is never re-routed
by settings changed afterwards.

Example:
    >>> import tempfile
    >>> from datetime import datetime
    >>> from pathlib import Path
    >>> from substrax.compute import RunHandle, RunStore
    >>> from substrax.compute._backend import UTC
    >>> handle = RunHandle(run_id="demo-20260101T000000Z-abcdef", backend="local", job="demo",
    ...                    project="/p", submitted_at=datetime.now(UTC))
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     store = RunStore(Path(directory))
    ...     store.save(handle)
    ...     store.load(handle.run_id) == handle
    True
"""

import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, runtime_checkable

from substrax.support import write_atomically

from ._paths import check_file_name, check_state_dir
from ._records import JsonValue, read_fields, string_map
from ._run_errors import RecordFormatError, RunNotFoundError, RunRecordError, RunStoreError


if TYPE_CHECKING:
    from ._spec import JobSpec


STATE_DIR_ENV = "SUBSTRAX_STATE_DIR"
HANDLE_VERSION = 2


class RunState(StrEnum):
    """Where a run stands."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        """Whether the run has ended (succeeded, failed or cancelled)."""
        return self in {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunHandle:
    """What a backend needs to find a run again, saved as JSON by ``RunStore``.

    Attributes:
        run_id: ``<job>-<UTC time>-<6 hex>``.
        backend: The registered backend name.
        job: The job's name.
        project: The project root the job was submitted from.
        submitted_at: When it was submitted (UTC).
        details: Backend-specific identifiers (pid, app id, cluster name...).
        settings: The backend settings at submission; the backend is rebuilt from these.

    Example:
        >>> from datetime import UTC, datetime
        >>> from substrax.compute import RunHandle
        >>> handle = RunHandle(run_id="j-1", backend="local", job="j", project="/p",
        ...                    submitted_at=datetime(2026, 1, 1, tzinfo=UTC))
        >>> RunHandle.from_json(handle.to_json()) == handle
        True
    """

    schema_version: Literal[2] = HANDLE_VERSION
    run_id: str
    backend: str
    job: str
    project: str
    submitted_at: datetime
    details: dict[str, str] = field(default_factory=dict[str, str])
    settings: dict[str, JsonValue] = field(default_factory=dict[str, JsonValue])

    def to_json(self) -> str:
        """The handle as the JSON text ``RunStore`` saves."""
        data: dict[str, Any] = {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "backend": self.backend,
            "job": self.job,
            "project": self.project,
            "submitted_at": self.submitted_at.isoformat(),
            "details": self.details,
            "settings": self.settings,
        }
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str, *, source: object = "run handle") -> "RunHandle":
        """Read a handle saved by ``to_json``, strictly.

        Raises:
            RecordFormatError: The text is not a handle this release wrote.
        """
        try:
            loaded: object = json.loads(text)
        except json.JSONDecodeError as error:
            raise RecordFormatError(source, f"not JSON ({error})") from None
        fields = read_fields(
            loaded,
            source=source,
            required={
                "schema_version": int,
                "run_id": str,
                "backend": str,
                "job": str,
                "project": str,
                "submitted_at": str,
            },
            optional={"details": dict, "settings": dict},
        )
        if fields["schema_version"] != HANDLE_VERSION:
            raise RecordFormatError(
                source, f"handle version {fields['schema_version']} is not {HANDLE_VERSION}"
            )
        try:
            submitted_at = datetime.fromisoformat(fields["submitted_at"])
        except ValueError:
            raise RecordFormatError(
                source, f"submitted_at {fields['submitted_at']!r} is not an ISO time"
            ) from None
        return cls(
            run_id=fields["run_id"],
            backend=fields["backend"],
            job=fields["job"],
            project=fields["project"],
            submitted_at=submitted_at,
            details=string_map(fields.get("details", {}), source=source, field="details"),
            settings=cast("dict[str, JsonValue]", fields.get("settings", {})),
        )


def new_run_id(job: str, *, now: datetime | None = None) -> str:
    """A fresh run id, ``<job>-YYYYmmddTHHMMSSZ-<6 hex>``.

    Example:
        >>> from datetime import datetime
        >>> from substrax.compute._backend import UTC, new_run_id
        >>> new_run_id("demo", now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))[:22]
        'demo-20260102T030405Z-'
    """
    moment = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{check_file_name('job', job)}-{moment}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NewRun:
    """A run about to be submitted: its id, spec and project."""

    run_id: str
    spec: "JobSpec"
    project: Path

    def handle(
        self,
        backend: str,
        details: Mapping[str, str],
        settings: Mapping[str, JsonValue] | None = None,
    ) -> RunHandle:
        """The handle for this run once ``backend`` accepted it.

        ``settings`` are the backend's, recorded for the run's later commands (a backend written
        for 0.1.22 gives none). A relative ``state_dir`` setting is recorded as the directory it
        named here: read from another working directory it would name another one, and the run
        would be lost.
        """
        recorded = dict(settings or {})
        if isinstance(state_dir := recorded.get("state_dir"), str) and state_dir:
            recorded["state_dir"] = str(Path(state_dir).expanduser().resolve())
        return RunHandle(
            run_id=self.run_id,
            backend=backend,
            job=self.spec.name,
            project=str(self.project),
            submitted_at=datetime.now(UTC),
            details=dict(details),
            settings=recorded,
        )


def with_settings(handle: RunHandle, settings: Mapping[str, JsonValue]) -> RunHandle:
    """``handle``, with the configured ``settings`` if its backend recorded none (0.1.22's).

    ``status``, ``logs`` and ``fetch`` build the backend again from the handle's settings.
    """
    return handle if handle.settings or not settings else replace(handle, settings=dict(settings))


def new_run(spec: "JobSpec", project: Path) -> NewRun:
    """A ``NewRun`` with a fresh id for ``spec``."""
    return NewRun(run_id=new_run_id(spec.name), spec=spec, project=project.resolve())


def stage_run(runs_dir: Path, run: NewRun) -> Path:
    """Create ``runs_dir/<run_id>`` and write ``spec.json`` there; return the directory."""
    run_dir = runs_dir / run.run_id
    run_dir.mkdir(parents=True, exist_ok=False)
    write_atomically(run_dir / "spec.json", json.dumps(run.spec.model_dump(mode="json"), indent=2))
    return run_dir


@runtime_checkable
class ComputeBackend(Protocol):
    """A place jobs run. Everything but ``submit`` must work from a handle in a new process."""

    name: str

    def submit(self, spec: "JobSpec", *, project: Path) -> RunHandle:
        """Start ``spec`` from ``project`` and return its handle without waiting."""
        ...

    def status(self, handle: RunHandle) -> RunState:
        """The run's state now."""
        ...

    def logs(self, handle: RunHandle, *, follow: bool) -> Iterator[str]:
        """The run's log lines; with ``follow``, until the run is final."""
        ...

    def fetch(self, handle: RunHandle, destination: Path) -> Path:
        """Copy the run's outputs to ``destination/<run_id>`` and return that directory."""
        ...

    def cancel(self, handle: RunHandle) -> None:
        """Stop the run; nothing happens if it has already ended."""
        ...


type BackendFactory = Callable[[Mapping[str, JsonValue]], ComputeBackend]


def default_state_dir() -> Path:
    """``$SUBSTRAX_STATE_DIR``, else this user's state directory for ``substrax`` (platformdirs).

    On Linux that is ``$XDG_STATE_HOME/substrax``, else ``~/.local/state/substrax``; on macOS
    ``~/Library/Application Support/substrax``; on Windows under ``%LOCALAPPDATA%``.

    Example:
        >>> from pathlib import Path
        >>> from substrax.compute import default_state_dir
        >>> isinstance(default_state_dir(), Path)
        True
    """
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV]).expanduser().resolve()
    import platformdirs  # noqa: PLC0415 - only where no $SUBSTRAX_STATE_DIR is set

    return platformdirs.user_state_path("substrax").expanduser().resolve()


def backend_state_dir(setting: JsonValue | os.PathLike[str], name: str) -> Path:
    """A backend's own state directory: its ``state_dir`` setting, else ``<state>/compute/<name>``.

    Example:
        >>> from substrax.compute._backend import backend_state_dir
        >>> backend_state_dir("/tmp/s", "local").as_posix()
        '/tmp/s'
    """
    if state_dir := check_state_dir(setting):  # a TypeError for a setting of another type
        return Path(state_dir).expanduser().resolve()
    return default_state_dir() / "compute" / name


class RunStore:
    """One JSON file per run handle under ``<state>/compute/runs``, written atomically.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.compute import RunStore
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     RunStore(Path(directory)).handles()
        []
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else default_state_dir() / "compute" / "runs"

    def save(self, handle: RunHandle) -> None:
        """Write (or replace) the handle's file (ValueError: a run id that is no file name)."""
        name = check_file_name("run_id", handle.run_id)
        write_atomically(self.root / f"{name}.json", handle.to_json())

    def load(self, run_id: str) -> RunHandle:
        """The saved handle for ``run_id``.

        Raises:
            RunNotFoundError: No run of that id was saved; the message names the store.
            RunRecordError: The saved record can't be read or is not a handle this release
                wrote (a truncated file, a directory in its place); the message names the file
                and says to remove it.
        """
        path = self.root / f"{run_id}.json"
        if "/" in run_id or not (path.is_file() or path.is_dir()):
            raise RunNotFoundError(run_id, self.root)
        return self._read(path)

    @staticmethod
    def _read(path: Path) -> RunHandle:
        if path.is_dir():
            raise RunRecordError(path, "it is a directory, not a run record")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise RunRecordError(path, f"it can't be read ({error})") from None
        try:
            return RunHandle.from_json(text, source=path)
        except RecordFormatError as error:
            raise RunRecordError(path, error.problem) from None

    def scan(self) -> tuple[list[RunHandle], list[RunRecordError]]:
        """Every readable handle, newest first, and a ``RunRecordError`` per damaged record.

        Raises:
            RunStoreError: The store's directory exists but can't be listed (a file stands in
                its place, or this user may not read it).

        Example:
            >>> import tempfile
            >>> from pathlib import Path
            >>> from substrax.compute import RunStore
            >>> with tempfile.TemporaryDirectory() as directory:
            ...     _ = (Path(directory) / "j-1.json").write_text('{"run_id": ')
            ...     handles, damaged = RunStore(Path(directory)).scan()
            ...     handles, [error.path.name for error in damaged]
            ([], ['j-1.json'])
        """
        if not self.root.exists():
            return [], []
        if not self.root.is_dir():
            raise RunStoreError(self.root, "it is not a directory")
        try:
            paths = sorted(path for path in self.root.iterdir() if path.suffix == ".json")
        except OSError as error:
            raise RunStoreError(self.root, error.strerror or str(error)) from None
        handles: list[RunHandle] = []
        damaged: list[RunRecordError] = []
        for path in paths:
            try:
                handles.append(self._read(path))
            except RunRecordError as error:
                damaged.append(error)
        return sorted(handles, key=lambda h: h.submitted_at, reverse=True), damaged

    def handles(self) -> list[RunHandle]:
        """Every saved handle, newest first.

        Raises:
            RunRecordError: A saved record is damaged (``scan`` lists the others).
            RunStoreError: The store's directory can't be listed.
        """
        handles, damaged = self.scan()
        if damaged:
            raise damaged[0]
        return handles
