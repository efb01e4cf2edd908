"""ConsoleLogger: one aligned, readable line per call."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from substrax.support import optional

from ._base import Logger, as_scalar, histogram_summary


__all__ = ["ConsoleLogger"]

_SMALL = 1e-3


def _fmt(value: float) -> str:
    return f"{value:>10.4g}" if abs(value) >= _SMALL or value == 0 else f"{value:>10.3e}"


class ConsoleLogger(Logger):
    r"""Print each call as one aligned line (with rich colours on a terminal, when rich is installed).

    ``step       3 | loss     0.2500 | acc      0.9100``. Images and histograms are shown as
    their shape or summary statistics.

    Args:
        name: the name printed at the start of each line.
        stream: where to print; default: ``sys.stdout`` at each call.
        level: ``logging.INFO`` prints everything; a higher level prints nothing but
            hyperparameters and text at ``WARNING`` and above are still printed.
        use_rich: draw with rich; default: when rich is installed and the stream is a terminal.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: print on every process, not only process 0.

    Example:
        >>> import io
        >>> from substrax.tracking import ConsoleLogger
        >>> out = io.StringIO()
        >>> logger = ConsoleLogger("demo", stream=out)
        >>> logger.log_scalars({"loss": 0.25, "acc": 0.91}, step=3)
        >>> out.getvalue()
        '[demo] step       3 | loss       0.25 | acc       0.91\n'
    """

    def __init__(
        self,
        name: str = "substrax",
        *,
        stream: TextIO | None = None,
        level: int = logging.INFO,
        use_rich: bool | None = None,
        process_index: int | None = None,
        all_processes: bool = False,
    ) -> None:
        super().__init__(name, process_index=process_index, all_processes=all_processes)
        self._stream = stream
        self.level = level
        self._rich: Any = None
        target = stream if stream is not None else sys.stdout
        if use_rich is None:
            use_rich = bool(getattr(target, "isatty", lambda: False)())
        if use_rich:
            console = optional("rich.console")  # rich is an extra: without it, plain lines
            if console is not None:
                self._rich = console.Console(file=stream, highlight=False)

    def _emit(self, body: str, style: str = "") -> None:
        if self.level > logging.INFO:
            return
        line = f"[{self.name}] {body}"
        if self._rich is not None:
            self._rich.print(
                f"[{style}]{line}[/]" if style else line, markup=bool(style), soft_wrap=True
            )
            return
        stream = self._stream if self._stream is not None else sys.stdout
        stream.write(line + "\n")

    @staticmethod
    def _step(step: int | None) -> str:
        return f"step {step:>7} | " if step is not None else ""

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        parts = " | ".join(f"{key} {_fmt(as_scalar(key, value))}" for key, value in metrics.items())
        self._emit(self._step(step) + parts)

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        self._emit("hyperparams " + json.dumps(dict(params), default=str, sort_keys=True), "bold")

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._emit(f"{self._step(step)}{name}: {text}")

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        shapes = ", ".join(str(tuple(image.shape)) for image in images)
        self._emit(f"{self._step(step)}{name}: image {shapes}")

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        s = histogram_summary(values)
        self._emit(
            f"{self._step(step)}{name}: histogram n={s['count']} min={s['min']:.4g} "
            f"max={s['max']:.4g} mean={s['mean']:.4g} std={s['std']:.4g}"
        )

    def flush(self) -> None:
        """Flush the stream."""
        stream = self._stream if self._stream is not None else sys.stdout
        stream.flush()
