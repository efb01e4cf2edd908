"""The errors substrax.tracking raises, each a subclass of the builtin error it replaces."""

from collections.abc import Sequence
from dataclasses import InitVar
from pathlib import Path
from typing import ClassVar

from substrax.support import StructuredError


_LONGEST_SHOWN = 40


def _shorten(value: object, unit: str, size: int | None = None) -> str:
    """``repr(value)``, its middle cut out when longer than ``_LONGEST_SHOWN`` (then ``size`` shown)."""
    shown = repr(value)
    if len(shown) > _LONGEST_SHOWN:
        return f"{shown[:20]}...{shown[-10:]} ({len(shown) if size is None else size} {unit})"
    return shown


class _TrackingError(StructuredError, public_module="substrax.tracking"):
    """An error shown as ``substrax.tracking``'s, whose template sees each Path as its text."""

    def _shown(self) -> dict[str, object]:
        fields = self._fields().items()
        return {name: str(value) if isinstance(value, Path) else value for name, value in fields}

    def _message(self) -> str:
        return self.template.format_map(self._shown())


class _HeldError(_TrackingError):
    """A file another process holds: ``{holder}`` names it by its ``pid`` field (None: unknown)."""

    holder_word: ClassVar[str]  # "pid" shows "pid 4242", "process": "process 4242"

    def _shown(self) -> dict[str, object]:
        shown = super()._shown()
        pid = shown["pid"]
        return shown | {"holder": "another process" if pid is None else f"{self.holder_word} {pid}"}


class LoggerClosedError(_TrackingError, RuntimeError):
    """A logger was used after :meth:`Logger.close`."""

    template = "logger {logger_name!r} is closed; create a new one to log again"
    logger_name: str


class LogDirNotWritableError(_TrackingError, PermissionError):
    """A ``logger``'s directory ``path`` cannot be created or written; ``reason`` is the OS's."""

    template = (
        "{logger}: cannot write to the directory {path!r} ({reason}); make it writable by this "
        "process, or pass a writable log_dir={wandb_too} instead"
    )
    logger: str
    path: Path
    reason: str

    def _shown(self) -> dict[str, object]:
        wandb_too = " (or dir=, or set WANDB_DIR)" if self.logger == "WandbLogger" else ""
        return super()._shown() | {"wandb_too": wandb_too}


class InvalidLoggerNameError(_TrackingError, ValueError):
    """A logger was given a name that is empty, not a string, or past ``most`` bytes (UTF-8).

    Example:
        >>> from substrax.tracking import InvalidLoggerNameError
        >>> print(InvalidLoggerNameError("n" * 300, 212))
        name='nnnnnnnnnnnnnnnnnnn...nnnnnnnnn' (300 bytes) is too long: a file named after it would pass 255 bytes, the most a file system allows in one name; give a name of at most 212 bytes (UTF-8)
    """

    template = "name={shown_name} {problem}"
    name: object
    most: int | None = None

    def _shown(self) -> dict[str, object]:
        if self.most is None:
            problem = "must be a non-empty string; it names the run in every backend"
            return super()._shown() | {"shown_name": repr(self.name), "problem": problem}
        size = len(str(self.name).encode("utf-8", "surrogatepass"))
        problem = (
            "is too long: a file named after it would pass 255 bytes, the most a file "
            f"system allows in one name; give a name of at most {self.most} bytes (UTF-8)"
        )
        shown = _shorten(self.name, "bytes", size)
        return super()._shown() | {"shown_name": shown, "problem": problem}


class InvalidSpoolPathError(_TrackingError, ValueError):
    """A ``logger``'s ``spool_path`` cannot be its spool file (``reason``: why).

    Example:
        >>> from pathlib import Path
        >>> from substrax.tracking import InvalidSpoolPathError
        >>> print(InvalidSpoolPathError("MLFlowLogger", Path("/runs"), "it is a directory"))
        MLFlowLogger: spool_path='/runs' cannot be the spool file (it is a directory); pass the path of a file in a directory this process can write, or leave spool_path out (<log_dir>/<name>.spool.jsonl)
    """

    template = (
        "{logger}: spool_path={path!r} cannot be the spool file ({reason}); pass the path of a "
        "file in a directory this process can write, or leave spool_path out "
        "(<log_dir>/<name>.spool.jsonl)"
    )
    logger: str
    path: Path
    reason: str


