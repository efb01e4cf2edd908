"""The errors substrax.callbacks raises: each a subclass of the builtin error it replaced.

Every class here is re-exported from :mod:`substrax.callbacks` and shows that module in
tracebacks. Each carries the offending values as attributes; its message says what to do.
"""

from substrax.support import StructuredError


__all__ = [
    "CallbackStateMismatchError",
    "CostAnalysisError",
    "MetricValueError",
    "MissingMetricError",
    "MonitorMismatchError",
    "NoLearningRateFoundError",
]


class CallbackStateMismatchError(StructuredError, ValueError):
    """A saved CallbackList state does not match the stateful callbacks of this list.

    Attributes:
        expected: the positions (as strings) of this list's stateful callbacks.
        found: the positions in the saved state.
    """

    __module__ = "substrax.callbacks"
    expected: tuple[str, ...]
    found: tuple[str, ...]

    def _message(self) -> str:
        return (
            f"saved callback state covers positions {list(self.found)}, but this CallbackList has "
            f"stateful callbacks at positions {list(self.expected)}; build the list with the same "
            "callbacks in the same order as when the state was saved"
        )


class MissingMetricError(StructuredError, KeyError):
    """A callback's monitored metric is not in the logs it was given.

    Attributes:
        monitor: the metric the callback watches.
        available: the keys the logs did hold.
        hook: the hook that was given the logs (``"on_epoch_end"``).
    """

    __module__ = "substrax.callbacks"
    monitor: str
    available: tuple[str, ...]
    hook: str

    def __post_init__(self) -> None:
        KeyError.__init__(self, self.monitor)  # a KeyError's args hold the missing key

    def __str__(self) -> str:
        return self._message()

    def _message(self) -> str:
        return (
            f"monitored metric {self.monitor!r} is not in the logs passed to {self.hook} "
            f"(they hold {list(self.available)}); log it there, change `monitor`, or pass "
            "strict=False to skip updates without it"
        )


class NoLearningRateFoundError(StructuredError, LookupError):
    """The optimizer state holds neither a ``reduce_on_plateau`` scale nor the hyperparameter.

    Attributes:
        hyperparam: the injected hyperparameter name that was looked for.
    """

    __module__ = "substrax.callbacks"
    template = (
        "the optimizer state holds no `optax.contrib.reduce_on_plateau` state and no "
        "`optax.inject_hyperparams` hyperparameter {hyperparam!r}; chain "
        "reduce_on_plateau into the transformation or wrap it in inject_hyperparams"
    )
    hyperparam: str


class MetricValueError(StructuredError, TypeError):
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
    metric: str
    value: object
    who: str

    def _message(self) -> str:
        shape = getattr(self.value, "shape", None)
        what = f"an array of shape {shape}" if shape is not None else f"{self.value!r:.80}"
        return (
            f"{self.who} reads metric {self.metric!r} as one number, but it was logged as {what} "
            f"({type(self.value).__name__}); log a scalar (reduce a vector with .mean(), or log "
            "its parts under their own names)"
        )


class MonitorMismatchError(StructuredError, ValueError):
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
    template = (
        "the saved early-stopping state tracks {saved[0]!r} ({saved[1]}), but this callback "
        "watches {configured[0]!r} ({configured[1]}); its best value and patience count "
        "mean nothing here: restore it into a callback with the same monitor and mode, or "
        "start this callback fresh (leave its state out of the restore)"
    )
    saved: tuple[str, str]
    configured: tuple[str, str]


class CostAnalysisError(StructuredError, LookupError):
    """A step whose FLOPs cannot be counted from its program, and why.

    :func:`~substrax.callbacks.step_flops` counts from the step's jaxpr
    (:func:`substrax.devices.count_flops`); it gives no figure rather than a partial one for a
    program that multiplies inside a ``while`` loop, calls an opaque kernel (Pallas, an FFI
    call) or has no matrix work at all.

    Attributes:
        function: a description of what was counted.
        reason: why it cannot be counted (``FlopCount.reason``); None if not known.

    Example:
        >>> from substrax.callbacks import CostAnalysisError
        >>> error = CostAnalysisError("step", "the program calls the opaque kernel 'pallas_call'")
        >>> error.reason
        "the program calls the opaque kernel 'pallas_call'"
    """

    __module__ = "substrax.callbacks"
    function: object
    reason: str | None

    def __post_init__(self) -> None:
        self.function = f"{self.function!r:.120}"
        super().__post_init__()

    def _message(self) -> str:
        why = self.reason or "no reason given"
        return (
            f"cannot count the FLOPs of {self.function} from its program: {why}. Pass "
            "ThroughputMeter(flops_per_step=...) yourself (e.g. 6 * parameters * tokens per "
            "step, divided by the number of devices), or flops_per_step=None to log no FLOP/s "
            "or MFU"
        )
