"""Every error substrax.compute raises, each a subclass of the builtin it once was.

Each carries the offending values as attributes and says what to do; all are exported from
``substrax.compute``, whose name they show in tracebacks.
"""

from pathlib import Path

from substrax.support import PicklableError


_ROOT = "tool.substrax.compute"


class ComputeConfigError(PicklableError, ValueError):
    """A ``[tool.substrax.compute]`` key is unknown or holds a bad value.

    Attributes:
        path: The TOML path of the first offending key.
        reason: What is wrong with it.
        problems: Every ``(path, reason)`` found.
        source: The file the table was read from (a pyproject.toml), or None.

    The message is one line: ``path: reason (in FILE)``, or with several problems ``N problems
    in FILE [tool.substrax.compute]: path: reason; path: reason``.
    """

    __module__ = "substrax.compute"

    def __init__(self, problems: list[tuple[str, str]], *, source: object = None) -> None:
        self.problems, self.source = problems, source
        self.path, self.reason = problems[0]
        listed = "; ".join(f"{path}: {reason}" for path, reason in problems)
        if len(problems) > 1:
            where = f"{source} [{_ROOT}]" if source is not None else f"[{_ROOT}]"
            message = f"{len(problems)} problems in {where}: {listed}"
        else:
            message = listed if source is None else f"{listed} (in {source})"
        super().__init__(message)


class ConfigFileError(PicklableError, ValueError):
    """A file the configuration is read from (pyproject.toml, uv.lock) is not valid TOML or unreadable.

    Attributes:
        path: The file.
        line: The 1-based line of the first error, when the parser gave one.
        column: The 1-based column of the first error, when the parser gave one.
        reason: The parser's (or the operating system's) description.
    """

    __module__ = "substrax.compute"

    def __init__(
        self, path: Path, reason: str, *, line: int | None = None, column: int | None = None
    ) -> None:
        self.path, self.reason, self.line, self.column = path, reason, line, column
        if line is None:
            message = f"{path}: cannot be read: {reason}"
        else:
            message = f"{path}:{line}:{column}: not valid TOML: {reason}; fix the file and retry"
        super().__init__(message)


class ProjectFileNotFoundError(PicklableError, FileNotFoundError):
    """A file or directory the project must have is missing (pyproject.toml, uv.lock, examples).

    Attributes:
        path: What was looked for.
    """

    __module__ = "substrax.compute"

    def __init__(self, path: Path, message: str) -> None:
        self.path = path
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0])


class ComputeTableMissingError(PicklableError, LookupError):
    """``pyproject.toml`` has no ``[tool.substrax.compute]`` table.

    Attributes:
        pyproject: The file read.
    """

    __module__ = "substrax.compute"

    def __init__(self, pyproject: Path, table: str) -> None:
        self.pyproject = pyproject
        super().__init__(
            f"{pyproject} has no [{table}] table; declare a job there, e.g. "
            f'[{table}.jobs.demo] with examples = ["examples"] and timeout_seconds = 600'
        )


class SubstraxNotLockedError(PicklableError, LookupError):
    """The project's ``uv.lock`` does not pin substrax-compute, so a worker elsewhere can't run.

    Attributes:
        lock: The lock file read.
    """

    __module__ = "substrax.compute"

    def __init__(self, lock: Path) -> None:
        self.lock = lock
        super().__init__(
            f"substrax-compute is not in {lock}: `uv add substrax-compute` so the worker can run"
        )


