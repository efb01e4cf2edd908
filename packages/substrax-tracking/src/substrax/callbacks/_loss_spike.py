"""LossSpikeDetector: notice a loss that jumps far above its recent values."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from substrax.support import check_float, check_int, is_device_array

from ._metrics import check_metric, check_monitor, kept_alive, metric_value, warn_missing_metric
from ._protocol import BaseCallback, Logs
from ._tracker import check_state, state_number


_logger = logging.getLogger(__name__)
_WHO = "LossSpikeDetector"
_MIN_WINDOW = 2
_RESOLUTION = 2.0**-23
"""float32's relative resolution: a deviation below it times the mean (or 1) is never a spike."""
KEPT_SPIKES = 16
"""How many of the latest spikes a saved state holds (with the count of all)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LossSpike:
    """One detected spike.

    Attributes:
        batch: the step index passed to ``on_batch_end``.
        value: the spiking value.
        mean: the mean of the recent window it was compared with.
        std: the standard deviation of that window.
    """

    batch: int
    value: float
    mean: float
    std: float


def _mean_std(values: deque[float]) -> tuple[float, float]:
    """The mean and population deviation (NaN and 0 if empty); hypot does not overflow at 1e170."""
    if not values:
        return math.nan, 0.0
    mean = math.fsum(values) / len(values)
    return mean, math.hypot(*(value - mean for value in values)) / math.sqrt(len(values))


class LossSpikeDetector(BaseCallback):
    """Flag steps whose ``monitor`` value is more than ``threshold`` standard deviations above the recent mean.

    Nothing is flagged before ``warmup`` values; a level held for ``warmup`` flagged steps in a
    row becomes the new window. A NaN or infinite value always spikes. A jax array is decided at
    the next hook, so the detector never waits for a step. Spikes are logged as warnings.
    :attr:`spikes` holds those seen (after :meth:`set_state`, the latest 16 saved), and
    :attr:`spike_count` counts them all.

    Args:
        monitor: the metric name in the batch-end logs (warned about once if never logged).
        window: how many recent values to compare with (>= 2).
        threshold: the number of standard deviations that counts as a spike (> 0).
        warmup: values to see before flagging (>= 2, <= window).
        min_std_fraction: a floor on the deviation, as a fraction of the mean's magnitude (>= 0).
        max_spikes: spikes after which ``should_stop`` is true; None never.
        on_spike: called with each :class:`LossSpike`.

    Raises:
        ValueError: a number is out of its range, infinite or NaN; the message names it.
        TypeError: a number has the wrong type, or ``on_spike`` is not callable.

    Example:
        >>> from substrax.callbacks import LossSpikeDetector
        >>> detector = LossSpikeDetector(window=10, warmup=5, threshold=4.0)
        >>> for step, loss in enumerate([1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 9.0, 1.0]):
        ...     detector.on_batch_end(None, step, {"loss": loss})
        >>> [spike.batch for spike in detector.spikes]
        [6]
    """

    def __init__(
        self,
        *,
        monitor: str = "loss",
        window: int = 100,
        threshold: float = 6.0,
        warmup: int = 10,
        min_std_fraction: float = 0.01,
        max_spikes: int | None = None,
        on_spike: Callable[[LossSpike], Any] | None = None,
    ) -> None:
        check_int("window", window, minimum=_MIN_WINDOW)
        self.warmup = check_int("warmup", warmup, minimum=_MIN_WINDOW)
        if warmup > window:
            raise ValueError(f"warmup={warmup!r} must be at most window={window}")
        if max_spikes is not None:
            check_int("max_spikes", max_spikes, minimum=1)
        if on_spike is not None and not callable(on_spike):
            raise TypeError(f"on_spike={on_spike!r} must be a function taking a LossSpike")
        self.monitor = check_monitor(monitor)
        self.threshold = check_float("threshold", threshold, minimum=0, exclusive_minimum=True)
        self.min_std_fraction = check_float("min_std_fraction", min_std_fraction, minimum=0)
        self.max_spikes = max_spikes
        self.on_spike = on_spike
        self.spikes: list[LossSpike] = []
        self._unlisted = 0  # spikes of a restored run that its saved state left out of the list
        self._recent: deque[float] = deque(maxlen=window)
        self._streak: list[float] = []  # the finite spikes in a row
        self._checked = False  # whether logs held the monitor, or were warned about
        self._pending: tuple[int, Any] | None = None  # (batch, a jax array) to decide next
        self._warned_deleted: set[str] = set()

    @property
    def should_stop(self) -> bool:
        """Whether ``max_spikes`` spikes have been seen."""
        return self.max_spikes is not None and self.spike_count >= self.max_spikes

    @property
    def spike_count(self) -> int:
        """How many spikes have been seen, those of the run before a restore included."""
        return self._unlisted + len(self.spikes)

    def on_batch_end(self, _trainer: object, batch: int, logs: Logs, /) -> None:
        """Decide the value kept from the step before; decide this step's, or keep a jax array.

        Raises:
            MetricValueError: the step's value is not one number (it is not kept).
        """
        self.flush()
        if not (self._checked or self.monitor in logs):
            warn_missing_metric(_WHO, self.monitor, logs)
        self._checked = True
        if self.monitor not in logs:
            return
        value = logs[self.monitor]
        check_metric(self.monitor, value, who=_WHO)
        if is_device_array(value):
            self._pending = (batch, value)  # this step may still run
        else:
            self._decide(batch, value)

    def flush(self) -> None:
        """Decide the value kept from the last step now (this waits for that step)."""
        if self._pending is not None:
            (batch, value), self._pending = self._pending, None  # once, even if reading raises
            if kept_alive(_WHO, self.monitor, batch, value, self._warned_deleted):
                self._decide(batch, value)

    def on_train_begin(self, _trainer: object, /) -> None:
        """Drop a value kept from a run that never reached ``on_train_end``."""
        self._pending = None

    def on_train_end(self, _trainer: object, /) -> None:
        """Decide the last step's value."""
        self.flush()

    def on_epoch_end(self, _trainer: object, _epoch: int, _logs: Logs, /) -> None:
        """Decide the last step's value before the epoch's own checks."""
        self.flush()

    def on_validation_end(self, _trainer: object, _logs: Logs, /) -> None:
        """Decide the last step's value."""
        self.flush()

    def get_state(self) -> dict[str, Any]:
        """The state to checkpoint, strict JSON: the window, a streak, the latest spikes, the count.

        The value kept from the last step is decided first (this waits for that step), so a
        resumed run flags the spikes the uninterrupted one would (a window starting empty saw
        a spike where the run had a calmer past). It holds the latest 16 spikes and the count
        of all, so its size is bounded. A non-finite value is its text.
        """
        self.flush()
        kept = self.spikes[-KEPT_SPIKES:]
        return {
            "recent": [_json(v) for v in self._recent],
            "streak": [_json(v) for v in self._streak],
            "spikes": [[s.batch, *map(_json, (s.value, s.mean, s.std))] for s in kept],
            "spike_count": self.spike_count,
            "monitor": self.monitor,
        }

    def set_state(self, state: dict[str, Any], /) -> None:
        """Restore a state from :meth:`get_state` (``spike_count``, ``monitor`` may be absent).

        Raises:
            ValueError: a key is missing or unknown, or a value is malformed (the message names it).
            MonitorMismatchError: the state was saved by a detector of another ``monitor``.
        """
        required = {"recent", "streak", "spikes"}
        checked = check_state(_WHO, state, required, "spike_count", monitor=self.monitor)
        try:
            recent = [float(v) for v in checked["recent"]]
            streak = [float(v) for v in checked["streak"]]
            spikes = [
                LossSpike(batch=int(b), value=float(v), mean=float(m), std=float(s))
                for b, v, m, s in checked["spikes"]
            ]
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{_WHO} state holds a malformed window or spike ({error}); restore a state "
                "that get_state() returned"
            ) from None
        counted = {"spike_count": checked.get("spike_count", len(spikes))}
        wanted = f"an integer >= the {len(spikes)} spikes it lists"
        count = state_number(_WHO, counted, "spike_count", wanted, integer=True, low=len(spikes))
        self._recent = deque(recent, maxlen=self._recent.maxlen)
        self._streak, self.spikes, self._pending = streak, spikes, None
        self._unlisted = count - len(spikes)

    def _decide(self, batch: int, logged: object) -> None:
        value = metric_value(self.monitor, logged, who=_WHO)
        mean, std = _mean_std(self._recent)
        floor = self.min_std_fraction * abs(mean) if math.isfinite(mean) else 0.0
        rounding = _RESOLUTION * (abs(mean) if mean and math.isfinite(mean) else 1.0)
        if math.isfinite(value) and not (
            len(self._recent) >= self.warmup
            and value - mean > self.threshold * max(std, floor, rounding)
        ):
            self._streak.clear()
            self._recent.append(value)
            return
        spike = LossSpike(batch=int(batch), value=value, mean=mean, std=std)  # not numpy's
        self.spikes.append(spike)
        message = "%s spiked at step %d: %g against a recent mean %g (std %g)"
        _logger.warning(message, self.monitor, batch, value, mean, std)
        if self.on_spike is not None:
            self.on_spike(spike)
        self._streak = [*self._streak, value] if math.isfinite(value) else []
        if len(self._streak) >= self.warmup:  # a lasting level: the new window
            self._recent = deque(self._streak, maxlen=self._recent.maxlen)
            self._streak = []


def _json(value: float) -> float | str:
    """``value``, or its text when not finite (strict JSON has no NaN or infinity)."""
    return value if math.isfinite(value) else str(value)