class EmptyMetricNameError(_TrackingError, ValueError):
    """A metric was logged under an empty name (or one that is not a string)."""

    template = (
        "metric name {name!r} (value {value!r}) must be a non-empty string; "
        "give the metric a name such as 'loss' or 'train/loss'"
    )
    name: object
    value: object


class InvalidStepError(_TrackingError, ValueError, TypeError):
    """A logged step is not an int in ``[0, 2**63 - 1]``, so no backend can store it.

    Example:
        >>> from substrax.tracking import InvalidStepError
        >>> InvalidStepError(2**64 - 1, "is past the largest step").step
        18446744073709551615
    """

    template = (
        "step {shown_step} {reason}{of_logged}; a step must be an int in [0, 2**63 - 1] (every "
        "backend stores it as a signed 64-bit integer): log the step count itself (an int, or "
        "a numpy or jax integer), not a wrapped or hashed counter"
    )
    step: object
    reason: str
    logged: str = ""  # what was logged at it: "scalar 'loss'"

    def _shown(self) -> dict[str, object]:
        shown = super()._shown() | {"of_logged": self.logged and f" (logging {self.logged})"}
        return shown | {"shown_step": _shorten(self.step, "characters")}


class ReservedMetricNameError(_TrackingError, ValueError):
    """A metric was logged under a name W&B sets itself in every history row (``_step``...)."""

    template = (
        "metric name {name!r} (at step {step}) is a key W&B writes itself in each history row and "
        "would replace without a word; rename the metric, for example 'train{name}'"
    )
    name: str
    step: object


class LoggedTypeError(_TrackingError, TypeError):
    """A value of the wrong type was logged: ``what`` (``"scalar 'loss'"``) must be ``expected``.

    ``got`` words what was logged in place of the value's type name; it is not an attribute.
    """

    what: str
    value: object
    expected: str
    got: InitVar[str | None] = None

    def __post_init__(self, got: str | None = None) -> None:
        got = got or type(self.value).__name__
        TypeError.__init__(self, f"{self.what} must be {self.expected}, got {got}")


class MetricOverflowError(_TrackingError, OverflowError):
    """A metric's value is too large for a float (a Python int past about 1.8e308)."""

    template = (
        "scalar {name!r} = {shown_value}{at_step} is too large for a float; log a scaled value "
        "(or its logarithm) instead"
    )
    name: str
    value: object
    step: int | None = None

    def _shown(self) -> dict[str, object]:
        at_step = "" if self.step is None else f" (at step {self.step})"
        shown_value = _shorten(self.value, "digits")
        return super()._shown() | {"shown_value": shown_value, "at_step": at_step}


class ImageShapeError(_TrackingError, ValueError):
    """An image array has a shape no backend can show."""

    template = (
        "image {name!r} has shape {shape}; expected (H, W), (H, W, 1), (H, W, 3) or "
        "(H, W, 4): move the channel axis last, or log each image of a batch on its own"
    )
    name: str
    shape: tuple[int, ...]


class NotALoggerError(_TrackingError, TypeError):
    """:class:`MultiLogger` was given something that is not a :class:`Logger`."""

    template = (
        "MultiLogger takes Logger instances, got {value.__class__.__name__}; wrap another "
        "library's logger in a Logger subclass"
    )
    value: object


class NoLoggerSelectedError(_TrackingError, ValueError):
    """:func:`create_logger` was asked for no backend at all."""

    template = (
        "create_logger with console=False, log_to_file=False and tensorboard=False logs "
        "nowhere; enable at least one of them"
    )


class ProcessIndexVariableError(_TrackingError, ValueError):
    """An environment variable that names the process index holds something else."""

    template = (
        "{variable}={value!r} is not a process index (an integer >= 0); set it to this "
        "process's index or unset it"
    )
    variable: str
    value: str


class FileLogValueError(_TrackingError, ValueError):
    """Line ``line`` (from 1) of a ``*.metrics.jsonl`` is JSON but not a FileLogger's metric."""

    template = (
        "line {line} of {path!r} is not a metric of a substrax file log ({reason}); "
        "pass a *.metrics.jsonl that a FileLogger wrote, or remove that line"
    )
    path: Path
    line: int
    reason: str


class FileLogWriteError(_TrackingError, OSError):
    """A :class:`FileLogger` closed with ``lines`` lines of ``path`` unwritten (a full disk)."""

    template = (
        "{lines} lines of {path!r} were not written when the logger closed ({reason}); free "
        "space on its file system (or check the mount) and log those steps again, or resume "
        "the run from a checkpoint before them"
    )
    path: Path
    lines: int
    reason: str


