import functools
import math
from collections.abc import Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from substrax.callbacks import CallbackList, CostAnalysisError, ThroughputMeter, step_flops
from substrax.tracking import FileLogger, read_scalars


BATCH, WIDTH = 1024, 128


@pytest.fixture(scope="module")
def sharded_step():
    mesh = jax.make_mesh((8,), ("data",), (AxisType.Auto,))
    x = jax.device_put(jnp.ones((BATCH, WIDTH)), NamedSharding(mesh, PartitionSpec("data")))
    w = jnp.full((WIDTH, WIDTH), 0.01)

    @jax.jit
    def step(w, x):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return w - 0.01 * grad, loss

    return step, w, x


class FakeClock:
    """A clock that moves only when a test moves it: no test sleeps to measure throughput."""

    def __init__(self) -> None:
        self.now = 100.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def clocked_meter(window: int) -> tuple[FakeClock, ThroughputMeter]:
    """A meter over ``window`` steps, with no peak, timed by the FakeClock returned with it."""
    clock = FakeClock()
    return clock, ThroughputMeter(window=window, peak_flops=None, clock=clock)


class CountingLogs(Mapping[str, object]):
    """Real batch-end logs that count how often their values are read."""

    def __init__(self, logs: dict[str, object]) -> None:
        self._logs = logs
        self.reads = 0

    def __getitem__(self, key: str) -> object:
        self.reads += 1
        return self._logs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._logs)

    def __len__(self) -> int:
        return len(self._logs)

    def values(self):
        self.reads += 1
        return self._logs.values()


def test_step_flops_counts_one_devices_share_of_a_sharded_step(sharded_step):
    step, w, x = sharded_step
    # the program's matmuls, forward (x @ w) and backward (x.T @ g): 2 x (2 * B * W * W), over
    # the 8 devices x spans (w, on one of them, adds none)
    assert step_flops(step, w, x) == 2 * 2 * BATCH * WIDTH * WIDTH / 8
    # abstract inputs with their shardings: the same share
    abstract_x = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    abstract_w = jax.ShapeDtypeStruct(w.shape, w.dtype)
    assert step_flops(step, abstract_w, abstract_x) == 2 * 2 * BATCH * WIDTH * WIDTH / 8
    # the same program on one device's inputs is the whole count
    assert step_flops(step, w, jnp.ones((BATCH, WIDTH))) == 2 * 2 * BATCH * WIDTH * WIDTH


def test_step_flops_divides_by_the_devices_the_program_names_itself():
    """Hostile finding: a jit with in_shardings over 8 devices, called on host or uncommitted
    inputs, was counted as one device's program (8 times the share each device runs)."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    rows, cols = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    a, w = np.ones((64, 32), np.float32), jnp.ones((32, 16))
    whole = 2 * 64 * 32 * 16
    split = jax.jit(lambda a, w: a @ w, in_shardings=(rows, cols), out_shardings=rows)
    assert step_flops(split, a, w) == whole / 8
    constrained = jax.jit(lambda a, w: jax.lax.with_sharding_constraint(a, rows) @ w)
    assert step_flops(constrained, a, w) == whole / 8
    assert step_flops(jax.jit(lambda a, w: a @ w), a, w) == whole


def test_step_flops_counts_abstract_inputs_plain_callables_and_static_arguments():
    a, b = jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 2), jnp.float32)
    assert step_flops(lambda a, b: a @ b, a, b) == 128.0  # traced, never run

    def power(a, b, times):
        return functools.reduce(jnp.matmul, [a] * times) @ b

    power = jax.jit(power, static_argnums=2)
    square = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    assert step_flops(power, square, b, 3) == 2 * (2 * 8 * 8 * 8) + 2 * 8 * 8 * 2


def test_step_flops_counts_an_nnx_jit_step_and_leaves_its_model_as_it_was():
    """Hostile finding: nnx.jit's trace has no jaxpr, and step_flops raised AttributeError."""
    nnx = pytest.importorskip("flax.nnx", reason="flax is needed for an nnx.jit step")
    optax = pytest.importorskip("optax", reason="optax is needed for nnx.Optimizer")
    model = nnx.Linear(8, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    kernel = model.kernel[...]
    assert step_flops(train_step, model, optimizer, jnp.ones((32, 8))) == 2 * (2 * 32 * 8 * 1)
    assert (model.kernel[...] == kernel).all()  # traced, never run


def test_step_flops_refuses_a_lowered_or_compiled_step(sharded_step):
    step, w, x = sharded_step
    for stage in (step.lower(w, x), step.lower(w, x).compile(), step.trace(w, x)):
        with pytest.raises(TypeError, match=r"pass the jitted function and its arguments"):
            step_flops(stage)


def _multiply_in_a_while_loop(a):
    return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ a), (0, a))[1]


