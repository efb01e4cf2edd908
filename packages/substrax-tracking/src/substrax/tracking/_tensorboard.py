"""TensorBoardLogger: TensorBoard event files through tensorboardX."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import functools
import os
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from substrax.support import require

from ._base import Logger
from ._file import json_ready
from ._media import image_pixels
from ._paths import ensure_writable_dir
from ._values import checked_scalars, drain_at_exit, read_scalar, value_ready


__all__ = ["TensorBoardLogger"]


def _hparam_value(value: Any) -> Any:
    value = json_ready(value)
    return value if isinstance(value, bool | int | float | str) else str(value)


class TensorBoardLogger(Logger):
    """Write TensorBoard event files (scalars, hyperparameters, text, images, histograms).

    A jax array logged as a scalar is not read by the call (which would wait for the step that
    computes it): it is written, with the scalars logged after it, once computed, and at the
    latest by :meth:`flush` or :meth:`close`.

    Args:
        name: the run name.
        log_dir: the directory of the event files (created); ``tensorboard --logdir`` it.
        flush_secs: how often tensorboardX's writer flushes.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: write on every process.

    Raises:
        ImportError: tensorboardX is not installed (the ``tensorboard`` extra).
        LogDirNotWritableError: ``log_dir`` cannot be created or written (a
            ``PermissionError``; a file in its place, a read-only file system).

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
        self._new_writer = functools.partial(
            tensorboard_x.SummaryWriter, logdir=str(self.log_dir), flush_secs=flush_secs
        )
        if self.active:
            ensure_writable_dir(self.log_dir, "TensorBoardLogger")
        self._writer: Any = self._new_writer() if self.active else None
        self._reopened = 0  # event files opened after a flush closed the first
        # (name, value, step, time) of the scalars not written yet: from a jax value not computed
        self._held: deque[tuple[str, Any, int | None, float]] = deque()
        self._warned_unreadable: set[str] = set()

    def _events(self) -> Any:
        """The event writer; after a flush closed the last one, a new one on a file of its own."""
        if self._writer is None:
            # the suffix sorts the file after the last one (TensorBoard reads them in order), and
            # keeps tensorboardX from naming it as one opened in the same second, which it truncates
            self._reopened += 1
            self._writer = self._new_writer(filename_suffix=f".{self._reopened:06d}")
        return self._writer

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        now = time.time()
        checked = checked_scalars(metrics, step)  # a call that raises writes nothing
        self._held.extend((key, number, step, now) for key, number in checked)
        self._write_held(wait=False)
        if self._held:
            drain_at_exit(self)

    def _write_held(self, *, wait: bool) -> None:
        """Write the held scalars in order; without ``wait``, up to a jax value still computed."""
        held = self._held
        while held:
            key, value, step, when = held[0]
            if not wait and not value_ready(value):
                return
            held.popleft()
            number = read_scalar(repr(self), key, value, step, self._warned_unreadable)
            if number is not None:
                self._events().add_scalar(key, number, global_step=step, walltime=when)

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        from tensorboardX.summary import hparams  # noqa: PLC0415

        clean = {str(key): _hparam_value(value) for key, value in params.items()}
        for summary in hparams(clean, {}):  # the experiment, session start and end
            self._events().file_writer.add_summary(summary)

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._events().add_text(name, text, global_step=step)

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        for index, image in enumerate(images):
            array = image_pixels(image)  # uint8: the writer then neither scales nor wraps it
            if array.ndim == 2:  # noqa: PLR2004  (a grayscale image gets a channel axis)
                array = array[..., None]
            tag = name if len(images) == 1 else f"{name}/{index}"
            self._events().add_image(tag, array, global_step=step, dataformats="HWC")

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        import numpy as np  # noqa: PLC0415

        self._events().add_histogram(
            name, np.asarray(values, dtype=np.float64).ravel(), global_step=step
        )

    def flush(self) -> None:
        """Write every event logged so far (waiting for held jax values) and fsync the event file.

        The event file is closed (``SummaryWriter.flush`` leaves its writer thread's queue
        unwritten); the next event opens a new one in the same directory.
        """
        if self.active and not self.closed:
            self._close()

    def _close(self) -> None:
        self._write_held(wait=True)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
