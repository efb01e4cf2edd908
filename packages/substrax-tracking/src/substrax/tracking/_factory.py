"""create_logger: console output plus a file log, in the run's output directory."""

from __future__ import annotations

import logging
import os
from typing import TextIO, TypedDict

from ._base import Logger
from ._console import ConsoleLogger
from ._errors import NoLoggerSelectedError
from ._file import FileLogger
from ._multi import MultiLogger
from ._paths import log_stem, resolve_log_dir
from ._process import current_process_index


__all__ = ["create_logger"]


class _Each(TypedDict):
    process_index: int | None
    all_processes: bool


def create_logger(
    name: str,
    log_dir: str | os.PathLike[str] | None = None,
    *,
    log_to_file: bool = True,
    console: bool = True,
    tensorboard: bool = False,
    level: int = logging.INFO,
    stream: TextIO | None = None,
    process_index: int | None = None,
    all_processes: bool = False,
    resume_step: int | None = None,
) -> Logger:
    """A logger that prints to the console and writes a :class:`FileLogger` log.

    Args:
        name: the run name.
        log_dir: the file log's directory; default ``$AVITAI_OUTPUT_DIR/<name>`` or a temporary one.
        log_to_file: write the file log.
        console: print to the console.
        tensorboard: also write TensorBoard event files into ``log_dir/tensorboard/<name>``.
        level: the console level (see :class:`ConsoleLogger`).
        stream: the console stream; default stdout.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: log on every process, not only process 0.
        resume_step: the step a resumed run restored (see :class:`FileLogger`).

    Returns:
        One logger, or a :class:`MultiLogger` of several.

    Example:
        >>> import io, tempfile
        >>> from substrax.tracking import create_logger
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     logger = create_logger("demo", log_dir=directory, stream=io.StringIO())
        ...     logger.log_hyperparams({"lr": 1e-3, "batch_size": 32})
        ...     for step in range(3):
        ...         logger.log_scalar("loss", 1.0 / (step + 1), step=step)
        ...     logger.close()
    """
    each: _Each = {"process_index": process_index, "all_processes": all_processes}
    loggers: list[Logger] = []
    if console:
        loggers.append(ConsoleLogger(name, stream=stream, level=level, **each))
    if log_to_file or tensorboard:
        directory = resolve_log_dir(name, log_dir)
        if log_to_file:
            loggers.append(FileLogger(name, directory, resume_step=resume_step, **each))
        if tensorboard:
            from ._tensorboard import TensorBoardLogger  # noqa: PLC0415

            # a directory per name (TensorBoard's run), as each name has its own file log
            stem = log_stem(name, current_process_index(process_index), all_processes=all_processes)
            run_dir = directory / "tensorboard" / stem
            loggers.append(TensorBoardLogger(name, run_dir, resume_step=resume_step, **each))
    if not loggers:
        raise NoLoggerSelectedError
    return loggers[0] if len(loggers) == 1 else MultiLogger(loggers, name=name)
