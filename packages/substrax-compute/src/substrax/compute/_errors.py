"""Every error substrax.compute raises, each a subclass of the builtin it once was.

Each carries the offending values as attributes and says what to do; all are exported from
``substrax.compute``, whose name they show in tracebacks. Those of the configuration, jobs,
backends and paths are declared here; those of stored runs and records in ``_run_errors``.
"""

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from substrax.support import StructuredError, describe_error


_ROOT = "tool.substrax.compute"


class _ComputeError(StructuredError, public_module="substrax.compute"):
    """The base of every error here: each shows as ``substrax.compute``'s, where users import it."""


class ComputeConfigError(_ComputeError, ValueError):
    """A ``[tool.substrax.compute]`` key is unknown or holds a bad value.

    Attributes:
        path: The TOML path of the first offending key.
        reason: What is wrong with it.
        problems: Every ``(path, reason)`` found.
        source: The file the table was read from (a pyproject.toml), or None.

    The message is one line: ``path: reason (in FILE)``, or with several problems ``N problems
    in FILE [tool.substrax.compute]: path: reason; path: reason``.
    """

    problems: Sequence[tuple[str, str]]
    source: object = None
    path: str = dataclasses.field(init=False)
    reason: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.path, self.reason = self.problems[0]
        super().__post_init__()

    def _message(self) -> str:
        listed = "; ".join(f"{path}: {reason}" for path, reason in self.problems)
        if len(self.problems) > 1:
            where = f"{self.source} [{_ROOT}]" if self.source is not None else f"[{_ROOT}]"
            return f"{len(self.problems)} problems in {where}: {listed}"
        return listed if self.source is None else f"{listed} (in {self.source})"


class ConfigFileError(_ComputeError, ValueError):
    """A file the configuration is read from (pyproject.toml, uv.lock) is unreadable or malformed.

    Malformed is not valid TOML, or valid TOML of the wrong shape (``package = "x"`` in uv.lock).

    Attributes:
        path: The file.
        line: The 1-based line of the first error, when the parser gave one.
        column: The 1-based column of the first error, when the parser gave one.
        reason: The parser's (or the operating system's) description, or what is wrong with
            the TOML's shape and what to do.
        malformed: True when the file is valid TOML of the wrong shape.
    """

    path: Path
    reason: str
    line: int | None = None
    column: int | None = None
    malformed: bool = False

    def _message(self) -> str:
        if self.malformed:
            return f"{self.path}: {self.reason}"
        if self.line is None:
            return f"{self.path}: cannot be read: {self.reason}"
        return (
            f"{self.path}:{self.line}:{self.column}: not valid TOML: {self.reason}; "
            "fix the file and retry"
        )


class ProjectFileNotFoundError(_ComputeError, FileNotFoundError):
    """A file or directory the project must have is missing (pyproject.toml, uv.lock, examples).

    Attributes:
        path: What was looked for.
        message: The error's text, naming the file and what to do.
    """

    path: Path
    message: str


class ComputeTableMissingError(_ComputeError, LookupError):
    """``pyproject.toml`` has no ``[tool.substrax.compute]`` table.

    Attributes:
        pyproject: The file read.
        table: The table looked for.
    """

    template = (
        "{pyproject} has no [{table}] table; declare a job there, e.g. "
        '[{table}.jobs.demo] with examples = ["examples"] and timeout_seconds = 600'
    )

    pyproject: Path
    table: str


class SubstraxNotLockedError(_ComputeError, LookupError):
    """The project's ``uv.lock`` does not pin substrax-compute, so a worker elsewhere can't run.

    Attributes:
        lock: The lock file read.
    """

    template = "substrax-compute is not in {lock}: `uv add substrax-compute` so the worker can run"

    lock: Path


class JobNotFoundError(_ComputeError, KeyError):
    """No job of that name is configured.

    Attributes:
        job: The name asked for.
        known: The configured job names.
        table: The table the jobs are configured in.
    """

    job: str
    known: Sequence[str]
    table: str

    def _message(self) -> str:
        known = ", ".join(self.known) or "none"
        return f"no job {self.job!r} in [{self.table}.jobs]; configured: {known}"


class UnknownBackendError(_ComputeError, LookupError):
    """No backend of that name is registered.

    Attributes:
        name: The name asked for.
        known: The registered names.
        group: The entry-point group backends register in.
    """

    name: str
    known: Sequence[str]
    group: str = "substrax.compute.backends"

    def _message(self) -> str:
        return (
            f"no compute backend {self.name!r}; registered: {', '.join(self.known) or 'none'} "
            f"(a provider registers one in the {self.group!r} entry-point group)"
        )


class BackendFactoryError(_ComputeError, TypeError):
    """A registered backend factory returned something that is not a ``ComputeBackend``.

    Attributes:
        name: The backend's registered name.
        factory: The entry point's value (``module:attribute``).
        returned: The type name of what it returned.
    """

    template = (
        "the {name!r} backend factory {factory} returned {returned}, which is not a "
        "ComputeBackend; fix the factory registered in the entry point"
    )

    name: str
    factory: str
    returned: str


