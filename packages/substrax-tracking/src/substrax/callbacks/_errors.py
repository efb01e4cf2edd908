"""The errors substrax.callbacks raises, each a subclass of the builtin error it replaces."""

from substrax.support import StructuredError


class _CallbackError(StructuredError, public_module="substrax.callbacks"):
    """The base of every error here: each shows as ``substrax.callbacks``'s, where users import it."""


class CallbackStateMismatchError(_CallbackError, ValueError):
    """A saved CallbackList state's positions (``found``) are not this list's (``expected``)."""

    expected: tuple[str, ...]
    found: tuple[str, ...]

    def _message(self) -> str:
        return (
            f"saved callback state covers positions {list(self.found)}, but this CallbackList has "
            f"stateful callbacks at positions {list(self.expected)}; build the list with the same "
            "callbacks in the same order as when the state was saved"
        )


class MissingMetricError(_CallbackError, KeyError):
    """A callback's ``monitor`` metric is not in the logs given to ``hook``; args hold the key."""

    monitor: str
    available: tuple[str, ...]
    hook: str

    def __post_init__(self) -> None:
        KeyError.__init__(self, self.monitor)

    def __str__(self) -> str:
        return (
            f"monitored metric {self.monitor!r} is not in the logs passed to {self.hook} "
            f"(they hold {list(self.available)}); log it there, change `monitor`, or pass "
            "strict=False to skip updates without it"
        )


class NoLearningRateFoundError(_CallbackError, LookupError):
    """The optimizer state holds neither a ``reduce_on_plateau`` scale nor the hyperparameter."""

    template = (
        "the optimizer state holds no `optax.contrib.reduce_on_plateau` state and no "
        "`optax.inject_hyperparams` hyperparameter {hyperparam!r}; chain "
        "reduce_on_plateau into the transformation or wrap it in inject_hyperparams"
    )
    hyperparam: str


class MetricValueError(_CallbackError, TypeError):
    """A logged metric read by the callback ``who`` is not one number (None, a string, a vector).

    Example:
        >>> from substrax.callbacks import MetricValueError
        >>> MetricValueError("loss", None, who="LossSpikeDetector").metric
        'loss'
    """

    metric: str
    value: object
    who: str

    def _message(self) -> str:
        shape = getattr(self.value, "shape", None)
        what = f"an array of shape {shape}" if shape is not None else f"{self.value!r:.80}"
        stacked = (
            f" (a TrainStep(steps_per_call={shape[0]}) returns one loss per step: pass the last, "
            "losses[-1])"
            if shape is not None and len(shape) == 1
            else ""
        )
        return (
            f"{self.who} reads metric {self.metric!r} as one number, but it was logged as {what} "
            f"({type(self.value).__name__}); log a scalar (reduce a vector with .mean(), or log "
            f"its parts under their own names){stacked}"
        )


class MonitorMismatchError(_CallbackError, ValueError):
    """A saved callback state was recorded for another ``(monitor, mode)`` than this callback's.

    ``""`` stands for a part the object has not (a tracker's monitor, a spike detector's mode).

    Example:
        >>> from substrax.callbacks import MonitorMismatchError
        >>> MonitorMismatchError(("val_loss", "min"), ("val_acc", "max")).saved
        ('val_loss', 'min')
    """

    saved: tuple[str, str]
    configured: tuple[str, str]

    def _message(self) -> str:
        pairs = zip(("monitor", "mode"), self.saved, self.configured, strict=True)
        differs = " and ".join(name for name, saved, configured in pairs if saved != configured)
        return (
            f"the saved state tracks {_watched(self.saved)}, but this callback watches "
            f"{_watched(self.configured)}: another {differs}. The values it holds (a best, a "
            "patience count, a window) mean nothing here: restore it into a callback with the "
            "same monitor and mode, or start this callback fresh (leave its state out)"
        )


def _watched(pair: tuple[str, str]) -> str:
    """``'val_loss' (min)``, or the part given (a tracker has no monitor, a detector no mode)."""
    monitor, mode = pair
    if monitor and mode:
        return f"{monitor!r} ({mode})"
    return repr(monitor) if monitor else f"mode {mode!r}"


class CostAnalysisError(_CallbackError, LookupError):
    """A step's FLOPs cannot be counted from its jaxpr; ``reason`` says why (None if unknown).

    Example:
        >>> from substrax.callbacks import CostAnalysisError
        >>> CostAnalysisError("step", "the program calls the opaque kernel 'pallas_call'").reason
        "the program calls the opaque kernel 'pallas_call'"
    """

    function: object
    reason: str | None

    def __post_init__(self) -> None:
        self.function = f"{self.function!r:.120}"  # the description shown, not the function
        super().__post_init__()

    def _message(self) -> str:
        return (
            f"cannot count the FLOPs of {self.function} from its program: "
            f"{self.reason or 'no reason given'}. Pass ThroughputMeter(flops_per_step=...) "
            "yourself (e.g. 6 * parameters * tokens per step, divided by the number of devices), "
            "or flops_per_step=None to log no FLOP/s or MFU"
        )