@pytest.mark.parametrize(
    ("function", "reason"),
    [
        (jnp.sin, "no matmul, convolution or attention"),
        (_multiply_in_a_while_loop, "inside a while loop"),
    ],
    ids=["no matrix work", "a while loop that multiplies"],
)
def test_step_flops_raises_with_the_reason_where_nothing_can_be_counted(function, reason):
    with pytest.raises(CostAnalysisError, match=reason) as info:
        step_flops(jax.jit(function), jnp.ones((4, 4)))
    assert reason in info.value.reason
    assert "flops_per_step=" in str(info.value)


def test_the_meter_logs_throughput_through_a_file_logger(sharded_step, tmp_path):
    step, w, x = sharded_step
    flops = step_flops(step, w, x)
    with FileLogger("run", tmp_path, flush_every=0) as logger:
        meter = ThroughputMeter(
            logger,
            window=4,
            examples_per_step=BATCH,
            tokens_per_example=16,
            flops_per_step=flops,
            peak_flops=1e12,
        )
        callbacks = CallbackList([meter])
        callbacks.on_train_begin(None)
        for index in range(9):
            w, loss = step(w, x)
            callbacks.on_batch_end(None, index, {"loss": loss})
        callbacks.on_train_end(None)
    series = read_scalars(tmp_path / "run.metrics.jsonl")
    assert set(series) == {
        "throughput/steps_per_sec",
        "throughput/examples_per_sec",
        "throughput/tokens_per_sec",
        "throughput/flops_per_sec_per_device",
        "throughput/mfu",
    }
    # step 0 starts the clock; windows of 4 steps end at steps 4 and 8
    assert [step for step, _ in series["throughput/steps_per_sec"]] == [4, 8]
    latest = meter.latest
    assert latest["steps_per_sec"] > 0
    assert latest["examples_per_sec"] == pytest.approx(latest["steps_per_sec"] * BATCH)
    assert latest["tokens_per_sec"] == pytest.approx(latest["steps_per_sec"] * BATCH * 16)
    assert latest["flops_per_sec_per_device"] == pytest.approx(latest["steps_per_sec"] * flops)
    assert latest["mfu"] == pytest.approx(latest["flops_per_sec_per_device"] / 1e12)


def test_mfu_is_none_and_not_logged_where_the_peak_is_unknown(sharded_step, tmp_path):
    step, w, x = sharded_step
    with FileLogger("cpu", tmp_path, flush_every=0) as logger:
        meter = ThroughputMeter(logger, window=2, flops_per_step=step_flops(step, w, x))
        for index in range(3):
            w, loss = step(w, x)
            meter.on_batch_end(None, index, {"loss": loss})
        meter.on_train_end(None)  # times the last window, if its end had not been computed
    assert meter.peak_flops is None  # the tests run on CPU devices
    assert meter.latest["mfu"] is None
    series = read_scalars(tmp_path / "cpu.metrics.jsonl")
    assert "throughput/flops_per_sec_per_device" in series
    assert "throughput/mfu" not in series


def test_without_flops_per_step_no_flops_or_mfu_is_logged_never_zero(tmp_path):
    clock = FakeClock()
    with FileLogger("uncounted", tmp_path, flush_every=0) as logger:
        # flops_per_step=None: what TrainStep.flops_per_step gives for a step it cannot count
        meter = ThroughputMeter(
            logger, window=2, examples_per_step=8, flops_per_step=None, peak_flops=1e12, clock=clock
        )
        for index in range(5):
            clock.advance(0.5)
            meter.on_batch_end(None, index, {"loss": 0.5})
    series = read_scalars(tmp_path / "uncounted.metrics.jsonl")
    assert set(series) == {"throughput/steps_per_sec", "throughput/examples_per_sec"}
    assert series["throughput/steps_per_sec"] == [(2, 2.0), (4, 2.0)]
    assert meter.latest["flops_per_sec_per_device"] is None
    assert meter.latest["mfu"] is None


