"""ProgressCallback: a rich progress bar with steps per second, ETA and the latest metrics."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from substrax.support import check_int, is_device_array, require

from ._metrics import check_metric, kept_alive, metric_value, warn_missing_metric
from ._protocol import BaseCallback, Logs


_DRAW_PER_SECOND = 10
"""How often a batch end redraws the bar at most: rich refreshes the screen 10 times a second."""


class ProgressCallback(BaseCallback):
    """Show training progress as a `rich <https://rich.readthedocs.io>`_ progress bar.

    The bar shows steps done, steps per second, elapsed time, the ETA and the latest values of
    ``metrics``, redrawn at most 10 times a second. A jax array is read at a later redraw, so
    the bar never waits for a step. A later ``on_train_begin`` starts a fresh bar.

    Args:
        total_steps: the number of steps, for the bar and the ETA; None for an open-ended bar.
        initial_step: the steps done before this run (a resumed run's); ``steps`` starts there.
        metrics: the log key or keys to show beside the bar; a missing one is warned about once.
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
        initial_step: int = 0,
        metrics: str | Sequence[str] = ("loss",),
        console: Any = None,  # noqa: ANN401  (a rich Console; rich is optional)
        description: str = "training",
    ) -> None:
        rich_progress = require(
            "rich.progress", who="ProgressCallback", distribution="substrax-tracking", extra="rich"
        )
        if total_steps is not None:
            check_int("total_steps", total_steps, minimum=0)
        self.total_steps = total_steps
        self.initial_step = check_int("initial_step", initial_step, minimum=0)
        if not isinstance(metrics, str | Iterable):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(
                f"metrics={metrics!r:.80} ({type(metrics).__name__}) must be a metric name or "
                "names (strings), such as 'loss' or ('loss', 'lr')"
            )
        self.metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
        for name in self.metrics:
            if not isinstance(name, str) or not name:  # pyright: ignore[reportUnnecessaryIsInstance]
                raise TypeError(f"metrics={metrics!r} must be metric names (strings); got {name!r}")
        self._checked = False
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
        self._warned_deleted: set[str] = set()
        self._reset()

    @property
    def latest(self) -> dict[str, float]:
        """The value shown for each metric: the latest read (a jax array's at a later redraw)."""
        return dict(self._shown)

    def on_train_begin(self, _trainer: object, /) -> None:
        """Start a fresh bar; an earlier run's is stopped (left on screen as it was) and dropped."""
        if self._task is not None:
            if self._progress.live.is_started:
                self._progress.stop()
            self._progress.remove_task(self._task)
        self._reset()
        self._progress.start()
        self._task = self._progress.add_task(
            self._description,
            total=self.total_steps,
            completed=self.initial_step,
            rate="",
            metrics="",
        )

    def on_batch_end(self, trainer: object, batch: int, logs: Logs, /) -> None:
        """Count the step; at most 10 times a second, redraw the bar."""
        if self._task is None:
            self.on_train_begin(trainer)
        self.steps += 1
        self._advance += 1
        if not self._checked:
            self._checked = True
            for key in sorted(set(self.metrics) - set(logs)):
                warn_missing_metric("ProgressCallback", key, logs)
        logged = {key: logs[key] for key in self.metrics if key in logs}
        for key, value in logged.items():
            check_metric(key, value, who="ProgressCallback")
        now = time.monotonic()
        due = now >= self._next_draw
        if due:
            self._read_pending()  # the steps before: this one is dispatched
        for key, value in logged.items():
            if is_device_array(value):
                self._pending[key] = (batch, value)  # replaces an older one not read
            else:
                self._shown[key] = metric_value(key, value, who="ProgressCallback")
        if due:
            self._next_draw = now + 1 / _DRAW_PER_SECOND
            self._draw()

    def on_train_end(self, _trainer: object, /) -> None:
        """Show the last step's values and stop the bar, leaving its last state on screen."""
        if self._task is not None:
            self._read_pending()
            self._draw()
        self._progress.stop()

    def _reset(self) -> None:
        self.steps = self.initial_step
        self._pending: dict[str, tuple[int, Any]] = {}  # the last step's jax arrays, by metric
        self._shown: dict[str, float] = {}  # each metric's latest value read
        self._advance = 0  # steps not drawn yet
        self._next_draw = 0.0  # time.monotonic() from which the next batch end redraws

    def _draw(self) -> None:
        self._progress.update(self._task, advance=self._advance)
        self._advance = 0
        speed = next(task.speed for task in self._progress.tasks if task.id == self._task)
        shown = (f"{key}={self._shown[key]:.4g}" for key in self.metrics if key in self._shown)
        rate = f"{speed:.1f} steps/s" if speed else ""
        self._progress.update(self._task, rate=rate, metrics="  ".join(shown))

    def _read_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for key, (batch, value) in pending.items():
            if kept_alive("ProgressCallback", key, batch, value, self._warned_deleted):
                self._shown[key] = metric_value(key, value, who="ProgressCallback")
