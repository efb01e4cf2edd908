"""LossSpikeDetector: notice a loss that jumps far above its recent values."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from substrax.support import check_float, check_int

from ._metrics import (
    check_metric,
    is_device_array,
    metric_value,
    warn_deleted,
    warn_missing_metric,
    was_deleted,
)
from ._protocol import BaseCallback, Logs


__all__ = ["LossSpike", "LossSpikeDetector"]

_logger = logging.getLogger(__name__)
_MIN_WINDOW = 2
_RESOLUTION = 2.0**-23
"""float32's resolution at 1.0: a deviation below it is rounding, never a spike."""


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
    """The mean and population standard deviation of ``values`` (NaN and 0 when empty).

    ``math.fsum`` and ``math.hypot`` keep them exact enough at a tenth of the cost of
    ``statistics.pstdev``'s exact fractions, which every step would pay; ``hypot`` scales, so a
    diverged float64 loss (1e170) does not overflow where squaring its deviations would.

    Example:
        >>> from collections import deque
        >>> from substrax.callbacks._loss_spike import _mean_std
        >>> _mean_std(deque([1.0, 2.0, 3.0, 4.0]))
        (2.5, 1.118033988749895)
    """
    if not values:
        return math.nan, 0.0
    mean = math.fsum(values) / len(values)
    return mean, math.hypot(*(value - mean for value in values)) / math.sqrt(len(values))


class LossSpikeDetector(BaseCallback):
    """Flag steps whose ``monitor`` value is more than ``threshold`` standard deviations above the recent mean.

    The recent window holds the last ``window`` non-spiking values; nothing is flagged until
    ``warmup`` values have been seen. A NaN or infinite value is always a spike; a rise below
    float32's resolution (about 1.2e-7) never is. A level the value stays at for ``warmup``
    steps in a row, each flagged, becomes the new recent window: a loss that settles higher is
    flagged while it rises, not at every later step. Spikes are kept
    in :attr:`spikes`, logged at WARNING on logger ``substrax.callbacks``, and passed to
    ``on_spike``; after ``max_spikes`` spikes :attr:`should_stop` turns true.

    A value logged as a jax array is decided one step late: ``on_batch_end`` keeps it and
    reads it at the next ``on_batch_end``, when the next step has been dispatched, so reading
    it never holds back the device (reading it at once would wait for the step before the next
    one could be dispatched, every step). A spike found there carries its own step's
    ``batch``, and :attr:`should_stop` turns true one step after it. A Python or numpy number
    costs nothing to read and is decided at once (after a value still kept from the step
    before, so values are always decided in order). ``on_epoch_end``, ``on_validation_end``,
    ``on_train_end`` and :meth:`flush` decide the kept value at once, so a spike at the last
    step is still reported; ``on_train_begin`` drops one left by a run that never ended.
    A metric that is not one number (a vector, None) is refused at once, from its shape. A kept
    array deleted before it is read (donated to the next step's call: log the loss the step
    returns, not a value inside its donated state) is skipped, with one warning.

    Args:
        monitor: the metric name in the batch-end logs. Logs that never held it are warned
            about once (a misspelled name), naming the metrics they did hold.
        window: how many recent values to compare with (>= 2).
        threshold: the number of standard deviations that counts as a spike (> 0).
        warmup: values to see before flagging (>= 2, <= window).
        min_std_fraction: a floor on the deviation, as a fraction of the mean's magnitude,
            so that a perfectly flat loss does not flag tiny wiggles.
        max_spikes: spikes after which ``should_stop`` is true; None never.
        on_spike: called with each :class:`LossSpike`.

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
        check_int("warmup", warmup, minimum=_MIN_WINDOW)
        if warmup > window:
            raise ValueError(f"warmup={warmup!r} must be at most window={window}")
        check_float("threshold", threshold, minimum=0, exclusive_minimum=True)
        if max_spikes is not None:
            check_int("max_spikes", max_spikes, minimum=1)
        self.monitor = monitor
        self.threshold = float(threshold)
        self.warmup = warmup
        self.min_std_fraction = float(min_std_fraction)
        self.max_spikes = max_spikes
        self.on_spike = on_spike
        self.spikes: list[LossSpike] = []
        self._recent: deque[float] = deque(maxlen=window)
        self._streak: list[float] = []  # the finite spikes in a row, newest last
        self._seen = False
        self._warned = False
        self._pending: tuple[int, Any] | None = None  # (batch, a jax array) to decide next
        self._warned_deleted = False

    @property
    def should_stop(self) -> bool:
        """Whether ``max_spikes`` spikes have been seen."""
        return self.max_spikes is not None and len(self.spikes) >= self.max_spikes

    def on_batch_end(self, _trainer: object, batch: int, logs: Logs, /) -> None:
        """Decide the value kept from the step before; decide this step's, or keep a jax array.

        Raises:
            MetricValueError: the step's value is not one number (it is not kept).
        """
        self.flush()
        if self.monitor not in logs:
            if not (self._seen or self._warned):
                self._warned = True
                warn_missing_metric("LossSpikeDetector", self.monitor, logs)
            return
        self._seen = True
        value = logs[self.monitor]
        check_metric(self.monitor, value, who="LossSpikeDetector")
        if is_device_array(value):
            self._pending = (batch, value)  # read at the next step: this one may still run
        else:
            self._decide(batch, value)

    def flush(self) -> None:
        """Decide the value kept from the last step now (this waits for that step)."""
        if self._pending is not None:
            batch, value = self._pending
            self._pending = None  # decided once, even if reading it raises
            if not was_deleted(value):
                self._decide(batch, value)
            elif not self._warned_deleted:
                self._warned_deleted = True
                warn_deleted("LossSpikeDetector", self.monitor, batch)

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

    def _decide(self, batch: int, logged: object) -> None:
        """Compare one step's value with the recent window."""
        value = metric_value(self.monitor, logged, who="LossSpikeDetector")
        if len(self._recent) >= self.warmup or not math.isfinite(value):
            mean, std = _mean_std(self._recent)
            floor = self.min_std_fraction * abs(mean) if math.isfinite(mean) else 0.0
            if not math.isfinite(value) or value - mean > self.threshold * max(
                std, floor, _RESOLUTION
            ):
                spike = LossSpike(batch=batch, value=value, mean=mean, std=std)
                self.spikes.append(spike)
                _logger.warning(
                    "%s spiked at step %d: %g against a recent mean %g (std %g)",
                    self.monitor,
                    batch,
                    value,
                    mean,
                    std,
                )
                if self.on_spike is not None:
                    self.on_spike(spike)
                self._settle(value)
                return
        self._streak.clear()
        self._recent.append(value)

    def _settle(self, value: float) -> None:
        """Count a spike in the current streak; ``warmup`` in a row make the new window."""
        if not math.isfinite(value):
            self._streak.clear()
            return
        self._streak.append(value)
        if len(self._streak) >= self.warmup:
            self._recent.clear()
            self._recent.extend(self._streak)
            self._streak.clear()
