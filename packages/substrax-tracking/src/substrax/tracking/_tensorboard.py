"""TensorBoardLogger: TensorBoard event files through tensorboardX."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from substrax.support import require

from ._base import Logger, as_scalar
from ._file import json_ready


__all__ = ["TensorBoardLogger"]


def _hparam_value(value: Any) -> Any:
    value = json_ready(value)
    return value if isinstance(value, bool | int | float | str) else str(value)


class TensorBoardLogger(Logger):
    """Write TensorBoard event files (scalars, hyperparameters, text, images, histograms).

    Args:
        name: the run name.
        log_dir: the directory of the event files (created); ``tensorboard --logdir`` it.
        flush_secs: how often tensorboardX's writer flushes.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: write on every process.

    Raises:
        ImportError: tensorboardX is not installed (the ``tensorboard`` extra).

    Example:
        >>> import tempfile
        >>> from substrax.tracking import TensorBoardLogger
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     with TensorBoardLogger("demo", directory) as logger:
        ...         logger.log_scalar("loss", 0.5, step=1)
    """

    def __init__(
        self,
        name: str,
        log_dir: str | os.PathLike[str],
        *,
        flush_secs: int = 10,
        process_index: int | None = None,
        all_processes: bool = False,
    ) -> None:
        tensorboard_x = require(
            "tensorboardX",
            who="TensorBoardLogger",
            distribution="substrax-tracking",
            extra="tensorboard",
        )
        super().__init__(name, process_index=process_index, all_processes=all_processes)
        self.log_dir = Path(log_dir).resolve()
        self._writer: Any = None
        if self.active:
            self._writer = tensorboard_x.SummaryWriter(
                logdir=str(self.log_dir), flush_secs=flush_secs
            )

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, as_scalar(key, value), global_step=step)

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        from tensorboardX.summary import hparams  # noqa: PLC0415

        clean = {str(k): _hparam_value(v) for k, v in params.items()}
        experiment, start, end = hparams(clean, {})
        file_writer = self._writer._get_file_writer()  # tensorboardX has no public handle
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._writer.add_text(name, text, global_step=step)

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        import numpy as np  # noqa: PLC0415

        for index, image in enumerate(images):
            array = np.asarray(image)
            if array.ndim == 2:  # noqa: PLR2004  (a grayscale image gets a channel axis)
                array = array[..., None]
            tag = name if len(images) == 1 else f"{name}/{index}"
            self._writer.add_image(tag, array, global_step=step, dataformats="HWC")

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        import numpy as np  # noqa: PLC0415

        self._writer.add_histogram(
            name, np.asarray(values, dtype=np.float64).ravel(), global_step=step
        )

    def flush(self) -> None:
        """Flush the event file."""
        if self._writer is not None:
            self._writer.flush()

    def _close(self) -> None:
        self._writer.close()
