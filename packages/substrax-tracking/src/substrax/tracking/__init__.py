"""substrax.tracking: step-wise experiment logging to the console, files, TensorBoard, W&B and MLflow.

Every logger has one surface (``log_scalar``, ``log_scalars``/``log_metrics``,
``log_hyperparams``, ``log_text``, ``log_image``, ``log_histogram``, ``close``). The W&B and
MLflow loggers send from a background thread, never stall the step, and keep what they could
not deliver in a spool file (``python -m substrax.tracking replay SPOOL``). Importing this
module imports neither jax nor any backend SDK, nor anything else: each name is loaded from its
module when first used (PEP 562). Every name users import comes from here; the only public
submodule is the ``python -m substrax.tracking`` entry, ``substrax.tracking.__main__``.

Example:
    >>> import io, tempfile
    >>> from substrax.tracking import create_logger
    >>> out = io.StringIO()
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     with create_logger("demo", log_dir=directory, stream=out) as logger:
    ...         logger.log_scalars({"loss": 0.5, "acc": 0.9}, step=1)
    >>> print(out.getvalue(), end="")
    [demo] step       1 | loss        0.5 | acc        0.9
"""

from typing import TYPE_CHECKING

from substrax.support import lazy_exports


if TYPE_CHECKING:
    from ._base import Logger as Logger
    from ._console import ConsoleLogger as ConsoleLogger
    from ._errors import (
        EmptyMetricNameError as EmptyMetricNameError,
        FileLogBusyError as FileLogBusyError,
        FileLogValueError as FileLogValueError,
        FileLogWriteError as FileLogWriteError,
        ImageShapeError as ImageShapeError,
        InvalidLoggerNameError as InvalidLoggerNameError,
        InvalidStepError as InvalidStepError,
        LogDirNotWritableError as LogDirNotWritableError,
        LoggedTypeError as LoggedTypeError,
        LoggerClosedError as LoggerClosedError,
        MetricOverflowError as MetricOverflowError,
        NoFileLogError as NoFileLogError,
        NoLoggerSelectedError as NoLoggerSelectedError,
        NotALoggerError as NotALoggerError,
        NotASpoolError as NotASpoolError,
        ProcessIndexVariableError as ProcessIndexVariableError,
        ResumeWithoutRunIdError as ResumeWithoutRunIdError,
        SpoolBusyError as SpoolBusyError,
        SpoolNotFoundError as SpoolNotFoundError,
        StoreDirectoryMissingError as StoreDirectoryMissingError,
        UnknownBackendError as UnknownBackendError,
        UnknownRunIdError as UnknownRunIdError,
        UploadNotFoundError as UploadNotFoundError,
    )
    from ._factory import create_logger as create_logger
    from ._file import FileLogger as FileLogger
    from ._mlflow import MLFlowLogger as MLFlowLogger
    from ._multi import MultiLogger as MultiLogger
    from ._plot import plot_log_dir as plot_log_dir, read_scalars as read_scalars
    from ._process import current_process_index as current_process_index
    from ._remote import RemoteLogger as RemoteLogger
    from ._replay import ReplayResult as ReplayResult, replay_spool as replay_spool
    from ._tensorboard import TensorBoardLogger as TensorBoardLogger
    from ._wandb import WandbLogger as WandbLogger


# Each public name and the private module that defines it.
_HOMES: dict[str, str] = {
    "Logger": "_base",
    "ConsoleLogger": "_console",
    **dict.fromkeys(
        (
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
            "NotASpoolError",
            "ProcessIndexVariableError",
            "ResumeWithoutRunIdError",
            "SpoolBusyError",
            "SpoolNotFoundError",
            "StoreDirectoryMissingError",
            "UnknownBackendError",
            "UnknownRunIdError",
            "UploadNotFoundError",
        ),
        "_errors",
    ),
    "create_logger": "_factory",
    "FileLogger": "_file",
    "MLFlowLogger": "_mlflow",
    "MultiLogger": "_multi",
    **dict.fromkeys(("plot_log_dir", "read_scalars"), "_plot"),
    "current_process_index": "_process",
    "RemoteLogger": "_remote",
    **dict.fromkeys(("ReplayResult", "replay_spool"), "_replay"),
    "TensorBoardLogger": "_tensorboard",
    "WandbLogger": "_wandb",
}

__all__ = [
    "ConsoleLogger",
    "EmptyMetricNameError",
    "FileLogBusyError",
    "FileLogValueError",
    "FileLogWriteError",
    "FileLogger",
    "ImageShapeError",
    "InvalidLoggerNameError",
    "InvalidStepError",
    "LogDirNotWritableError",
    "LoggedTypeError",
    "Logger",
    "LoggerClosedError",
    "MLFlowLogger",
    "MetricOverflowError",
    "MultiLogger",
    "NoFileLogError",
    "NoLoggerSelectedError",
    "NotALoggerError",
    "NotASpoolError",
    "ProcessIndexVariableError",
    "RemoteLogger",
    "ReplayResult",
    "ResumeWithoutRunIdError",
    "SpoolBusyError",
    "SpoolNotFoundError",
    "StoreDirectoryMissingError",
    "TensorBoardLogger",
    "UnknownBackendError",
    "UnknownRunIdError",
    "UploadNotFoundError",
    "WandbLogger",
    "create_logger",
    "current_process_index",
    "plot_log_dir",
    "read_scalars",
    "replay_spool",
]


# Each name is loaded from its module on first use (PEP 562), then kept here.
lazy_exports(__name__, _HOMES, __all__)