class UnknownPlatformError(_ComputeError, ValueError):
    """A ``runtime.platforms`` entry is not a platform jax knows.

    Attributes:
        platform: The offending name.
        known: The names jax knows (``KNOWN_PLATFORMS``).
    """

    platform: str
    known: tuple[str, ...]

    def _message(self) -> str:
        platform, known = self.platform, self.known
        hint = next((f"; did you mean {k!r}?" for k in known if k.lower() == platform.lower()), "")
        return (
            f"JaxRuntime.platforms entry {platform!r} is not a platform jax knows{hint} "
            f"(use one of: {', '.join(sorted(known, key=str.lower))})"
        )


class RuntimeFieldError(_ComputeError, ValueError):
    """A job's ``runtime`` table names a field ``JaxRuntime`` lacks, or one it refuses.

    Attributes:
        message: The error's text.
        fields: The offending field names (empty when ``JaxRuntime`` refused a value).
    """

    message: str
    fields: tuple[str, ...] = ()


class AcceleratorFormatError(_ComputeError, ValueError):
    """An ``--accelerator`` value is not ``KIND`` or ``KIND:N``.

    Attributes:
        text: The value given.
    """

    template = (
        "accelerator {text!r} must read KIND or KIND:N, KIND of letters, digits, '.', '_' or "
        "'-' and N from 1 to 64, e.g. H100:8"
    )

    text: str


class SecretNotSetError(_ComputeError, LookupError):
    """A secret the job names is not set in the environment that must pass it on.

    Attributes:
        names: The missing variable names.
        where: Whose environment (``"this environment"``, ``"the worker's environment"``).
    """

    names: Sequence[str]
    where: str = "this environment"

    def _message(self) -> str:
        return (
            f"secrets {', '.join(self.names)} are not set in {self.where}; export them before "
            "submitting"
        )


class MountNotConfiguredError(_ComputeError, LookupError):
    """A job mount has no source in the backend's settings (a volume, a bucket, a directory).

    Attributes:
        mount: The mount's name.
        message: The error's text.
        setting: The setting that would give it a source.
    """

    mount: str
    message: str
    setting: str


class MountDirectoryNotFoundError(_ComputeError, FileNotFoundError):
    """A job mount has no directory on this machine for the local backend.

    Attributes:
        mount: The mount's name.
        path: The directory looked for.
    """

    template = (
        "mount {mount!r} has no directory here ({path}): set backends.local.mounts."
        "{mount} to a directory on this machine"
    )

    mount: str
    path: Path


class MountPathError(_ComputeError, ValueError):
    """A local mount's source directory lies outside the project.

    Attributes:
        mount: The mount's name.
        source: The configured source.
        project: The project root.
    """

    template = (
        "local mount {mount!r} source {source!r} escapes {project}; name a directory "
        "inside the project or an absolute path"
    )

    mount: str
    source: str
    project: Path


class DirectoryPathError(_ComputeError, NotADirectoryError):
    """A path that must be (or become) a directory is a file, or lies under one.

    Attributes:
        path: The directory asked for.
        blocker: The existing file in the way (``path`` itself or one of its parents).
        what: What the directory is for, e.g. ``"--into"``.
        fix: What to do about it.
    """

    path: Path
    blocker: Path
    what: str
    fix: str

    def _message(self) -> str:
        if self.blocker == self.path:
            return f"{self.what} {self.path} is a file, not a directory; {self.fix}"
        return (
            f"{self.what} {self.path} cannot be a directory: {self.blocker} is a file; {self.fix}"
        )


class ProjectDirectoryError(_ComputeError, NotADirectoryError):
    """The project root handed to a backend is not a directory.

    Attributes:
        project: The path given.
    """

    template = "project {project} is not a directory; pass the project root"

    project: Path


class UploadFileNotFoundError(_ComputeError, FileNotFoundError):
    """A file a job asked to upload by name is not a file inside the project.

    Attributes:
        name: The name as the job gave it.
        project: The project root.
    """

    template = (
        "include_files names {name!r}, which is not a file in {project}; name files by "
        "their normalised path relative to the project root, without '..'"
    )

    name: str
    project: Path


class OutputPathError(_ComputeError, ValueError):
    """An output path leaves the root it must stay in.

    Attributes:
        path: The offending path.
        root: The root it must stay inside.
    """

    template = "{path} is outside {root}; outputs must stay inside their run directory"

    path: Path
    root: Path


class FetchToolNotFoundError(_ComputeError, FileNotFoundError):
    """The cloud command a fetch needs (``gcloud``, ``aws``) is not on ``PATH``.

    Attributes:
        command: The missing command.
        source: The bucket path being fetched.
    """

    template = "fetching from {source} needs the `{command}` command; install it and log in"

    command: str
    source: str


class BackendRequestError(_ComputeError, RuntimeError):
    """A backend's SDK failed a request it sent (``cause``: its error, on one line)."""

    template = "the {backend} backend could not {operation}: {cause}"

    backend: str
    operation: str
    cause: str

    @classmethod
    def of(cls, backend: str, operation: str, error: BaseException) -> "BackendRequestError":
        """The error for ``error``, raised by ``backend``'s SDK while it tried ``operation``."""
        return cls(backend, operation, describe_error(error))
