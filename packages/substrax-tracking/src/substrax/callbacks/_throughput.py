"""ThroughputMeter: steps/s, examples/s, tokens/s, FLOP/s and MFU, measured over windows of steps."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from substrax.support import check_float, check_int, is_device_array

from ._errors import CostAnalysisError
from ._metrics import wait_for
from ._protocol import BaseCallback, Logs


_logger = logging.getLogger(__name__)


@runtime_checkable
class MetricsLogger(Protocol):
    """Anything with ``log_metrics(metrics, step)``: every substrax.tracking logger.

    Example:
        >>> import tempfile
        >>> from substrax.callbacks import MetricsLogger
        >>> from substrax.tracking import FileLogger
        >>> with tempfile.TemporaryDirectory() as tmp, FileLogger("run", tmp) as logger:
        ...     isinstance(logger, MetricsLogger)
        True
    """

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Record ``metrics`` at ``step``."""


def step_flops(function: Any, *args: Any, **kwargs: Any) -> float:  # noqa: ANN401
    """One device's share of the matrix FLOPs of one call of ``function`` on ``args``.

    The FLOPs are counted from the traced program (:func:`substrax.devices.count_flops`), never
    run, and divided by the number of devices the program spans: those of the inputs' shardings
    and of the shardings the program names itself (a ``jax.jit``'s ``in_shardings``, a sharding
    constraint). ``args`` may be ``jax.ShapeDtypeStruct``.

    Raises:
        CostAnalysisError: the FLOPs cannot be counted; its ``reason`` says why.
        TypeError: ``function`` is a ``Lowered``, ``Compiled`` or ``Traced`` stage, or not callable.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from substrax.callbacks import step_flops
        >>> step_flops(jax.jit(lambda a, b: a @ b), jnp.ones((4, 8)), jnp.ones((8, 2)))
        128.0
    """
    import jax  # noqa: PLC0415  (importing substrax.callbacks starts no jax)

    from substrax.devices import count_flops  # noqa: PLC0415  (likewise)

    stages = (jax.stages.Lowered, jax.stages.Compiled, jax.stages.Traced)
    if isinstance(function, stages) or not callable(function):
        raise TypeError(
            f"step_flops counts from a program's jaxpr, which {type(function).__name__} does "
            "not carry; pass the jitted function and its arguments: step_flops(step, *args)"
        )
    count = count_flops(function, *args, **kwargs)
    if count.flops is None:
        raise CostAnalysisError(function, count.reason)
    devices: set[Any] = set()  # that the inputs' shardings span, and those the program names
    abstract = 1  # a sharding over an abstract mesh names no devices, only their number
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    given = filter(None, (getattr(leaf, "sharding", None) for leaf in leaves))
    for sharding in (*given, *_named_shardings(function, args, kwargs)):
        try:
            devices.update(sharding.device_set)
        except (AttributeError, TypeError, ValueError, RuntimeError):
            abstract = max(abstract, int(getattr(sharding, "num_devices", 1)))
    return count.flops / max(len(devices), abstract)


def _named_shardings(function: Any, args: Any, kwargs: Any) -> list[Any]:  # noqa: ANN401
    """The shardings ``function``'s own program names (a jit's ``in_shardings``, a constraint).

    A jit with ``in_shardings`` runs on its mesh whatever devices its (host, uncommitted) inputs
    are on. A function that cannot be traced with its static arguments as values names none.
    """
    import jax  # noqa: PLC0415  (see step_flops)

    try:
        closed = jax.make_jaxpr(function)(*args, **kwargs)
    except Exception:  # static arguments: the inputs' shardings alone
        return []
    found: list[Any] = []
    todo: list[Any] = [closed.jaxpr]
    while todo:  # the program and every program inside it (a jit's, a scan's body)
        for eqn in todo.pop().eqns:
            for value in eqn.params.values():
                for item in value if isinstance(value, tuple | list) else (value,):
                    if isinstance(item, jax.sharding.Sharding):
                        found.append(item)
                    elif hasattr(inner := getattr(item, "jaxpr", item), "eqns"):
                        todo.append(inner)
    return found


def _all_ready(values: Iterable[Any]) -> bool:
    """Whether the jax arrays among ``values`` are computed, without waiting (a failed one is not)."""
    try:  # a deleted one is asked first: jax 0.11's is_ready crashes the process on it
        return all(
            not value.is_deleted() and value.is_ready()
            for value in values
            if is_device_array(value)
        )
    except RuntimeError:  # a failed one: waiting raises a failed step's error
        return False


@dataclass(frozen=True, slots=True)
class _Boundary:
    """A window's start or end: a step whose outputs must be computed before the clock reads."""

    batch: int
    values: tuple[Any, ...]  # the step's batch-end logs
    steps: int  # the batch ends the window counted; 0 where the boundary starts the clock


