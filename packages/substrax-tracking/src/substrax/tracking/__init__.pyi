# The public names of substrax.tracking, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._base import Logger as Logger
from ._console import ConsoleLogger as ConsoleLogger
from ._errors import (
    EmptyMetricNameError as EmptyMetricNameError,
    FileLogBusyError as FileLogBusyError,
    FileLogValueError as FileLogValueError,
    FileLogWriteError as FileLogWriteError,
    ImageShapeError as ImageShapeError,
    InvalidLoggerNameError as InvalidLoggerNameError,
    InvalidSpoolPathError as InvalidSpoolPathError,
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
    ReservedMetricNameError as ReservedMetricNameError,
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
