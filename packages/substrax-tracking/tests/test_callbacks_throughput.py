import time
from collections.abc import Iterator, Mapping

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from substrax.callbacks import CallbackList, ThroughputMeter, step_flops
from substrax.tracking import FileLogger, read_scalars


BATCH, WIDTH = 1024, 128


@pytest.fixture(scope="module")
def sharded_step():
    mesh = jax.make_mesh((8,), ("data",), (AxisType.Auto,))
    x = jax.device_put(jnp.ones((BATCH, WIDTH)), NamedSharding(mesh, PartitionSpec("data")))
    w = jnp.full((WIDTH, WIDTH), 0.01)

    @jax.jit
    def step(w, x):
        loss = jnp.mean((x @ w) ** 2)
        return w - 0.01 * jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w), loss

    return step, w, x


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


def test_step_flops_reads_one_devices_share_of_a_sharded_step(sharded_step):
    step, w, x = sharded_step
    per_device = step_flops(step, w, x)
    # forward and backward matmuls: 2 x (2 * B * W * W), split over 8 devices, plus elementwise
    matmuls = 2 * 2 * BATCH * WIDTH * WIDTH / 8
    assert matmuls <= per_device <= 1.2 * matmuls
    assert step_flops(step.lower(w, x)) == per_device
    assert step_flops(step.lower(w, x).compile()) == per_device


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
    assert meter.peak_flops is None  # the tests run on CPU devices
    assert meter.latest["mfu"] is None
    assert "throughput/mfu" not in read_scalars(tmp_path / "cpu.metrics.jsonl")


def test_the_meter_reads_the_step_outputs_only_at_window_ends(sharded_step):
    step, w, x = sharded_step
    meter = ThroughputMeter(window=5)
    all_logs = []
    for index in range(11):
        w, loss = step(w, x)
        logs = CountingLogs({"loss": loss})
        meter.on_batch_end(None, index, logs)
        all_logs.append(logs)
    # the first step starts the clock, steps 5 and 10 end windows: no other step is waited on
    assert [index for index, logs in enumerate(all_logs) if logs.reads] == [0, 5, 10]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"window": 0}, ValueError, "window=0"),
        ({"tokens_per_example": 8}, ValueError, "needs examples_per_step"),
        ({"flops_per_step": float("nan")}, ValueError, "flops_per_step=nan"),
        ({"peak_flops": 0.0}, ValueError, "peak_flops=0.0"),
        ({"examples_per_step": 2.5}, TypeError, "examples_per_step=2.5"),
        ({"steps_per_call": 0}, ValueError, "steps_per_call=0"),
    ],
)
def test_the_meter_refuses_bad_options(options, error, match):
    with pytest.raises(error, match=match):
        ThroughputMeter(**options)


PAUSE_S = 1.5


def _window_seconds(meter):
    return meter.window / meter.latest["steps_per_sec"]


@pytest.mark.parametrize("how", ["context manager", "validation hooks"])
def test_time_spent_paused_is_left_out_of_the_window(sharded_step, how):
    step, w, x = sharded_step
    meter = ThroughputMeter(window=4, peak_flops=None)
    callbacks = CallbackList([meter])
    callbacks.on_train_begin(None)
    for index in range(5):  # step 0 starts the clock; the window ends at step 4
        w, loss = step(w, x)
        callbacks.on_batch_end(None, index, {"loss": loss})
        if index == 2:  # an evaluation in the middle of the window
            if how == "context manager":
                with meter.pause():
                    time.sleep(PAUSE_S)
            else:
                callbacks.on_validation_begin(None)
                time.sleep(PAUSE_S)
                callbacks.on_validation_end(None, {"val_loss": 0.0})
    assert meter.paused_seconds >= PAUSE_S
    # four small steps take milliseconds: the window is far shorter than the pause alone
    assert _window_seconds(meter) < PAUSE_S