class ThroughputMeter(BaseCallback):
    """Measure training throughput over windows of steps and log it through any logger.

    Every ``window`` steps it logs, under ``prefix``: ``steps_per_sec``, ``examples_per_sec`` and
    ``tokens_per_sec`` (given their sizes), ``flops_per_sec_per_device`` (given
    ``flops_per_step``) and ``mfu`` (given the device's peak too); :attr:`latest` holds them,
    None for those not known. A window is timed between the moments its boundary steps' outputs
    are computed: the jax arrays among their batch-end logs, so log the step's output (its loss);
    logs holding none time the moment the loop handed them over (after ``float(loss)``, which
    waited; for empty logs, the step's dispatch: warned once). The first step, which compiles, only starts the clock. ``with meter.pause():`` or a
    validation leaves its time out (summed in :attr:`paused_seconds`).

    Args:
        logger: where to log (``log_metrics(metrics, step)``); None only keeps :attr:`latest`.
        window: ``on_batch_end`` calls per measurement (>= 1).
        examples_per_step: the global batch size (of one optimizer step).
        tokens_per_example: tokens in each example (sequence length), for ``tokens_per_sec``.
        flops_per_step: one device's FLOPs per optimizer step (> 0), e.g. :func:`step_flops`'s.
        peak_flops: one device's peak FLOP/s for MFU; ``"detect"`` asks ``substrax.devices``.
        prefix: put before every logged name.
        steps_per_call: optimizer steps each ``on_batch_end`` stands for (>= 1).
        clock: the clock read at window boundaries and pauses, in seconds.

    Example:
        >>> from substrax.callbacks import ThroughputMeter
        >>> meter = ThroughputMeter(window=2, examples_per_step=32, flops_per_step=1e6)
        >>> for step in range(5):
        ...     meter.on_batch_end(None, step, {"loss": 0.5})
        >>> sorted(meter.latest)
        ['examples_per_sec', 'flops_per_sec_per_device', 'mfu', 'steps_per_sec']
        >>> meter.latest["mfu"] is None  # no known peak on CPU
        True
    """

    def __init__(
        self,
        logger: MetricsLogger | None = None,
        *,
        window: int = 50,
        examples_per_step: int | None = None,
        tokens_per_example: int | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | Literal["detect"] | None = "detect",
        prefix: str = "throughput/",
        steps_per_call: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.window = check_int("window", window, minimum=1)
        self.steps_per_call = check_int("steps_per_call", steps_per_call, minimum=1)
        if examples_per_step is not None:
            check_int("examples_per_step", examples_per_step, minimum=1)
        if tokens_per_example is not None:
            check_int("tokens_per_example", tokens_per_example, minimum=1)
            if examples_per_step is None:
                raise ValueError(
                    f"tokens_per_example={tokens_per_example} needs examples_per_step (the "
                    "global batch size) to count tokens per step; pass both"
                )
        if flops_per_step is not None:
            flops_per_step = check_float(
                "flops_per_step", flops_per_step, minimum=0, exclusive_minimum=True
            )
        if peak_flops == "detect":
            from substrax.devices import dense_peak_flops  # noqa: PLC0415  (reads the devices: jax)

            peak_flops = dense_peak_flops()
        elif peak_flops is not None:
            peak_flops = check_float("peak_flops", peak_flops, minimum=0, exclusive_minimum=True)
        if not callable(clock):
            raise TypeError(f"clock={clock!r} must be a function returning seconds")
        if logger is not None and not callable(getattr(logger, "log_metrics", None)):
            raise TypeError(
                f"logger={logger!r:.80} ({type(logger).__name__}) has no log_metrics(metrics, "
                "step) method; pass a substrax.tracking logger (FileLogger(name, log_dir), "
                "create_logger(...)), or None to keep the figures in .latest only"
            )
        self.logger = logger
        self.examples_per_step = examples_per_step
        self.tokens_per_example = tokens_per_example
        self.flops_per_step = flops_per_step
        self.peak_flops: float | None = peak_flops
        if not isinstance(prefix, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"prefix={prefix!r} must be a str put before each name, such as ''")
        self.prefix = prefix
        self.latest: dict[str, float | None] = {}
        self.paused_seconds = 0.0
        self._clock = clock
        self.on_train_begin(None)

    def on_train_begin(self, _trainer: object, /) -> None:
        """Start afresh (the next step starts the clock), dropping a pause never ended."""
        self._mark: float | None = None  # the clock's reading at the window's start
        self._steps = 0  # batch ends counted in the window
        self._boundary: _Boundary | None = None  # a window's start or end to time
        self._last: Logs = {}  # the last batch end's logs, which a pause waits for
        self._pauses = 0
        self._paused_at: float | None = None
        self._warned_no_array = False

    def on_train_end(self, _trainer: object, /) -> None:
        """Wait for the last window's end step, if it is not computed yet, and log the window."""
        self._settle(wait=True)

    def on_epoch_end(self, _trainer: object, _epoch: int, _logs: Logs, /) -> None:
        """Read the clock for a window's end that has been computed by now (never waits)."""
        self._settle(wait=False)

    def on_batch_begin(self, _trainer: object, _batch: int, /) -> None:
        """Read the clock for a window's end that has been computed by now (never waits)."""
        self._settle(wait=False)

    on_epoch_begin = on_batch_begin

    @contextmanager
    def pause(self) -> Generator[None]:
        """Leave the time inside this block out of the throughput (evaluation, checkpoint waits).

        Example:
            >>> from substrax.callbacks import ThroughputMeter
            >>> now = [0.0]  # a clock the example moves by hand
            >>> meter = ThroughputMeter(window=2, peak_flops=None, clock=lambda: now[0])
            >>> meter.on_batch_end(None, 0, {})
            >>> with meter.pause():
            ...     now[0] += 30.0  # a 30 s evaluation
            >>> meter.paused_seconds
            30.0
        """
        self.on_validation_begin(None)
        try:
            yield
        finally:
            self.on_validation_end(None, {})

    def on_validation_begin(self, _trainer: object, /) -> None:
        """Pause the clock for the evaluation (as :meth:`pause`)."""
        if self._pauses == 0:
            last, self._last = self._last, {}  # waited for once: a failed step raises once
            self._settle(wait=True)  # a window's end still to time; may raise
            if self._mark is not None:  # dispatched steps are training time
                wait_for(last.values())
            self._paused_at = self._clock()
        self._pauses += 1

    def on_validation_end(self, _trainer: object, _logs: Logs, /) -> None:
        """Restart the clock after the evaluation."""
        self._pauses = max(self._pauses - 1, 0)  # an end without a begin does nothing
        if self._pauses or self._paused_at is None:
            return
        now = self._clock()
        paused, started = now - self._paused_at, self._paused_at
        self._paused_at = None
        self.paused_seconds += paused
        if self._mark is not None:  # a clock started inside the pause starts now
            self._mark = now if self._mark >= started else self._mark + paused

    def on_batch_end(self, _trainer: object, batch: int, logs: Logs, /) -> None:
        """Time a window's end kept from an earlier step; keep this one's outputs at a window's end."""
        self._settle(wait=True)
        self._last = logs
        if self._mark is not None:  # else the first step (it compiles): its end starts the clock
            self._steps += 1
            if self._steps < self.window:
                return
        self._boundary = _Boundary(batch, tuple(logs.values()), self._steps)
        self._steps = 0
        self._settle(wait=False)

    def _settle(self, *, wait: bool) -> None:
        """Time the kept boundary (without ``wait``, only if computed); log a window's end."""
        boundary = self._boundary
        if boundary is None or not (wait or _all_ready(boundary.values)):
            return
        self._boundary = None  # timed once, even if its step failed and the wait raises
        self._check_awaitable(boundary)
        wait_for(boundary.values)
        now = self._clock()
        if self._mark is None:  # the boundary starts the clock
            self._mark = now
            return
        elapsed, self._mark = now - self._mark, now
        if not elapsed > 0:  # a clock that stood still, went back or read NaN: no rate to give
            why = (
                "a window of zero length: the clock read the same at both its ends, too coarse "
                "for its steps; give a finer clock, as time.perf_counter is, or a larger window"
                if elapsed == 0
                else "the clock must be monotonic, as time.perf_counter is"
            )
            message = (
                "%s: the clock read %r s for the window ending at step %s; its throughput is not "
                "logged (%s)"
            )
            _logger.warning(message, type(self).__name__, elapsed, boundary.batch, why)
            return
        self.latest = self._figures(boundary.steps * self.steps_per_call / elapsed)
        if self.logger is not None:
            shown = {f"{self.prefix}{k}": v for k, v in self.latest.items() if v is not None}
            self.logger.log_metrics(shown, step=boundary.batch)

    def _check_awaitable(self, boundary: _Boundary) -> None:
        """Warn once if ``boundary``'s logs are empty: nothing to wait for (its dispatch is timed)."""
        if "jax" not in sys.modules or self._warned_no_array:  # no jax: nothing runs ahead
            return
        if boundary.values:  # a value read to the host (float(loss)) waited for the step
            return
        self._warned_no_array = True
        message = (
            "%s: the batch-end logs of step %s are empty: nothing to wait for, so its window is "
            "timed when the step's call returned, for a jax step its dispatch, and the rate is "
            "too high; log the step's output (its loss, as the jax array it returned) at each "
            "batch end (this warning is given once)"
        )
        _logger.warning(message, type(self).__name__, boundary.batch)

    def _figures(self, steps_per_sec: float) -> dict[str, float | None]:
        figures: dict[str, float | None] = {"steps_per_sec": steps_per_sec}
        if self.examples_per_step is not None:
            figures["examples_per_sec"] = steps_per_sec * self.examples_per_step
            if self.tokens_per_example is not None:
                tokens = self.examples_per_step * self.tokens_per_example
                figures["tokens_per_sec"] = steps_per_sec * tokens
        achieved = None if self.flops_per_step is None else steps_per_sec * self.flops_per_step
        peak = self.peak_flops
        figures["flops_per_sec_per_device"] = achieved
        figures["mfu"] = None if achieved is None or peak is None else achieved / peak
        return figures
