"""ThroughputMeter: steps/s, examples/s, tokens/s, FLOP/s and MFU, measured over windows of steps."""

# ruff: noqa: ANN401  (jitted functions, their arguments and loggers of any framework are typed Any)

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from substrax.support import check_float, check_int

from ._errors import CostAnalysisError
from ._metrics import all_ready, device_arrays, wait_for
from ._protocol import BaseCallback, Logs


__all__ = ["MetricsLogger", "ThroughputMeter", "step_flops"]


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
        ...


def step_flops(function: Any, *args: Any, **kwargs: Any) -> float:
    """One device's share of the matrix FLOPs of one call of ``function`` on ``args``.

    The FLOPs are counted from the program's jaxpr (:func:`substrax.devices.jaxpr_flops`:
    matmuls, convolutions and fused attention, two per multiply-add, forward and backward as
    the program has them), the same on every backend. (XLA's cost analysis of a compiled
    step, read before, leaves out the cuBLAS calls a GPU's matmuls become: an MFU built on it
    read about ten times low there.)
    ``function`` is a ``jax.jit`` function, traced for ``args`` with its static arguments, or
    any jax-traceable callable; ``args`` may be arrays or ``jax.ShapeDtypeStruct``. It is
    traced, never compiled or run. One device's share is the program's count divided by the
    number of devices its inputs span (the devices of their shardings; 1 for inputs on one
    device or on none yet): the work every device repeats on replicated values counts once.

    Raises:
        CostAnalysisError: the program's FLOPs cannot be counted (a ``while`` loop that
            multiplies, an opaque kernel such as Pallas or an FFI call, no matrix work); its
            ``reason`` says which. No partial figure is given.
        TypeError: ``function`` is a ``Lowered``, ``Compiled`` or ``Traced`` stage, which
            carries no program to count from (pass the jitted function and its arguments), or
            is not callable.

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
    return count.flops / _input_devices(jax.tree_util.tree_leaves((args, kwargs)))


def _input_devices(leaves: list[Any]) -> int:
    """How many devices the inputs span: their shardings' devices together (at least 1)."""
    devices: set[Any] = set()
    abstract = 1  # a sharding over an abstract mesh names no devices, only their number
    for leaf in leaves:
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            continue
        try:
            devices.update(sharding.device_set)
        except (AttributeError, TypeError, ValueError, RuntimeError):
            abstract = max(abstract, int(getattr(sharding, "num_devices", 1)))
    return max(len(devices), abstract)


@dataclass(frozen=True, slots=True)
class _Boundary:
    """A window's start or end: a step whose outputs must be computed before the clock reads."""

    batch: int
    arrays: tuple[Any, ...]  # the jax arrays among the step's batch-end logs
    steps: int  # the batch ends the window counted; 0 where the boundary starts the clock


