"""ThroughputMeter: steps/s, examples/s, tokens/s, FLOP/s and MFU, measured over windows of steps."""

# ruff: noqa: ANN401  (jitted functions, their arguments and loggers of any framework are typed Any)

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, Protocol, runtime_checkable

from substrax.support import check_float, check_int

from ._errors import CostAnalysisError
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
    """The FLOPs one call of a jitted step performs on each device, from XLA's cost analysis.

    ``function`` is a ``jax.jit`` function (lowered and compiled for ``args``), a ``Lowered``
    or a ``Compiled``. The count is that of the compiled, partitioned program: one device's
    share of a sharded step.

    Raises:
        CostAnalysisError: the backend's cost analysis reports no FLOP count.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from substrax.callbacks import step_flops
        >>> step_flops(jax.jit(lambda a, b: a @ b), jnp.ones((4, 8)), jnp.ones((8, 2)))
        128.0
    """
    compiled = function
    if hasattr(compiled, "lower"):
        compiled = compiled.lower(*args, **kwargs)
    if hasattr(compiled, "compile"):
        compiled = compiled.compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
        analysis = analysis[0] if analysis else None
    flops = analysis.get("flops") if isinstance(analysis, Mapping) else None
    if flops is None or not flops >= 0:
        raise CostAnalysisError(function, analysis)
    return float(flops)


class ThroughputMeter(BaseCallback):
    """Measure training throughput over windows of steps and log it through any logger.

    At the end of every ``window`` steps the meter waits for the step's outputs (the batch-end
    logs) to be computed, reads the clock, and logs, under ``prefix``:

    - ``steps_per_sec``; ``examples_per_sec`` with ``examples_per_step``; ``tokens_per_sec``
      with ``tokens_per_example`` as well;
    - ``flops_per_sec_per_device`` with ``flops_per_step`` (per device, as :func:`step_flops`
      reads it from the compiled step); and ``mfu``, that over the device's dense peak, when
      the peak is known (``substrax.devices.dense_peak_flops``; None on CPU, and then not logged).

    That wait is the meter's only host sync, one per window: between windows it only counts. The
    first step (which compiles) is left out: the clock starts when it has finished.
    :attr:`latest` holds the last window's figures (``mfu`` None where the peak is unknown).

    A step that runs several optimizer steps per call (``TrainStep(steps_per_call=k)`` from
    substrax.spmd, one ``on_batch_end`` per call) is measured with ``steps_per_call=k``: each
    ``on_batch_end`` then counts ``k`` optimizer steps, so ``steps_per_sec`` counts optimizer
    steps and ``examples_per_step`` and ``flops_per_step`` stay per optimizer step (the global
    batch of one of the ``k`` stacked batches, and ``TrainStep.flops_per_step``).

    Time spent outside training (evaluation, waiting for a checkpoint, a data reload) is left
    out of the windows by pausing the meter: ``with meter.pause(): ...``, or the
    ``on_validation_begin``/``on_validation_end`` hooks, which a trainer calls around its
    evaluation. A pause first waits for the last counted step to finish (so its compute stays
    on the training side), then stops the clock until the pause ends; pauses nest. If that wait
    raises (a step that failed), the error propagates and nothing is paused: the next pause
    works as usual. :meth:`on_train_begin` clears a pause that was never ended (an evaluation
    that raised before its end hook). :attr:`paused_seconds` adds up the time left out.

    Args:
        logger: where to log (``log_metrics(metrics, step)``); None only keeps :attr:`latest`.
        window: ``on_batch_end`` calls per measurement (>= 1): steps, or calls of
            ``steps_per_call`` steps each.
        examples_per_step: the global batch size (of one optimizer step).
        tokens_per_example: tokens in each example (sequence length), for ``tokens_per_sec``.
        flops_per_step: the FLOPs of one step on each device: ``TrainStep.flops_per_step(batch)``
            from substrax.spmd (per optimizer step, whatever its loops), or :func:`step_flops`
            for any jitted step.
        peak_flops: one device's peak FLOP/s for MFU; ``"detect"`` reads it from
            ``substrax.devices``; None never computes MFU.
        prefix: put before every logged name.
        steps_per_call: optimizer steps that each ``on_batch_end`` stands for (>= 1): the
            ``steps_per_call`` of the train step called once per batch end.

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
            flops_per_step = check_float("flops_per_step", flops_per_step, minimum=0)
        if peak_flops == "detect":
            from substrax.devices import dense_peak_flops  # noqa: PLC0415  (reads the devices: jax)

            peak_flops = dense_peak_flops()
        elif peak_flops is not None:
            peak_flops = check_float("peak_flops", peak_flops, minimum=0, exclusive_minimum=True)
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
        self._mark: float | None = None
        self._steps = 0
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
        self._last = {}
        self._pauses = 0
        self._paused_at = None

    @contextmanager
    def pause(self) -> Generator[None]:
        """Leave the time inside this block out of the throughput (evaluation, checkpoint waits).

        Example:
            >>> import time
            >>> from substrax.callbacks import ThroughputMeter
            >>> meter = ThroughputMeter(window=2, peak_flops=None)
            >>> meter.on_batch_end(None, 0, {})
            >>> with meter.pause():
            ...     time.sleep(0.2)  # an evaluation
            >>> meter.paused_seconds >= 0.2
            True
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
            if self._mark is not None:
                _wait_for(last)  # the steps dispatched so far are training time; may raise
            self._paused_at = time.perf_counter()
        self._pauses += 1

    def _end_pause(self) -> None:
        if self._pauses == 0:
            return
        self._pauses -= 1
        if self._pauses or self._paused_at is None:
            return
        now = time.perf_counter()
        paused, started = now - self._paused_at, self._paused_at
        self._paused_at = None
        self.paused_seconds += paused
        if self._mark is not None:  # a clock started inside the pause starts now
            self._mark = now if self._mark >= started else self._mark + paused

    def on_batch_end(self, _trainer: object, batch: int, logs: Logs, /) -> None:
        """Count the step; at a window's end, wait for it and log the window's throughput."""
        self._last = logs
        if self._mark is None:
            _wait_for(logs)
            self._mark = time.perf_counter()
            return
        self._steps += 1
        if self._steps < self.window:
            return
        _wait_for(logs)
        now = time.perf_counter()
        elapsed = max(now - self._mark, 1e-9)
        self.latest = self._figures(self._steps * self.steps_per_call / elapsed)
        self._mark, self._steps = now, 0
        if self.logger is not None:
            shown = {f"{self.prefix}{k}": v for k, v in self.latest.items() if v is not None}
            self.logger.log_metrics(shown, step=batch)

    def _figures(self, steps_per_sec: float) -> dict[str, float | None]:
        figures: dict[str, float | None] = {"steps_per_sec": steps_per_sec}
        if self.examples_per_step is not None:
            figures["examples_per_sec"] = steps_per_sec * self.examples_per_step
            if self.tokens_per_example is not None:
                tokens = self.examples_per_step * self.tokens_per_example
                figures["tokens_per_sec"] = steps_per_sec * tokens
        if self.flops_per_step is not None:
            achieved = steps_per_sec * self.flops_per_step
            figures["flops_per_sec_per_device"] = achieved
            figures["mfu"] = None if self.peak_flops is None else achieved / self.peak_flops
        return figures


def _wait_for(logs: Logs) -> None:
    """Block until the arrays among ``logs`` (the step's outputs) are computed."""
    import jax  # noqa: PLC0415  (only a run with jax arrays in its logs gets here)

    jax.block_until_ready([value for value in logs.values() if isinstance(value, jax.Array)])
