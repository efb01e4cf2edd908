"""The errors substrax.tracking raises: each a subclass of the builtin error it replaced.

Every public class here is re-exported from :mod:`substrax.tracking` and shows that module in
tracebacks. Each carries the offending values as attributes; its message says what to do.
"""

from collections.abc import Sequence
from dataclasses import InitVar
from pathlib import Path

from substrax.support import PicklableError, StructuredError


__all__ = [
    "EmptyMetricNameError",
    "FileLogBusyError",
    "FileLogValueError",
    "FileLogWriteError",
    "ImageShapeError",
    "InvalidLoggerNameError",
    "InvalidStepError",
    "LogDirNotWritableError",
    "LoggedTypeError",
    "LoggerClosedError",
    "MetricOverflowError",
    "NoFileLogError",
    "NoLoggerSelectedError",
    "NotALoggerError",
    "NotARecordError",
    "NotASpoolError",
    "ProcessIndexVariableError",
    "ResumeWithoutRunIdError",
    "SpoolNotFoundError",
    "UnknownBackendError",
    "UnknownRunIdError",
    "UploadNotFoundError",
]

_SHOWN_DIGITS = 40


class _PathTextError(StructuredError):
    """A StructuredError whose ``template`` sees each Path field as its text.

    ``{path!r}`` then shows ``'/runs/a'``, the way a user types the path, not ``PosixPath(...)``;
    the attribute stays the Path.
    """

    __slots__ = ()

    def _message(self) -> str:
        fields = {
            name: str(value) if isinstance(value, Path) else value
            for name, value in vars(self).items()
        }
        return self.template.format_map(fields)


class LoggerClosedError(StructuredError, RuntimeError):
    """A logger was used after :meth:`Logger.close`.

    Attributes:
        logger_name: the logger's name.
    """

    __module__ = "substrax.tracking"
    template = "logger {logger_name!r} is closed; create a new one to log again"
    logger_name: str


class LogDirNotWritableError(_PathTextError, PermissionError):
    """A logger's directory cannot be created or written by this process.

    Raised up front: W&B would otherwise write the run to ``/tmp/wandb`` without a word, while
    the logger names the directory given.

    Attributes:
        logger: the logger class.
        path: the directory (resolved).
        reason: what failed (the operating system's message).
    """

    __module__ = "substrax.tracking"
    template = (
        "{logger}: cannot write to the directory {path!r} ({reason}); make it writable by this "
        "process, or pass a writable log_dir= (or dir=, or set WANDB_DIR) instead"
    )
    logger: str
    path: Path
    reason: str


class InvalidLoggerNameError(StructuredError, ValueError):
    """A logger was given a name that is empty or not a string.

    Attributes:
        name: the name given.
    """

    __module__ = "substrax.tracking"
    template = "name={name!r} must be a non-empty string; it names the run in every backend"
    name: object


class EmptyMetricNameError(StructuredError, ValueError):
    """A metric was logged under an empty name (or a name that is not a string).

    Attributes:
        name: the name given.
        value: the value logged under it.
    """

    __module__ = "substrax.tracking"
    template = (
        "metric name {name!r} (value {value!r}) must be a non-empty string; "
        "give the metric a name such as 'loss' or 'train/loss'"
    )
    name: object
    value: object


class InvalidStepError(StructuredError, ValueError, TypeError):
    """A step that is not an integer in ``[0, 2**63 - 1]`` was logged.

    Every backend stores a step as a signed 64-bit integer (MLflow's store cannot hold a larger
    one, TensorBoard and W&B neither), so a step past ``2**63 - 1`` (a ``uint64`` counter that
    wrapped below zero, say), a negative one, or one that is not an integer is refused at the
    call, before any backend sees it. Both a ``ValueError`` and a ``TypeError``: the check a
    caller wrote for either one catches it.

    Attributes:
        step: the step given.
        reason: what is wrong with it.

    Example:
        >>> from substrax.tracking import InvalidStepError
        >>> error = InvalidStepError(2**64 - 1, "is past the largest step")
        >>> error.step, isinstance(error, ValueError)
        (18446744073709551615, True)
    """

    __module__ = "substrax.tracking"
    step: object
    reason: str

    def _message(self) -> str:
        shown = repr(self.step)
        if len(shown) > _SHOWN_DIGITS:
            shown = f"{shown[:20]}...{shown[-10:]} ({len(shown)} characters)"
        return (
            f"step {shown} {self.reason}; a step must be an int in [0, 2**63 - 1] (every backend "
            "stores it as a signed 64-bit integer): log the step count itself (an int, or a numpy "
            "or jax integer), not a wrapped or hashed counter"
        )