class ThroughputMeter(BaseCallback):
    """Measure training throughput over windows of steps and log it through any logger.

    Every ``window`` steps the meter logs, under ``prefix``:

    - ``steps_per_sec``; ``examples_per_sec`` with ``examples_per_step``; ``tokens_per_sec``
      with ``tokens_per_example`` as well;
    - ``flops_per_sec_per_device`` with ``flops_per_step`` (one device's share, as
      :func:`step_flops` counts it or ``TrainStep.flops_per_step`` gives it); and ``mfu``, that
      over the device's dense peak, when the peak is known
      (``substrax.devices.dense_peak_flops``; None on CPU). Without ``flops_per_step`` (None:
      the step's FLOPs could not be counted) neither is logged: absent, never 0.

    :attr:`latest` holds the last window's figures, None for those not known
    (``flops_per_sec_per_device`` and ``mfu`` without ``flops_per_step``, ``mfu`` without a
    peak); only known figures are logged.

    How the clock is read: a window runs from the moment one step's outputs (the jax arrays
    among its batch-end logs) are computed to the moment those of the step ``window`` batch
    ends later are, so the time of the steps' compute is counted, not that of their dispatch.
    The meter never waits for a step before the next one is dispatched: at a boundary it keeps
    the step's outputs and reads the clock once they are computed. That is at once if they
    already are (``jax.Array.is_ready``; logs of host numbers have nothing to wait for); else
    at the next hook: ``on_batch_begin`` and the epoch hooks read it if the outputs are
    computed by then, without waiting, and the next ``on_batch_end`` waits for them with the
    next step already dispatched, so the device keeps running meanwhile. The window's figures
    are logged then, at the index of its last step. (An output donated to the next step's call
    is deleted by then and not waited for: keep one that is not, such as the loss, in the
    logs.) Between boundaries a batch end only counts. So in a loop that dispatches each step
    before its batch end, the meter drains the device's queue neither per step nor per window.
    The first step (which compiles) is left out: the clock starts when it has been computed.
    ``on_train_end`` waits for the last window's end and logs it; a window still short of
    ``window`` steps then is not logged.

    A step that runs several optimizer steps per call (``TrainStep(steps_per_call=k)`` from
    substrax.spmd, one ``on_batch_end`` per call) is measured with ``steps_per_call=k``: each
    ``on_batch_end`` then counts ``k`` optimizer steps, so ``steps_per_sec`` counts optimizer
    steps and ``examples_per_step`` and ``flops_per_step`` stay per optimizer step (the global
    batch of one of the ``k`` stacked batches, and ``TrainStep.flops_per_step``).

    Time spent outside training (evaluation, waiting for a checkpoint, a data reload) is left
    out of the windows by pausing the meter: ``with meter.pause(): ...``, or the
    ``on_validation_begin``/``on_validation_end`` hooks, which a trainer calls around its
    evaluation. A pause first waits for the last counted step to finish (so its compute stays
    on the training side; a pause is rare, and this is the meter's one wait that drains the
    device's queue), then stops the clock until the pause ends; pauses nest. If that wait
    raises (a step that failed), the error propagates and nothing is paused: the next pause
    works as usual. :meth:`on_train_begin` clears a pause that was never ended (an evaluation
    that raised before its end hook). :attr:`paused_seconds` adds up the time left out.

    Args:
        logger: where to log (``log_metrics(metrics, step)``); None only keeps :attr:`latest`.
        window: ``on_batch_end`` calls per measurement (>= 1): steps, or calls of
            ``steps_per_call`` steps each.
        examples_per_step: the global batch size (of one optimizer step).
        tokens_per_example: tokens in each example (sequence length), for ``tokens_per_sec``.
        flops_per_step: the FLOPs of one step on each device (> 0): from substrax.spmd,
            ``TrainStep.flops_per_step(batch)`` (per optimizer step, whatever its loops), or
            :func:`step_flops` for any jitted step. None (what ``TrainStep.flops_per_step``
            gives for a step it cannot count) logs no FLOP/s and no MFU.
        peak_flops: one device's peak FLOP/s for MFU; ``"detect"`` reads it from
            ``substrax.devices``; None never computes MFU.
        prefix: put before every logged name.
        steps_per_call: optimizer steps that each ``on_batch_end`` stands for (>= 1): the
            ``steps_per_call`` of the train step called once per batch end.
        clock: the clock read at window boundaries and pauses, in seconds
            (``time.perf_counter``); a test passes its own.

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
        check_int("window", window, minimum=1)
        check_int("steps_per_call", steps_per_call, minimum=1)
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
        self.logger = logger
        self.window = window
        self.examples_per_step = examples_per_step
        self.tokens_per_example = tokens_per_example
        self.flops_per_step = flops_per_step
        self.peak_flops: float | None = peak_flops
        self.prefix = prefix
        self.steps_per_call = steps_per_call
        self.latest: dict[str, float | None] = {}
        self.paused_seconds = 0.0
        self._clock = clock
        self._mark: float | None = None
        self._steps = 0
        self._boundary: _Boundary | None = None
        self._last: Logs = {}
        self._pauses = 0
        self._paused_at: float | None = None

    def on_train_begin(self, _trainer: object, /) -> None:
        """Start afresh: the next step (which may compile) starts the clock.

        A pause still open (an evaluation whose end hook never came) is dropped, with the
        outputs the meter was to wait for; :attr:`paused_seconds` and :attr:`latest` are kept.
        """
        self._mark = None
        self._steps = 0
        self._boundary = None
        self._last = {}
        self._pauses = 0
        self._paused_at = None

    def on_train_end(self, _trainer: object, /) -> None:
        """Wait for the last window's end step, if it is not computed yet, and log the window."""
        self._settle(wait=True)

    def on_epoch_begin(self, _trainer: object, _epoch: int, /) -> None:
        """Read the clock for a window's end that has been computed by now (never waits)."""
        self._settle(wait=False)

    def on_epoch_end(self, _trainer: object, _epoch: int, _logs: Logs, /) -> None:
        """Read the clock for a window's end that has been computed by now (never waits)."""
        self._settle(wait=False)

    def on_batch_begin(self, _trainer: object, _batch: int, /) -> None:
        """Read the clock for a window's end that has been computed by now (never waits)."""
        self._settle(wait=False)

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
        self._begin_pause()
        try:
            yield
        finally:
            self._end_pause()

    def on_validation_begin(self, _trainer: object, /) -> None:
        """Pause the clock for the evaluation (as :meth:`pause`)."""
        self._begin_pause()

    def on_validation_end(self, _trainer: object, _logs: Logs, /) -> None:
        """Restart the clock after the evaluation."""
        self._end_pause()

    def _begin_pause(self) -> None:
        if self._pauses == 0:
            last, self._last = self._last, {}  # waited for once: a failed step raises once
            self._settle(wait=True)  # a window's end still to time; may raise
            if self._mark is not None:
                wait_for(device_arrays(last.values()))  # dispatched steps are training time
            self._paused_at = self._clock()
        self._pauses += 1

    def _end_pause(self) -> None:
        if self._pauses == 0:
            return
        self._pauses -= 1
        if self._pauses or self._paused_at is None:
            return
        now = self._clock()
        paused, started = now - self._paused_at, self._paused_at
        self._paused_at = None
        self.paused_seconds += paused
        if self._mark is not None:  # a clock started inside the pause starts now
            self._mark = now if self._mark >= started else self._mark + paused

    def on_batch_end(self, _trainer: object, batch: int, logs: Logs, /) -> None:
        """Count the step; at a window's end, keep its outputs, to read the clock once computed.

        A window's end kept from an earlier step is timed first: this waits for that step's
        outputs, with this step already dispatched.
        """
        self._settle(wait=True)
        self._last = logs
        if self._mark is None:  # the first step (it compiles): its end starts the clock
            self._open(batch, logs, steps=0)
            return
        self._steps += 1
        if self._steps >= self.window:
            self._open(batch, logs, steps=self._steps)
            self._steps = 0

    def _open(self, batch: int, logs: Logs, *, steps: int) -> None:
        """Make ``batch`` a window's boundary, timed now if its outputs are computed already."""
        self._boundary = _Boundary(batch, device_arrays(logs.values()), steps)
        self._settle(wait=False)

    def _settle(self, *, wait: bool) -> None:
        """Read the clock for the kept boundary once its step is computed; log a window's end.

        Without ``wait`` nothing happens while the step still runs.
        """
        boundary = self._boundary
        if boundary is None or not (wait or all_ready(boundary.arrays)):
            return
        self._boundary = None  # timed once, even if its step failed and the wait raises
        # an array donated to the next step's call is deleted: the others are waited for
        wait_for([array for array in boundary.arrays if not array.is_deleted()])
        now = self._clock()
        if self._mark is None or boundary.steps == 0:
            self._mark = now
            return
        elapsed = max(now - self._mark, 1e-9)
        self.latest = self._figures(boundary.steps * self.steps_per_call / elapsed)
        self._mark = now
        if self.logger is not None:
            shown = {f"{self.prefix}{k}": v for k, v in self.latest.items() if v is not None}
            self.logger.log_metrics(shown, step=boundary.batch)

    def _figures(self, steps_per_sec: float) -> dict[str, float | None]:
        figures: dict[str, float | None] = {"steps_per_sec": steps_per_sec}
        if self.examples_per_step is not None:
            figures["examples_per_sec"] = steps_per_sec * self.examples_per_step
            if self.tokens_per_example is not None:
                tokens = self.examples_per_step * self.tokens_per_example
                figures["tokens_per_sec"] = steps_per_sec * tokens
        achieved = None if self.flops_per_step is None else steps_per_sec * self.flops_per_step
        figures["flops_per_sec_per_device"] = achieved
        figures["mfu"] = (
            None if achieved is None or self.peak_flops is None else achieved / self.peak_flops
        )
        return figures
