"""EarlyStoppingConfig and EarlyStoppingCallback: the early-stopping rule as a training callback."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from substrax.support import Mode, check_float, check_int, check_mode

from ._metrics import check_monitor, metric_value, monitored
from ._protocol import BaseCallback, Logs
from ._tracker import EarlyStopping, check_state, state_number


_logger = logging.getLogger(__name__)
_WHO = "EarlyStoppingCallback"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EarlyStoppingConfig:
    """What :class:`EarlyStoppingCallback` watches and when it stops.

    Attributes:
        monitor: the metric name in the logs.
        min_delta: how much better a value must be to count as an improvement (>= 0).
        patience: how many checks in a row without improvement stop training (>= 1).
        mode: ``"min"`` or ``"max"``.
        check_finite: stop at once on a NaN or infinite value.
        stopping_threshold: stop at once when the value reaches it (good enough).
        divergence_threshold: stop at once when the value is worse than it (diverged).
        strict: raise :class:`MissingMetricError` when the logs lack ``monitor``, else skip.
        check_on_epoch_end: check in ``on_epoch_end``.
        check_on_validation_end: check in ``on_validation_end`` (then an epoch end after it
            does not check the same value again, nor a validation end right after an epoch end
            that checked the value it gives).
        verbose: log (``logging``, under the ``substrax.callbacks`` logger) why training stopped.

    Example:
        >>> from substrax.callbacks import EarlyStoppingConfig
        >>> EarlyStoppingConfig(monitor="val_acc", mode="max", patience=3).mode
        <Mode.MAX: 'max'>
    """

    monitor: str = "val_loss"
    min_delta: float = 0.0
    patience: int = 10
    mode: Mode = Mode.MIN
    check_finite: bool = True
    stopping_threshold: float | None = None
    divergence_threshold: float | None = None
    strict: bool = True
    check_on_epoch_end: bool = True
    check_on_validation_end: bool = False
    verbose: bool = False

    def __post_init__(self) -> None:
        check_monitor(self.monitor)
        check_int("patience", self.patience, minimum=1)
        check_float("min_delta", self.min_delta, minimum=0)
        object.__setattr__(self, "mode", check_mode("mode", self.mode))
        for name in ("stopping_threshold", "divergence_threshold"):
            if getattr(self, name) is not None:
                check_float(name, getattr(self, name))
        if not (self.check_on_epoch_end or self.check_on_validation_end):
            raise ValueError(
                "check_on_epoch_end and check_on_validation_end are both False, so the callback "
                "would never check; enable one of them"
            )


class EarlyStoppingCallback(BaseCallback):
    """Early stopping as a training callback: it sets ``should_stop``, the trainer stops.

    Args:
        config: what to watch and when to stop; defaults to ``EarlyStoppingConfig()``.

    Example:
        >>> from substrax.callbacks import EarlyStoppingCallback, EarlyStoppingConfig
        >>> callback = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=2))
        >>> for epoch, loss in enumerate([1.0, 0.9, 0.95, 0.97]):
        ...     callback.on_epoch_end(None, epoch, {"loss": loss})
        >>> callback.should_stop, callback.stopped_epoch, callback.best_score
        (True, 3, 0.9)
    """

    __slots__ = (
        "_config",
        "_epoch",
        "_epoch_value",
        "_stop_reason",
        "_stopped_epoch",
        "_stopper",
        "_validated",
    )

    def __init__(self, config: EarlyStoppingConfig | None = None) -> None:
        self._config = config if config is not None else EarlyStoppingConfig()
        self._stopper = EarlyStopping(
            patience=self._config.patience, min_delta=self._config.min_delta, mode=self._config.mode
        )
        self._stopped_epoch: int | None = None
        self._stop_reason: str | None = None
        self._epoch = 0
        self._validated = False  # this epoch's evaluation was checked at on_validation_end
        self._epoch_value: float | None = None  # the value this epoch's end checked

    @property
    def config(self) -> EarlyStoppingConfig:
        """The configuration."""
        return self._config

    @property
    def wait_count(self) -> int:
        """How many checks in a row have not improved."""
        return self._stopper.num_bad_epochs

    @property
    def best_score(self) -> float | None:
        """The best value so far, or None before the first finite one."""
        return None if math.isinf(self._stopper.best) else self._stopper.best

    @property
    def stopped_epoch(self) -> int | None:
        """The epoch at which stopping was decided, or None."""
        return self._stopped_epoch

    @property
    def stop_reason(self) -> str | None:
        """Why training should stop (patience, threshold, divergence, non-finite), or None."""
        return self._stop_reason

    @property
    def should_stop(self) -> bool:
        """Whether the trainer should stop."""
        return self._stop_reason is not None

    def on_epoch_begin(self, _trainer: object, epoch: int, /) -> None:
        """Remember the epoch, for checks made at validation end."""
        self._epoch = epoch
        self._validated = False
        self._epoch_value = None

    def on_epoch_end(self, _trainer: object, epoch: int, logs: Logs, /) -> None:
        """Check the monitored metric if ``check_on_epoch_end``, unless this epoch's evaluation was."""
        self._epoch = epoch
        if self._config.check_on_epoch_end and not self._validated:  # one value counts once
            self._epoch_value = self._check(logs, "on_epoch_end")
        self._validated = False

    def on_validation_end(self, _trainer: object, logs: Logs, /) -> None:
        """Check the monitored metric if ``check_on_validation_end``.

        Right after an epoch end that checked the value it gives, it does not count it again.
        """
        if self._config.check_on_validation_end:
            self._validated = True
            counted, self._epoch_value = self._epoch_value, None
            self._check(logs, "on_validation_end", counted=counted)

    def _check(self, logs: Logs, hook: str, *, counted: float | None = None) -> float | None:
        """Check the monitored value, unless it is ``counted`` already; return it (None if absent)."""
        monitor = self._config.monitor
        if not monitored(monitor, logs, hook, strict=self._config.strict) or self.should_stop:
            return None
        value = metric_value(monitor, logs[monitor], who=_WHO)
        if value == counted:  # the epoch end just before checked this evaluation
            return value
        self._stop_reason = self._reason(value)
        if self._stop_reason is not None:
            self._stopped_epoch = int(self._epoch)  # strict JSON, from a numpy or jax index too
            if self._config.verbose:
                _logger.info("early stopping at epoch %d: %s", self._epoch, self._stop_reason)
        return value

    def _reason(self, value: float) -> str | None:
        """Why ``value`` stops training, or None; a value no threshold stops counts for patience."""
        config, named = self._config, f"{self._config.monitor}={value}"
        sign = 1 if config.mode is Mode.MIN else -1  # compare as if smaller were better
        stopping, diverged = config.stopping_threshold, config.divergence_threshold
        if config.check_finite and not math.isfinite(value):
            return f"{named} is not finite"
        if diverged is not None and sign * value > sign * diverged:
            return f"{named} diverged past divergence_threshold={diverged}"
        self._stopper.update(value)  # a value good enough to stop at may be the best
        if stopping is not None and sign * value <= sign * stopping:
            return f"{named} reached stopping_threshold={stopping}"
        if self._stopper.should_stop:
            return (
                f"{config.monitor} did not improve by more than {config.min_delta} in "
                f"{config.patience} checks; best {self._stopper.best}"
            )
        return None

    def get_state(self) -> dict[str, Any]:
        """The state to checkpoint, strict JSON."""
        return {
            "stopper": self._stopper.get_state(),
            "stopped_epoch": self._stopped_epoch,
            "stop_reason": self._stop_reason,
            "monitor": self._config.monitor,
            "mode": self._config.mode.value,
        }

    def set_state(self, state: dict[str, Any], /) -> None:
        """Restore a state from :meth:`get_state` (``stop_reason``, ``monitor``, ``mode`` may be absent).

        Raises:
            ValueError: a key is missing or unknown, or a value is malformed (the message names it).
            MonitorMismatchError: the state was saved for another monitor or mode.
        """
        config, required = self._config, {"stopper", "stopped_epoch"}
        checked = check_state(
            _WHO, state, required, "stop_reason", monitor=config.monitor, mode=config.mode
        )
        wanted = "None or an integer >= 0"
        stopped = state_number(
            _WHO, checked, "stopped_epoch", wanted, integer=True, low=0, none=True
        )
        reason = checked.get("stop_reason")
        if not isinstance(reason, str | None) or (reason is not None and stopped is None):
            raise ValueError(
                f"{_WHO} state holds stop_reason={reason!r:.80} with stopped_epoch={stopped}; "
                "a reason is None or a string, given only with the epoch it stopped at"
            )
        self._stopper.set_state(checked["stopper"])
        self._stopped_epoch = stopped
        saved_stop = "restored from a state saved after stopping"
        self._stop_reason = saved_stop if reason is None and stopped is not None else reason