class NoFileLogError(_TrackingError, FileNotFoundError):
    """A directory to plot holds no file log (``*.metrics.jsonl``), or is no directory."""

    template = "{log_dir!r} {problem}; pass the log_dir a FileLogger or create_logger wrote"
    log_dir: Path
    problem: str = "holds no *.metrics.jsonl file"


class UploadNotFoundError(_TrackingError, FileNotFoundError):
    """A file or directory to upload to a run (``what``: an artifact, a model) does not exist."""

    template = "{what} {path!r} does not exist; pass the path of an existing file or directory"
    what: str
    path: Path


class SpoolNotFoundError(_TrackingError, FileNotFoundError):
    """A spool file to replay does not exist."""

    template = (
        "spool file {path!r} does not exist; pass the <log_dir>/<name>.spool.jsonl path "
        "that the logger's warning named"
    )
    path: Path


class SpoolBusyError(_HeldError, TimeoutError):
    """Another replay (``pid``, None if unknown) held a spool file longer than this one could wait.

    Example:
        >>> from pathlib import Path
        >>> from substrax.tracking import SpoolBusyError
        >>> SpoolBusyError(Path("r.spool"), 4242).pid
        4242
    """

    template = (
        "another replay ({holder}) is replaying {path!r}; nothing was sent: run this replay "
        "again when it has ended (or give it a longer --timeout to wait for it)"
    )
    holder_word = "pid"
    path: Path
    pid: int | None


class NotASpoolError(_TrackingError, ValueError):
    """A path given as a spool file is not one (``reason``: what it is instead); left untouched."""

    template = (
        "{path!r} is not a spool file ({reason}); it is left untouched; pass the "
        "<log_dir>/<name>.spool.jsonl path that the logger's warning named"
    )
    path: Path
    reason: str


class UnknownBackendError(_TrackingError, ValueError):
    """Spooled records name a backend that no installed logger registered."""

    template = (
        "spooled records name an unknown backend {backend!r}; known: {known}; replay them "
        "with the substrax version that wrote them"
    )
    backend: object
    known: Sequence[str]

    def _shown(self) -> dict[str, object]:
        return super()._shown() | {"known": list(self.known)}


class ResumeWithoutRunIdError(_TrackingError, ValueError):
    """A remote logger was given ``resume_step`` but no ``run_id`` to resume."""

    template = (
        "{logger} got resume_step={resume_step!r} without run_id; pass the run id stored with "
        "the checkpoint (the first attempt's logger.run_id) so that logging goes on in that run"
    )
    logger: str
    resume_step: object


class FileLogBusyError(_HeldError, RuntimeError):
    """Another ``logger`` (``pid``, None if unknown) holds the log ``name`` in ``log_dir``."""

    template = (
        "the {what} {name!r} in {log_dir!r} is held by a {logger} of {holder}; close that "
        "logger (or let that process end) first, or give this one another name or log_dir"
    )
    holder_word = "process"
    log_dir: Path
    name: str
    pid: int | None
    logger: str = "FileLogger"
    what: str = "file log"


class UnknownRunIdError(_TrackingError, ValueError):
    """A remote logger's ``run_id`` is not known to its tracking server (``tracking_uri``)."""

    template = (
        "{logger}: the store at {tracking_uri} has no run {run_id!r}; pass the run id that the "
        "first attempt's logger had (logger.run_id, stored with the checkpoint) and the "
        "tracking_uri it logged to, or leave run_id out to start a new run"
    )
    logger: str
    run_id: str
    tracking_uri: str


class StoreDirectoryMissingError(_TrackingError, FileNotFoundError):
    """A replay's target is a sqlite store whose directory is gone; a replay does not create it.

    Example:
        >>> from pathlib import Path
        >>> from substrax.tracking._errors import StoreDirectoryMissingError
        >>> StoreDirectoryMissingError("sqlite:////gone/mlflow.db", Path("/gone")).directory
        PosixPath('/gone')
    """

    template = (
        "the directory {directory!r} of the store {tracking_uri} does not exist, and a replay "
        "does not create it (that would be a new, empty store): restore or mount that "
        "directory, then replay again; the records stay in the spool"
    )
    tracking_uri: str
    directory: Path


class NotARecordError(StructuredError, ValueError):
    """A spool line (or its record) is not a tracking record; a replay sets it aside in ``.bad``."""

    template = "{reason}"
    reason: str
