"""ProgressCallback: a rich progress bar with steps per second, ETA and the latest metrics."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from substrax.support import check_int, require

from ._metrics import as_metric_names, metric_value, warn_missing_metric
from ._protocol import BaseCallback, Logs


__all__ = ["ProgressCallback"]


class ProgressCallback(BaseCallback):
    """Show training progress as a `rich <https://rich.readthedocs.io>`_ progress bar.

    The bar shows steps done, steps per second, elapsed time, the ETA (when ``total_steps`` is
    known) and the latest values of ``metrics`` from ``on_batch_end``.

    Args:
        total_steps: the number of steps, for the bar and the ETA; None for an open-ended bar.
        metrics: the log key (a string) or keys to show beside the bar. A key the first
            step's logs lack is warned about once, naming the keys they held.
        console: a ``rich.console.Console`` to draw on; default: rich's own.
        description: the text before the bar.

    Raises:
        ImportError: rich is not installed.

    Example:
        >>> import io
        >>> from rich.console import Console
        >>> from substrax.callbacks import ProgressCallback
        >>> progress = ProgressCallback(total_steps=2, console=Console(file=io.StringIO()))
        >>> progress.on_train_begin(None)
        >>> for step in range(2):
        ...     progress.on_batch_end(None, step, {"loss": 0.5})
        >>> progress.on_train_end(None)
        >>> progress.steps
        2
    """

    def __init__(
        self,
        *,
        total_steps: int | None = None,
        metrics: str | Sequence[str] = ("loss",),
        console: Any = None,
        description: str = "training",
    ) -> None:
        rich_progress = require(
            "rich.progress", who="ProgressCallback", distribution="substrax-tracking", extra="rich"
        )
        if total_steps is not None:
            check_int("total_steps", total_steps, minimum=0)
        self.total_steps = total_steps
        self.metrics = as_metric_names("metrics", metrics)
        self._unseen = set(self.metrics)
        self._checked = False
        self.steps = 0
        self._description = description
        self._progress = rich_progress.Progress(
            rich_progress.TextColumn("[bold]{task.description}"),
            rich_progress.BarColumn(),
            rich_progress.MofNCompleteColumn(),
            rich_progress.TextColumn("{task.fields[rate]}"),
            rich_progress.TimeElapsedColumn(),
            rich_progress.TimeRemainingColumn(),
            rich_progress.TextColumn("{task.fields[metrics]}"),
            console=console,
            transient=False,
        )
        self._task: Any = None  # a rich TaskID once started

    def on_train_begin(self, _trainer: object, /) -> None:
        """Start the bar."""
        self._progress.start()
        self._task = self._progress.add_task(
            self._description, total=self.total_steps, rate="", metrics=""
        )

    def on_batch_end(self, trainer: object, _batch: int, logs: Logs, /) -> None:
        """Advance the bar by one step and show the latest metrics."""
        if self._task is None:
            self.on_train_begin(trainer)
        self.steps += 1
        self._unseen.difference_update(logs)
        if not self._checked:
            self._checked = True
            for key in sorted(self._unseen):
                warn_missing_metric("ProgressCallback", key, logs)
        shown = "  ".join(
            f"{key}={metric_value(key, logs[key], who='ProgressCallback'):.4g}"
            for key in self.metrics
            if key in logs
        )
        task = self._progress.tasks[0]
        speed = task.speed
        rate = f"{speed:.1f} steps/s" if speed else ""
        self._progress.update(task.id, advance=1, rate=rate, metrics=shown)

    def on_train_end(self, _trainer: object, /) -> None:
        """Stop the bar, leaving its last state on screen."""
        self._progress.stop()