class LoggedTypeError(StructuredError, TypeError):
    """A value of the wrong type was logged.

    A scalar that is not a number, text that is not a str, hyperparameters that are not a
    mapping, an image that is not an array.

    Attributes:
        what: what was being logged (``"scalar 'loss'"``, ``"text 'notes'"``, ``"hyperparameters"``).
        value: the value given.
        expected: what it must be instead.

    ``got``, when given, words what was logged in the message instead of the value's type name
    (``"str 'x'"``); it is not kept as an attribute.
    """

    __module__ = "substrax.tracking"
    what: str
    value: object
    expected: str
    got: InitVar[str | None] = None

    def __post_init__(self, got: str | None = None) -> None:
        # ``got`` only words the message, so the message is built here rather than by _message
        TypeError.__init__(
            self, f"{self.what} must be {self.expected}, got {got or type(self.value).__name__}"
        )


class MetricOverflowError(StructuredError, OverflowError):
    """A metric's value is too large for a float (a Python int past about 1.8e308).

    Attributes:
        name: the metric's name.
        value: the value logged.
    """

    __module__ = "substrax.tracking"
    name: str
    value: object

    def _message(self) -> str:
        shown = repr(self.value)
        if len(shown) > _SHOWN_DIGITS:
            shown = f"{shown[:20]}...{shown[-10:]} ({len(shown)} digits)"
        return (
            f"scalar {self.name!r} = {shown} is too large for a float; log a scaled value "
            "(or its logarithm) instead"
        )


class ImageShapeError(StructuredError, ValueError):
    """An image array has a shape no backend can show.

    Attributes:
        name: the image's name.
        shape: its shape.
    """

    __module__ = "substrax.tracking"
    template = (
        "image {name!r} has shape {shape}; expected (H, W), (H, W, 1), (H, W, 3) or "
        "(H, W, 4): move the channel axis last, or log each image of a batch on its own"
    )
    name: str
    shape: tuple[int, ...]


class NotALoggerError(StructuredError, TypeError):
    """:class:`MultiLogger` was given something that is not a :class:`Logger`.

    Attributes:
        value: what was given.
    """

    __module__ = "substrax.tracking"
    template = (
        "MultiLogger takes Logger instances, got {value.__class__.__name__}; wrap another "
        "library's logger in a Logger subclass"
    )
    value: object


class NoLoggerSelectedError(PicklableError, ValueError):
    """:func:`create_logger` was asked for no backend at all."""

    __module__ = "substrax.tracking"

    def __init__(self) -> None:
        super().__init__(
            "create_logger with console=False, log_to_file=False and tensorboard=False logs "
            "nowhere; enable at least one of them"
        )


class ProcessIndexVariableError(StructuredError, ValueError):
    """An environment variable that names the process index holds something else.

    Attributes:
        variable: the variable's name.
        value: its value.
    """

    __module__ = "substrax.tracking"
    template = (
        "{variable}={value!r} is not a process index (an integer >= 0); set it to this "
        "process's index or unset it"
    )
    variable: str
    value: str


class FileLogValueError(_PathTextError, ValueError):
    """A line of a file log (``*.metrics.jsonl``) is JSON but not a metric :class:`FileLogger` wrote.

    Attributes:
        path: the file.
        line: the line's number, from 1.
        reason: what is wrong with it (a missing field, a value that is not a number).
    """

    __module__ = "substrax.tracking"
    template = (
        "line {line} of {path!r} is not a metric of a substrax file log ({reason}); "
        "pass a *.metrics.jsonl that a FileLogger wrote, or remove that line"
    )
    path: Path
    line: int
    reason: str


class FileLogWriteError(_PathTextError, OSError):
    """A :class:`FileLogger` closed with lines it could not write (a full disk, a removed mount).

    Until then the lines waited in memory and every flush tried them again; closing tried a
    last time. Lines before them were written whole and in order.

    Attributes:
        path: the file the lines were for.
        lines: how many lines of it were not written.
        reason: the operating system's error.
    """

    __module__ = "substrax.tracking"
    template = (
        "{lines} lines of {path!r} were not written when the logger closed ({reason}); free "
        "space on its file system (or check the mount) and log those steps again, or resume "
        "the run from a checkpoint before them"
    )
    path: Path
    lines: int
    reason: str


class NoFileLogError(_PathTextError, FileNotFoundError):
    """A directory to plot holds no file log (``*.metrics.jsonl``).

    Attributes:
        log_dir: the directory given.
    """

    __module__ = "substrax.tracking"
    template = (
        "{log_dir!r} holds no *.metrics.jsonl file; pass the log_dir a FileLogger or "
        "create_logger wrote"
    )
    log_dir: Path