def test_the_meter_reads_the_step_outputs_only_at_window_ends(sharded_step):
    step, w, x = sharded_step
    meter = ThroughputMeter(window=5)
    all_logs = []
    for index in range(11):
        w, loss = step(w, x)
        logs = CountingLogs({"loss": loss})
        meter.on_batch_end(None, index, logs)
        all_logs.append(logs)
    # the first step starts the clock, steps 5 and 10 end windows: no other step is looked at
    assert [index for index, logs in enumerate(all_logs) if logs.reads] == [0, 5, 10]


def test_a_window_end_is_timed_when_its_step_is_computed_not_when_it_was_dispatched():
    clock, meter = clocked_meter(window=2)
    meter.on_batch_end(None, 0, {"loss": jnp.asarray(1.0)})  # computed: the clock starts at once
    reads = clock.reads
    clock.advance(1.0)
    meter.on_batch_end(None, 1, {"loss": jnp.asarray(1.0)})
    meter.on_batch_end(None, 2, {"loss": jnp.asarray(1.0)})  # the window's end, computed: timed
    assert clock.reads == reads + 1  # the clock is read at window ends only
    assert meter.latest["steps_per_sec"] == pytest.approx(2 / 1.0)


def test_a_window_end_whose_logs_are_empty_is_warned_about_once(caplog):
    """Hostile finding: with nothing in the boundary steps' logs the meter had nothing to wait
    for, and logged the dispatch rate (65,000 steps/s for 10) without a word."""
    clock, meter = clocked_meter(window=2)
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        for step in range(7):
            clock.advance(1.0)
            meter.on_batch_end(None, step, {})
        meter.on_train_end(None)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "the batch-end logs of step 0 are empty: nothing to wait for" in warnings[0]
    assert "log the step's output (its loss" in warnings[0]


@pytest.mark.parametrize(
    "logs",
    [{"loss": jnp.asarray(1.0), "lr": 0.1}, {"loss": 1.0}],  # a jax value, or one read already
    ids=["jax_array", "read_to_the_host"],
)
def test_a_window_end_with_the_steps_output_is_not_warned_about(caplog, logs):
    """Second-pass finding: float(loss), read after the step, was warned about as a dispatch."""
    clock, meter = clocked_meter(window=2)
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        for step in range(5):
            clock.advance(1.0)
            meter.on_batch_end(None, step, logs)
    assert caplog.records == []


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"window": 0}, ValueError, "window=0"),
        ({"tokens_per_example": 8}, ValueError, "needs examples_per_step"),
        ({"flops_per_step": float("nan")}, ValueError, "flops_per_step=nan"),
        ({"flops_per_step": 0.0}, ValueError, "flops_per_step=0.0"),
        ({"clock": 3.0}, TypeError, "clock=3.0"),
        ({"peak_flops": 0.0}, ValueError, "peak_flops=0.0"),
        ({"examples_per_step": 2.5}, TypeError, "examples_per_step=2.5"),
        ({"steps_per_call": 0}, ValueError, "steps_per_call=0"),
        ({"prefix": None}, TypeError, "prefix=None"),  # hostile finding: "Nonesteps_per_sec"
        # hostile finding: accepted, then AttributeError 'log_metrics' at the first window's end
        ({"logger": "logs/"}, TypeError, r"logger='logs/' \(str\) has no log_metrics"),
        ({"logger": object()}, TypeError, r"\(object\) has no log_metrics.*FileLogger"),
    ],
)
def test_the_meter_refuses_bad_options(options, error, match):
    with pytest.raises(error, match=match):
        ThroughputMeter(**options)


PAUSE_S = 30.0
STEP_S = 0.01


def _window_seconds(meter):
    return meter.window / meter.latest["steps_per_sec"]