class JobNotFoundError(PicklableError, KeyError):
    """No job of that name is configured.

    Attributes:
        job: The name asked for.
        known: The configured job names.
    """

    __module__ = "substrax.compute"

    def __init__(self, job: str, known: list[str], table: str) -> None:
        self.job, self.known = job, known
        super().__init__(
            f"no job {job!r} in [{table}.jobs]; configured: {', '.join(known) or 'none'}"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class RunNotFoundError(PicklableError, KeyError):
    """No run of that id was saved in the run store.

    Attributes:
        run_id: The id asked for.
        root: The store's directory.
    """

    __module__ = "substrax.compute"

    def __init__(self, run_id: str, root: Path) -> None:
        self.run_id, self.root = run_id, root
        super().__init__(f"no run {run_id!r} in {root}; `substrax-compute list` shows them")

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownBackendError(PicklableError, LookupError):
    """No backend of that name is registered.

    Attributes:
        name: The name asked for.
        known: The registered names.
    """

    __module__ = "substrax.compute"

    def __init__(
        self, name: str, known: list[str], group: str = "substrax.compute.backends"
    ) -> None:
        self.name, self.known = name, known
        super().__init__(
            f"no compute backend {name!r}; registered: {', '.join(known) or 'none'} "
            f"(a provider registers one in the {group!r} entry-point group)"
        )


class BackendFactoryError(PicklableError, TypeError):
    """A registered backend factory returned something that is not a ``ComputeBackend``.

    Attributes:
        name: The backend's registered name.
        factory: The entry point's value (``module:attribute``).
        returned: The type name of what it returned.
    """

    __module__ = "substrax.compute"

    def __init__(self, name: str, factory: str, returned: str) -> None:
        self.name, self.factory, self.returned = name, factory, returned
        super().__init__(
            f"the {name!r} backend factory {factory} returned {returned}, which is not a "
            "ComputeBackend; fix the factory registered in the entry point"
        )


class UnknownPlatformError(PicklableError, ValueError):
    """A ``runtime.platforms`` entry is not a platform jax knows.

    Attributes:
        platform: The offending name.
        known: The names jax knows (``KNOWN_PLATFORMS``).
    """

    __module__ = "substrax.compute"

    def __init__(self, platform: str, known: tuple[str, ...]) -> None:
        self.platform, self.known = platform, known
        hint = next((f"; did you mean {k!r}?" for k in known if k.lower() == platform.lower()), "")
        super().__init__(
            f"JaxRuntime.platforms entry {platform!r} is not a platform jax knows{hint} "
            f"(use one of: {', '.join(sorted(known, key=str.lower))})"
        )


class RuntimeFieldError(PicklableError, ValueError):
    """A job's ``runtime`` table names a field ``JaxRuntime`` lacks, or one it refuses.

    Attributes:
        fields: The offending field names (empty when ``JaxRuntime`` refused a value).
    """

    __module__ = "substrax.compute"

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        self.fields = fields
        super().__init__(message)


class AcceleratorFormatError(PicklableError, ValueError):
    """An ``--accelerator`` value is not ``KIND`` or ``KIND:N``.

    Attributes:
        text: The value given.
    """

    __module__ = "substrax.compute"

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(
            f"accelerator {text!r} must read KIND or KIND:N with N from 1 to 64, e.g. H100:8"
        )


class RecordVersionError(PicklableError, ValueError):
    """A job spec or manifest was written by another release (its ``schema_version`` differs).

    Attributes:
        record: ``"job spec"`` or ``"manifest"``.
        found: The version read.
        expected: The version this release reads.
    """

    __module__ = "substrax.compute"

    def __init__(self, record: str, found: object, expected: int, fix: str) -> None:
        self.record, self.found, self.expected = record, found, expected
        super().__init__(f"{record} version {found!r} is not {expected}: {fix}")


class RecordFormatError(PicklableError, ValueError, TypeError):
    """A stored record (a run handle, a manifest) is not the shape this release writes.

    Attributes:
        source: Where it was read from (a path, or ``"data"``).
        problem: What is wrong with it.
    """

    __module__ = "substrax.compute"

    def __init__(self, source: object, problem: str) -> None:
        self.source, self.problem = source, problem
        super().__init__(
            f"{source}: {problem}; it was not written by this substrax-compute release"
        )


class SecretNotSetError(PicklableError, LookupError):
    """A secret the job names is not set in the environment that must pass it on.

    Attributes:
        names: The missing variable names.
        where: Whose environment (``"this environment"``, ``"the worker's environment"``).
    """

    __module__ = "substrax.compute"

    def __init__(self, names: list[str], where: str = "this environment") -> None:
        self.names, self.where = names, where
        super().__init__(
            f"secrets {', '.join(names)} are not set in {where}; export them before submitting"
        )


class MountNotConfiguredError(PicklableError, LookupError):
    """A job mount has no source in the backend's settings (a volume, a bucket, a directory).

    Attributes:
        mount: The mount's name.
        setting: The setting that would give it a source.
    """

    __module__ = "substrax.compute"

    def __init__(self, mount: str, message: str, setting: str) -> None:
        self.mount, self.setting = mount, setting
        super().__init__(message)


class MountDirectoryNotFoundError(PicklableError, FileNotFoundError):
    """A job mount has no directory on this machine for the local backend.

    Attributes:
        mount: The mount's name.
        path: The directory looked for.
    """

    __module__ = "substrax.compute"

    def __init__(self, mount: str, path: Path) -> None:
        self.mount, self.path = mount, path
        super().__init__(
            f"mount {mount!r} has no directory here ({path}): set backends.local.mounts."
            f"{mount} to a directory on this machine"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class MountPathError(PicklableError, ValueError):
    """A local mount's source directory lies outside the project.

    Attributes:
        mount: The mount's name.
        source: The configured source.
        project: The project root.
    """

    __module__ = "substrax.compute"

    def __init__(self, mount: str, source: str, project: Path) -> None:
        self.mount, self.source, self.project = mount, source, project
        super().__init__(
            f"local mount {mount!r} source {source!r} escapes {project}; name a directory "
            "inside the project or an absolute path"
        )


class DirectoryPathError(PicklableError, NotADirectoryError):
    """A path that must be (or become) a directory is a file, or lies under one.

    Attributes:
        path: The directory asked for.
        blocker: The existing file in the way (``path`` itself or one of its parents).
        what: What the directory is for, e.g. ``"--into"``.
    """

    __module__ = "substrax.compute"

    def __init__(self, path: Path, blocker: Path, *, what: str, fix: str) -> None:
        self.path, self.blocker, self.what = path, blocker, what
        if blocker == path:
            message = f"{what} {path} is a file, not a directory; {fix}"
        else:
            message = f"{what} {path} cannot be a directory: {blocker} is a file; {fix}"
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0])