class UploadNotFoundError(_PathTextError, FileNotFoundError):
    """A file or directory to upload to a run (an artifact, a model) does not exist.

    Attributes:
        what: what was to be uploaded (``"artifact"``, ``"model"``).
        path: the path, resolved.
    """

    __module__ = "substrax.tracking"
    template = "{what} {path!r} does not exist; pass the path of an existing file or directory"
    what: str
    path: Path


class SpoolNotFoundError(_PathTextError, FileNotFoundError):
    """A spool file to replay does not exist.

    Attributes:
        path: the path that was given.
    """

    __module__ = "substrax.tracking"
    template = (
        "spool file {path!r} does not exist; pass the <log_dir>/<name>.spool.jsonl path "
        "that the logger's warning named"
    )
    path: Path


class SpoolBusyError(StructuredError, TimeoutError):
    """Another replay held a spool file for longer than this replay could wait.

    Two replays of one spool never run at once (each would send every record); the second
    waits for the first, within its own time limit. Nothing was sent or changed.

    Attributes:
        path: the spool file.
        pid: the process replaying it (None when it could not be read).

    Example:
        >>> from pathlib import Path
        >>> from substrax.tracking import SpoolBusyError
        >>> SpoolBusyError(Path("r.spool"), 4242).pid
        4242
    """

    __module__ = "substrax.tracking"
    path: Path
    pid: int | None

    def _message(self) -> str:
        holder = f"pid {self.pid}" if self.pid is not None else "another process"
        return (
            f"another replay ({holder}) is replaying {str(self.path)!r}; nothing was sent: run "
            "this replay again when it has ended (or give it a longer --timeout to wait for it)"
        )


class NotASpoolError(_PathTextError, ValueError):
    """A path given as a spool file is not one: a directory, a device, or a file without records.

    Nothing at the path is changed.

    Attributes:
        path: the path that was given.
        reason: what it is instead.
    """

    __module__ = "substrax.tracking"
    template = (
        "{path!r} is not a spool file ({reason}); it is left untouched; pass the "
        "<log_dir>/<name>.spool.jsonl path that the logger's warning named"
    )
    path: Path
    reason: str


class UnknownBackendError(StructuredError, ValueError):
    """Spooled records name a backend that no installed logger registered.

    Attributes:
        backend: the backend the records name.
        known: the backends known.
    """

    __module__ = "substrax.tracking"
    backend: object
    known: Sequence[str]

    def _message(self) -> str:
        return (
            f"spooled records name an unknown backend {self.backend!r}; known: "
            f"{list(self.known)}; replay them with the substrax version that wrote them"
        )


class ResumeWithoutRunIdError(StructuredError, ValueError):
    """A remote logger was given ``resume_step`` but no ``run_id`` to resume.

    Attributes:
        logger: the logger class.
        resume_step: the step given.
    """

    __module__ = "substrax.tracking"
    template = (
        "{logger} got resume_step={resume_step!r} without run_id; pass the run id stored with "
        "the checkpoint (the first attempt's logger.run_id) so that logging goes on in that run"
    )
    logger: str
    resume_step: object


class FileLogBusyError(_PathTextError, RuntimeError):
    """Another :class:`FileLogger` (in this or another process) holds the same file log.

    Two writers of one log would lose records: a resume rewrites the files under the other, and
    lines of both interleave. Nothing was written.

    Attributes:
        log_dir: the directory.
        name: the log's file name stem (the logger name made file-safe).
        pid: the process holding it (None when it could not be read).
    """

    __module__ = "substrax.tracking"
    log_dir: Path
    name: str
    pid: int | None

    def _message(self) -> str:
        holder = f"process {self.pid}" if self.pid is not None else "another process"
        return (
            f"the file log {self.name!r} in {str(self.log_dir)!r} is held by a FileLogger of "
            f"{holder}; close that logger (or let that process end) first, or give this one "
            "another name or log_dir"
        )


class UnknownRunIdError(StructuredError, ValueError):
    """A remote logger was given a ``run_id`` that its tracking server does not know.

    Attributes:
        logger: the logger class.
        run_id: the run id given.
        tracking_uri: where it was looked up.
    """

    __module__ = "substrax.tracking"
    template = (
        "{logger}: the store at {tracking_uri} has no run {run_id!r}; pass the run id that the "
        "first attempt's logger had (logger.run_id, stored with the checkpoint) and the "
        "tracking_uri it logged to, or leave run_id out to start a new run"
    )
    logger: str
    run_id: str
    tracking_uri: str


class NotARecordError(StructuredError, ValueError):
    """A line of a spool (or its record) is not a substrax tracking record.

    Raised and caught inside a replay, which sets such lines aside in ``<spool>.bad`` with the
    message as their reason.

    Attributes:
        reason: why it is not a record.
    """

    template = "{reason}"
    reason: str