@pytest.mark.parametrize("how", ["context manager", "validation hooks"])
def test_time_spent_paused_is_left_out_of_the_window(sharded_step, how):
    step, w, x = sharded_step
    clock, meter = clocked_meter(window=4)
    callbacks = CallbackList([meter])
    callbacks.on_train_begin(None)
    for index in range(5):  # step 0 starts the clock; the window ends at step 4
        w, loss = step(w, x)
        loss.block_until_ready()  # the step takes STEP_S on the fake clock
        clock.advance(STEP_S)
        callbacks.on_batch_end(None, index, {"loss": loss})
        if index == 2:  # an evaluation in the middle of the window
            if how == "context manager":
                with meter.pause():
                    clock.advance(PAUSE_S)
            else:
                callbacks.on_validation_begin(None)
                clock.advance(PAUSE_S)
                callbacks.on_validation_end(None, {"val_loss": 0.0})
    callbacks.on_train_end(None)
    assert meter.paused_seconds == pytest.approx(PAUSE_S)
    assert _window_seconds(meter) == pytest.approx(4 * STEP_S)  # the window timed the steps only


def test_without_a_pause_the_same_wait_counts(sharded_step):
    step, w, x = sharded_step
    clock, meter = clocked_meter(window=4)
    for index in range(5):
        w, loss = step(w, x)
        loss.block_until_ready()
        clock.advance(STEP_S)
        meter.on_batch_end(None, index, {"loss": loss})
        if index == 2:
            clock.advance(PAUSE_S)
    meter.on_train_end(None)
    assert meter.paused_seconds == 0.0
    assert _window_seconds(meter) == pytest.approx(4 * STEP_S + PAUSE_S)


def test_pauses_nest_and_a_pause_waits_for_the_last_step(sharded_step):
    step, w, x = sharded_step
    clock, meter = clocked_meter(window=2)
    w, loss = step(w, x)
    meter.on_batch_end(None, 0, {"loss": loss})
    w, loss = step(w, x)
    logs = CountingLogs({"loss": loss})
    meter.on_batch_end(None, 1, logs)
    assert logs.reads == 0
    with meter.pause():
        assert logs.reads == 1  # the dispatched step is waited for before the clock stops
        assert loss.is_ready()
        with meter.pause():
            clock.advance(1.0)
        clock.advance(0.25)
    # the outer pause is the one counted: 1.25 s, where adding the inner one too would give 2.25
    assert meter.paused_seconds == pytest.approx(1.25)


def test_with_steps_per_call_each_batch_end_counts_that_many_optimizer_steps():
    clock = FakeClock()
    meter = ThroughputMeter(
        window=4,
        examples_per_step=64,
        tokens_per_example=16,
        flops_per_step=1e6,
        peak_flops=1e12,
        steps_per_call=4,
        clock=clock,
    )
    meter.on_batch_end(None, 0, {})  # starts the clock
    for call in range(1, 5):  # one batch end per call of 4 optimizer steps
        clock.advance(0.05)
        meter.on_batch_end(None, call, {})
    figures = meter.latest
    # 16 optimizer steps in 0.2 s
    assert figures["steps_per_sec"] == pytest.approx(16 / 0.2)
    assert figures["examples_per_sec"] == pytest.approx(64 * figures["steps_per_sec"])
    assert figures["tokens_per_sec"] == pytest.approx(64 * 16 * figures["steps_per_sec"])
    assert figures["flops_per_sec_per_device"] == pytest.approx(1e6 * figures["steps_per_sec"])
    assert figures["mfu"] == pytest.approx(figures["flops_per_sec_per_device"] / 1e12)


def test_a_pause_whose_wait_fails_raises_and_the_next_pause_still_counts(sharded_step, monkeypatch):
    step, w, x = sharded_step
    clock, meter = clocked_meter(window=3)
    w, loss = step(w, x)
    meter.on_batch_end(None, 0, {"loss": loss})
    meter.on_batch_end(None, 1, {"loss": jnp.ones(3)})

    def failed(arrays):  # a step that failed on the device raises where it is waited for
        raise jax.errors.JaxRuntimeError("INTERNAL: the step failed")

    with monkeypatch.context() as patch:
        patch.setattr(jax, "block_until_ready", failed)
        with pytest.raises(jax.errors.JaxRuntimeError, match="failed"), meter.pause():
            pytest.fail("the block runs only once the pause has begun")
    with meter.pause():  # not swallowed by a pause left open by the failure
        clock.advance(PAUSE_S)
    assert meter.paused_seconds == pytest.approx(PAUSE_S)
    for index in (2, 3):  # the window of steps 1 to 3 ends
        w, loss = step(w, x)
        clock.advance(STEP_S)
        meter.on_batch_end(None, index, {"loss": loss})
    meter.on_train_end(None)
    assert _window_seconds(meter) < PAUSE_S


