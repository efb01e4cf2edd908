"""The errors substrax.callbacks raises: each a subclass of the builtin error it replaced.

Every class here is re-exported from :mod:`substrax.callbacks` and shows that module in
tracebacks. Each carries the offending values as attributes; its message says what to do.
"""

from __future__ import annotations

from substrax.support import PicklableError


__all__ = [
    "CallbackStateMismatchError",
    "CostAnalysisError",
    "MetricValueError",
    "MissingMetricError",
    "MonitorMismatchError",
    "NoLearningRateFoundError",
]


class CallbackStateMismatchError(PicklableError, ValueError):
    """A saved CallbackList state does not match the stateful callbacks of this list.

    Attributes:
        expected: the positions (as strings) of this list's stateful callbacks.
        found: the positions in the saved state.
    """

    __module__ = "substrax.callbacks"

    def __init__(self, expected: tuple[str, ...], found: tuple[str, ...]) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            f"saved callback state covers positions {list(found)}, but this CallbackList has "
            f"stateful callbacks at positions {list(expected)}; build the list with the same "
            "callbacks in the same order as when the state was saved"
        )


class MissingMetricError(PicklableError, KeyError):
    """A callback's monitored metric is not in the logs it was given.

    Attributes:
        monitor: the metric the callback watches.
        available: the keys the logs did hold.
        hook: the hook that was given the logs (``"on_epoch_end"``).
    """

    __module__ = "substrax.callbacks"

    def __init__(self, monitor: str, available: tuple[str, ...], hook: str) -> None:
        self.monitor = monitor
        self.available = available
        self.hook = hook
        super().__init__(monitor)

    def __str__(self) -> str:
        return (
            f"monitored metric {self.monitor!r} is not in the logs passed to {self.hook} "
            f"(they hold {list(self.available)}); log it there, change `monitor`, or pass "
            "strict=False to skip updates without it"
        )


class NoLearningRateFoundError(PicklableError, LookupError):
    """The optimizer state holds neither a ``reduce_on_plateau`` scale nor the hyperparameter.

    Attributes:
        hyperparam: the injected hyperparameter name that was looked for.
    """

    __module__ = "substrax.callbacks"

    def __init__(self, hyperparam: str) -> None:
        self.hyperparam = hyperparam
        super().__init__(
            "the optimizer state holds no `optax.contrib.reduce_on_plateau` state and no "
            f"`optax.inject_hyperparams` hyperparameter {hyperparam!r}; chain "
            "reduce_on_plateau into the transformation or wrap it in inject_hyperparams"
        )


class MetricValueError(PicklableError, TypeError):
    """A logged metric that is not one number (None, a string, a vector).

    Attributes:
        metric: the metric's name in the logs.
        value: what was logged under it.
        who: the callback that read it.

    Example:
        >>> from substrax.callbacks import MetricValueError
        >>> error = MetricValueError("loss", None, who="LossSpikeDetector")
        >>> error.metric, error.value
        ('loss', None)
    """

    __module__ = "substrax.callbacks"

    def __init__(self, metric: str, value: object, *, who: str) -> None:
        self.metric = metric
        self.value = value
        self.who = who
        shape = getattr(value, "shape", None)
        what = f"an array of shape {shape}" if shape is not None else f"{value!r:.80}"
        super().__init__(
            f"{who} reads metric {metric!r} as one number, but it was logged as {what} "
            f"({type(value).__name__}); log a scalar (reduce a vector with .mean(), or log "
            "its parts under their own names)"
        )


class MonitorMismatchError(PicklableError, ValueError):
    """A saved callback state that was recorded for another metric or mode.

    Attributes:
        saved: the ``(monitor, mode)`` the state was saved with.
        configured: the ``(monitor, mode)`` of the callback restoring it.

    Example:
        >>> from substrax.callbacks import MonitorMismatchError
        >>> MonitorMismatchError(("val_loss", "min"), ("val_acc", "max")).saved
        ('val_loss', 'min')
    """

    __module__ = "substrax.callbacks"

    def __init__(self, saved: tuple[str, str], configured: tuple[str, str]) -> None:
        self.saved = saved
        self.configured = configured
        super().__init__(
            f"the saved early-stopping state tracks {saved[0]!r} ({saved[1]}), but this callback "
            f"watches {configured[0]!r} ({configured[1]}); its best value and patience count "
            "mean nothing here: restore it into a callback with the same monitor and mode, or "
            "start this callback fresh (leave its state out of the restore)"
        )


class CostAnalysisError(PicklableError, LookupError):
    """A compiled step whose cost analysis reports no FLOP count (some backends give none).

    Attributes:
        function: a description of what was analysed.
        analysis: what the cost analysis returned.

    Example:
        >>> from substrax.callbacks import CostAnalysisError
        >>> CostAnalysisError("step", None).analysis is None
        True
    """

    __module__ = "substrax.callbacks"

    def __init__(self, function: object, analysis: object) -> None:
        self.function = f"{function!r:.120}"
        self.analysis = analysis
        super().__init__(
            f"XLA's cost analysis of {self.function} reports no FLOP count (it gave "
            f"{analysis!r:.200}); pass ThroughputMeter(flops_per_step=...) yourself, e.g. "
            "6 * parameters * tokens per step divided by the number of devices"
        )