def test_without_a_pause_the_same_wait_counts(sharded_step):
    step, w, x = sharded_step
    meter = ThroughputMeter(window=4, peak_flops=None)
    for index in range(5):
        w, loss = step(w, x)
        meter.on_batch_end(None, index, {"loss": loss})
        if index == 2:
            time.sleep(PAUSE_S)
    assert meter.paused_seconds == 0.0
    assert _window_seconds(meter) >= PAUSE_S


def test_pauses_nest_and_a_pause_waits_for_the_last_step(sharded_step):
    step, w, x = sharded_step
    meter = ThroughputMeter(window=2, peak_flops=None)
    w, loss = step(w, x)
    meter.on_batch_end(None, 0, {"loss": loss})
    w, loss = step(w, x)
    logs = CountingLogs({"loss": loss})
    meter.on_batch_end(None, 1, logs)
    assert logs.reads == 0
    with meter.pause():
        assert logs.reads == 1  # the dispatched step is waited for before the clock stops
        with meter.pause():
            time.sleep(1.0)
        time.sleep(0.2)
    # the outer pause is the one counted: 1.2 s, where adding the inner one too would give 2.2
    assert 1.2 <= meter.paused_seconds < 2.2


def test_with_steps_per_call_each_batch_end_counts_that_many_optimizer_steps():
    meter = ThroughputMeter(
        window=4,
        examples_per_step=64,
        tokens_per_example=16,
        flops_per_step=1e6,
        peak_flops=1e12,
        steps_per_call=4,
    )
    start = time.perf_counter()
    meter.on_batch_end(None, 0, {})  # starts the clock
    for call in range(1, 5):  # one batch end per call of 4 optimizer steps
        time.sleep(0.05)
        meter.on_batch_end(None, call, {})
    outside = time.perf_counter() - start
    figures = meter.latest
    # 16 optimizer steps, timed over at least the 0.2 s slept and at most the time around them
    assert 16 / outside <= figures["steps_per_sec"] <= 16 / 0.2
    assert figures["examples_per_sec"] == pytest.approx(64 * figures["steps_per_sec"])
    assert figures["tokens_per_sec"] == pytest.approx(64 * 16 * figures["steps_per_sec"])
    assert figures["flops_per_sec_per_device"] == pytest.approx(1e6 * figures["steps_per_sec"])
    assert figures["mfu"] == pytest.approx(figures["flops_per_sec_per_device"] / 1e12)


def test_a_pause_whose_wait_fails_raises_and_the_next_pause_still_counts(sharded_step):
    step, w, x = sharded_step
    meter = ThroughputMeter(window=3, peak_flops=None)
    w, loss = step(w, x)
    meter.on_batch_end(None, 0, {"loss": loss})
    failed = jnp.ones(3)
    failed.delete()  # an output that can never be waited for
    meter.on_batch_end(None, 1, {"loss": failed})
    with pytest.raises(jax.errors.JaxRuntimeError, match="deleted"), meter.pause():
        pytest.fail("the block runs only once the pause has begun")
    with meter.pause():  # not swallowed by a pause left open by the failure
        time.sleep(PAUSE_S)
    assert meter.paused_seconds >= PAUSE_S
    for index in (2, 3):  # the window of steps 1 to 3 ends
        w, loss = step(w, x)
        meter.on_batch_end(None, index, {"loss": loss})
    assert _window_seconds(meter) < PAUSE_S


def test_train_begin_clears_a_validation_pause_that_never_ended(sharded_step):
    step, w, x = sharded_step
    meter = ThroughputMeter(window=2, peak_flops=None)
    callbacks = CallbackList([meter])
    callbacks.on_train_begin(None)
    for index in range(2):
        w, loss = step(w, x)
        callbacks.on_batch_end(None, index, {"loss": loss})
    callbacks.on_validation_begin(None)  # an evaluation that raised before its end hook
    callbacks.on_train_begin(None)  # the trainer fits again
    for index in range(3):
        w, loss = step(w, x)
        callbacks.on_batch_end(None, index, {"loss": loss})
        if index == 1:
            with meter.pause():
                time.sleep(PAUSE_S)
    assert meter.paused_seconds >= PAUSE_S  # the pause counted: no stale outer pause held it
    assert _window_seconds(meter) < PAUSE_S