def test_a_window_end_waits_for_its_outputs_that_were_not_donated_since():
    @jax.jit
    def slow_loss(a):  # a loss still computing when its window ends: 100 matmuls of 512 x 512
        return jax.lax.fori_loop(0, 100, lambda _, b: b @ a / 512.0, a).mean()

    ones = jnp.ones((512, 512))
    slow_loss(ones).block_until_ready()  # compiled before the meter sees it
    clock, meter = clocked_meter(window=1)
    meter.on_batch_end(None, 0, {"loss": jnp.asarray(1.0).block_until_ready()})  # starts at 0
    clock.advance(1.0)  # step 1 takes 1 s on the fake clock
    loss = slow_loss(ones)
    counter = jnp.asarray(1)  # a value of the donated state
    meter.on_batch_end(None, 1, {"loss": loss, "step": counter})  # a window's end
    counter.delete()  # the next step's call takes the state it was donated
    meter.on_train_end(None)  # times step 1 by its loss, raising nothing
    assert meter.latest["steps_per_sec"] == pytest.approx(1.0)


def test_train_begin_clears_a_validation_pause_that_never_ended(sharded_step):
    step, w, x = sharded_step
    clock, meter = clocked_meter(window=2)
    callbacks = CallbackList([meter])
    callbacks.on_train_begin(None)
    for index in range(2):
        w, loss = step(w, x)
        callbacks.on_batch_end(None, index, {"loss": loss})
    callbacks.on_validation_begin(None)  # an evaluation that raised before its end hook
    callbacks.on_train_begin(None)  # the trainer fits again
    for index in range(3):
        w, loss = step(w, x)
        loss.block_until_ready()  # the step takes STEP_S on the fake clock
        clock.advance(STEP_S)
        callbacks.on_batch_end(None, index, {"loss": loss})
        if index == 1:
            with meter.pause():
                clock.advance(PAUSE_S)
    callbacks.on_train_end(None)
    assert meter.paused_seconds == pytest.approx(
        PAUSE_S
    )  # the pause counted: no stale outer pause held it
    assert _window_seconds(meter) == pytest.approx(2 * STEP_S)


@pytest.mark.parametrize("moved", [0.0, -1.0, float("nan")])
def test_a_window_the_clock_did_not_move_forward_over_is_not_logged(caplog, moved):
    """Hostile finding: a clock that stood still or went back gave 2e9 steps/s (the elapsed
    time was clamped to 1 ns), and a NaN clock was logged as a NaN throughput."""

    class Logged:
        def __init__(self) -> None:
            self.rows: list[tuple[int | None, dict]] = []

        def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
            self.rows.append((step, dict(metrics)))

    clock, logger = FakeClock(), Logged()
    meter = ThroughputMeter(logger, window=2, peak_flops=None, clock=clock)
    for step in range(3):  # step 0 starts the clock; step 2 ends a window the clock did not cross
        clock.now = moved if math.isnan(moved) else 100.0 + moved * step
        meter.on_batch_end(None, step, {"loss": 0.5})
    clock.now = 200.0
    for step in range(3, 5):  # the next window, over a clock that moved, is logged
        meter.on_batch_end(None, step, {"loss": 0.5})
    meter.on_train_end(None)
    # from a NaN reading, no window has a start to measure from
    assert [step for step, _ in logger.rows] == ([] if math.isnan(moved) else [4])
    assert "the clock read" in caplog.text
    assert "window ending at step 2" in caplog.text
    # hostile finding: a clock too coarse for the window was called not monotonic
    assert ("a window of zero length" in caplog.text) == (moved == 0.0)
    assert ("must be monotonic" in caplog.text) == (moved != 0.0)


def test_a_pause_after_a_step_whose_logged_output_was_donated_counts(sharded_step):
    # a hostile finding: it raised "BlockHostUntilReady() called on deleted or donated buffer"
    # out of the loop and left the pause uncounted
    step, w, x = sharded_step
    clock, meter = clocked_meter(window=3)
    w, loss = step(w, x)
    meter.on_batch_end(None, 0, {"loss": loss})
    state = jnp.ones(3)
    meter.on_batch_end(None, 1, {"loss": loss, "state": state})
    state.delete()  # the next step took the state it was donated
    with meter.pause():
        clock.advance(PAUSE_S)
    assert meter.paused_seconds == pytest.approx(PAUSE_S)