class ProjectDirectoryError(PicklableError, NotADirectoryError):
    """The project root handed to a backend is not a directory.

    Attributes:
        project: The path given.
    """

    __module__ = "substrax.compute"

    def __init__(self, project: Path) -> None:
        self.project = project
        super().__init__(f"project {project} is not a directory; pass the project root")

    def __str__(self) -> str:
        return str(self.args[0])


class UploadFileNotFoundError(PicklableError, FileNotFoundError):
    """A file a job asked to upload by name is not a file inside the project.

    Attributes:
        name: The name as the job gave it.
        project: The project root.
    """

    __module__ = "substrax.compute"

    def __init__(self, name: str, project: Path) -> None:
        self.name, self.project = name, project
        super().__init__(
            f"include_files names {name!r}, which is not a file in {project}; name files by "
            "their normalised path relative to the project root, without '..'"
        )


class OutputPathError(PicklableError, ValueError):
    """An output path leaves the root it must stay in.

    Attributes:
        path: The offending path.
        root: The root it must stay inside.
    """

    __module__ = "substrax.compute"

    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.root = path, root
        super().__init__(f"{path} is outside {root}; outputs must stay inside their run directory")


class FetchToolNotFoundError(PicklableError, FileNotFoundError):
    """The cloud command a fetch needs (``gcloud``, ``aws``) is not on ``PATH``.

    Attributes:
        command: The missing command.
        source: The bucket path being fetched.
    """

    __module__ = "substrax.compute"

    def __init__(self, command: str, source: str) -> None:
        self.command, self.source = command, source
        super().__init__(
            f"fetching from {source} needs the `{command}` command; install it and log in"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class RunRecordError(RecordFormatError):
    """A stored run record (a handle in the run store) can't be used.

    It is unreadable or truncated, a directory stands in its place, or it names a backend that
    isn't installed or can't be built.

    Attributes:
        path: The record's file (also ``source``).
        reason: What is wrong with it (also ``problem``).
        fix: What to do, ending in "remove it".
    """

    __module__ = "substrax.compute"

    def __init__(self, path: Path, reason: str, *, fix: str = "remove it") -> None:
        self.source, self.problem = path, reason
        self.path, self.reason, self.fix = path, reason, fix
        super(RecordFormatError, self).__init__(f"run record {path} can't be used: {reason}; {fix}")


class RunDirectoryGoneError(PicklableError, FileNotFoundError):
    """A stored run's directory (its logs and outputs) is no longer on this machine.

    Attributes:
        run_id: The run.
        run_dir: The directory that is gone.
    """

    __module__ = "substrax.compute"

    def __init__(self, run_id: str, run_dir: Path) -> None:
        self.run_id, self.run_dir = run_id, run_dir
        super().__init__(
            f"run {run_id}'s directory {run_dir} is gone, so its logs and outputs can't be read; "
            "the run's record stays in `substrax-compute list` until you remove it"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class RunStoreError(PicklableError, OSError):
    """The run store's directory exists but can't be read (a file in its place, no permission).

    Attributes:
        root: The run store's directory.
        reason: Why it can't be read.
    """

    __module__ = "substrax.compute"

    def __init__(self, root: Path, reason: str) -> None:
        self.root, self.reason = root, reason
        super().__init__(
            f"cannot read the runs directory {root}: {reason}; "
            "make it a directory this user can read, or move it away"
        )

    def __str__(self) -> str:
        return str(self.args[0])
