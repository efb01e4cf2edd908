"""No callback holds back the device: a step's value is read once the next step is dispatched.

Each test hands a callback the output of a computation sized to run for ``TARGET_S`` seconds and
checks that the value was still being computed when the hook returned (so the hook did not wait
for it, whatever the machine's load); then that the callback's decision is still made, one step
late, or at the hook that ends the run.
"""

import io
import math
import time

import jax
import jax.numpy as jnp
import pytest

from substrax.callbacks import (
    EarlyStoppingCallback,
    EarlyStoppingConfig,
    LossSpikeDetector,
    ProgressCallback,
    ReduceLROnPlateauCallback,
    ThroughputMeter,
)


TARGET_S = 0.25  # what a slow value is sized to take: far longer than a hook that does not wait
# (and than the progress bar's 0.1 s between redraws, which one test waits out while it computes)


@pytest.fixture(scope="module")
def slow():
    """``slow(value)``: a scalar jax array equal to ``value`` whose computation takes ~TARGET_S.

    Each value is sized by the machine's speed just before it is dispatched (the tests share
    their machine, whose load varies), and its duration is measured where it is used.
    """

    @jax.jit
    def run(x, n, value):
        # x is all ones: each matmul, scaled, gives x again, so the mean is 1 whatever n
        return jnp.mean(jax.lax.fori_loop(0, n, lambda _, a: a @ x / 512.0, x)) * value

    x = jnp.ones((512, 512))
    run(x, 1, 1.0).block_until_ready()  # compiled before any test times it

    def make(value):
        timings = []
        for _ in range(3):
            start = time.perf_counter()
            run(x, 4, 1.0).block_until_ready()
            timings.append((time.perf_counter() - start) / 4)
        return run(x, max(10, math.ceil(TARGET_S / min(timings))), value)

    return make


def returns_while_it_runs(hook, value):
    """Call ``hook()`` just after ``value`` was dispatched: it returns while ``value`` computes.

    Returns the seconds from the call to the value's end (the least a window holding it takes).
    """
    start = time.perf_counter()
    hook()
    returned = time.perf_counter() - start
    running = not value.is_ready()
    value.block_until_ready()
    computed = time.perf_counter() - start
    assert running, f"the hook took {returned:.3f} s and the value was computed: it waited for it"
    return computed


def ready(value):
    return jnp.asarray(value, jnp.float32).block_until_ready()


def _progress(out=None, **options):
    from rich.console import Console

    console = Console(file=out if out is not None else io.StringIO(), width=200)
    return ProgressCallback(console=console, **options)


class ListLogger:
    def __init__(self):
        self.records = []

    def log_metrics(self, metrics, step=None):
        self.records.append((step, dict(metrics)))


@pytest.mark.parametrize(
    "make",
    [
        LossSpikeDetector,
        _progress,
        lambda: ThroughputMeter(window=1, peak_flops=None),
        lambda: EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss")),
        lambda: ReduceLROnPlateauCallback(monitor="loss"),
    ],
    ids=["loss_spike", "progress", "throughput", "early_stopping", "plateau_lr"],
)
def test_no_batch_end_waits_for_the_step_it_is_given(slow, make):
    callback = make()
    callback.on_train_begin(None)
    callback.on_batch_end(None, 0, {"loss": ready(1.0)})
    loss = slow(1.0)
    returns_while_it_runs(lambda: callback.on_batch_end(None, 1, {"loss": loss}), loss)
    callback.on_train_end(None)


# LossSpikeDetector: a jax value is decided at the next batch end


def test_a_spike_is_decided_one_step_late_naming_its_own_step(slow):
    detector = LossSpikeDetector(window=10, warmup=3, threshold=4.0, max_spikes=1)
    for step in range(5):
        detector.on_batch_end(None, step, {"loss": ready(1.0)})
    spiking = slow(9.0)
    returns_while_it_runs(lambda: detector.on_batch_end(None, 5, {"loss": spiking}), spiking)
    assert detector.spikes == []  # step 5 is kept, not read yet
    assert not detector.should_stop
    detector.on_batch_end(None, 6, {"loss": ready(1.0)})  # reads step 5, one step late
    assert [(spike.batch, spike.value) for spike in detector.spikes] == [(5, 9.0)]
    assert detector.should_stop


def test_a_spike_at_the_last_step_is_reported_at_train_end(slow):
    detector = LossSpikeDetector(window=10, warmup=3, threshold=4.0)
    for step in range(4):
        detector.on_batch_end(None, step, {"loss": ready(1.0)})
    spiking = slow(9.0)
    returns_while_it_runs(lambda: detector.on_batch_end(None, 4, {"loss": spiking}), spiking)
    assert detector.spikes == []
    detector.on_train_end(None)
    assert [spike.batch for spike in detector.spikes] == [4]


@pytest.mark.parametrize(
    "end",
    [
        lambda d: d.on_epoch_end(None, 0, {}),
        lambda d: d.on_validation_end(None, {}),
        lambda d: d.flush(),
    ],
    ids=["epoch_end", "validation_end", "flush"],
)
def test_the_epoch_and_validation_ends_decide_the_kept_value(end):
    detector = LossSpikeDetector(window=10, warmup=3, threshold=4.0)
    for step in range(4):
        detector.on_batch_end(None, step, {"loss": ready(1.0)})
    detector.on_batch_end(None, 4, {"loss": ready(9.0)})
    assert detector.spikes == []  # a jax value is kept one step, computed or not: one rule
    end(detector)
    assert [spike.batch for spike in detector.spikes] == [4]


def test_host_numbers_are_decided_at_once_after_a_kept_jax_value():
    detector = LossSpikeDetector(window=10, warmup=3, threshold=4.0)
    for step in range(4):
        detector.on_batch_end(None, step, {"loss": 1.0})
    detector.on_batch_end(None, 4, {"loss": 1e3})  # a host number: flagged at once
    assert [spike.batch for spike in detector.spikes] == [4]
    detector.on_batch_end(None, 5, {"loss": ready(2e3)})  # a jax value: kept
    detector.on_batch_end(None, 6, {"loss": 3e3})  # step 5 is decided first, then step 6
    assert [spike.batch for spike in detector.spikes] == [4, 5, 6]


def test_train_begin_drops_a_value_kept_from_a_run_that_never_ended(slow):
    detector = LossSpikeDetector(window=10, warmup=3)
    for step in range(4):
        detector.on_batch_end(None, step, {"loss": ready(1.0)})
    detector.on_batch_end(None, 4, {"loss": ready(9.0)})  # the run raises before its end
    detector.on_train_begin(None)
    detector.on_train_end(None)
    assert detector.spikes == []


@pytest.mark.parametrize("who", ["LossSpikeDetector", "ProgressCallback"])
def test_a_kept_value_deleted_before_it_is_read_is_skipped_with_one_warning(who, caplog):
    callback = LossSpikeDetector() if who == "LossSpikeDetector" else _progress()
    callback.on_train_begin(None)
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        for step in range(3):
            donated = ready(1.0)
            callback.on_batch_end(None, step, {"loss": donated})
            donated.delete()  # as a value of the state the next step's call is donated
        callback.on_train_end(None)
    warnings = [r.getMessage() for r in caplog.records if "deleted" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{who} skips 'loss' of step ")


# ProgressCallback: a jax value is shown at the next batch end, and at the end


def test_the_bar_shows_a_jax_value_one_step_late_and_the_last_at_train_end(slow):
    out = io.StringIO()
    progress = _progress(out, metrics=("loss", "lr"))
    progress.on_train_begin(None)
    loss = slow(3.0)
    returns_while_it_runs(lambda: progress.on_batch_end(None, 0, {"loss": loss, "lr": 0.1}), loss)
    assert progress.latest == {"lr": 0.1}  # the host number at once; the jax value is kept
    # a redraw (the last was more than 0.1 s ago, while step 0 computed) reads step 0's loss
    progress.on_batch_end(None, 1, {"loss": ready(0.5), "lr": 0.2})
    assert progress.latest == {"loss": 3.0, "lr": 0.2}  # step 0's loss, one step late
    last = slow(0.25)
    returns_while_it_runs(lambda: progress.on_batch_end(None, 2, {"loss": last}), last)
    progress.on_train_end(None)
    assert progress.latest == {"loss": 0.25, "lr": 0.2}
    assert "loss=0.25" in out.getvalue()


def test_the_bar_reads_its_values_at_most_ten_times_a_second_and_ends_on_the_last(monkeypatch):
    import substrax.callbacks._progress as progress_module

    read = progress_module.metric_value
    reads = []

    def counted(name, value, *, who):
        reads.append(name)
        return read(name, value, who=who)

    monkeypatch.setattr(progress_module, "metric_value", counted)
    out = io.StringIO()
    progress = _progress(out, total_steps=2000, metrics=("loss", "acc"))
    progress.on_train_begin(None)
    losses = [ready(1.0 / (step + 1)) for step in range(2000)]
    start = time.monotonic()
    for step, loss in enumerate(losses):
        logs = {"loss": loss}
        if step % 500 == 0:  # a metric logged now and then is still shown
            logs["acc"] = ready(step / 2000)
        progress.on_batch_end(None, step, logs)
    elapsed = time.monotonic() - start
    # a redraw reads the values kept; a batch end in between only counts (not 2000 reads)
    assert reads.count("loss") <= 10 * elapsed + 1
    progress.on_train_end(None)
    assert progress.steps == 2000
    assert progress.latest == {"loss": pytest.approx(1 / 2000), "acc": 0.75}
    text = out.getvalue()
    assert "2000/2000" in text
    assert "loss=0.0005" in text
    assert "acc=0.75" in text


# ThroughputMeter: a window's end is timed once its step is computed, never waited on at once


def test_a_window_end_still_computing_is_timed_at_the_next_batch_end(slow):
    logger = ListLogger()
    meter = ThroughputMeter(logger, window=1, peak_flops=None)
    meter.on_batch_end(None, 0, {"loss": ready(1.0)})  # computed: the clock starts at once
    loss = slow(1.0)
    computed = returns_while_it_runs(lambda: meter.on_batch_end(None, 1, {"loss": loss}), loss)
    assert logger.records == []  # the window's end was kept, not waited for
    meter.on_batch_end(None, 2, {"loss": ready(1.0)})  # step 2's batch end: step 1 is timed
    step, figures = logger.records[0]  # (step 2, computed, ends the next window at once)
    assert step == 1  # logged at the window's own last step
    # the clock was read once step 1 was computed: the window holds its compute
    assert 1 / figures["throughput/steps_per_sec"] >= computed


def test_the_first_step_is_left_out_without_waiting_for_it(slow):
    meter = ThroughputMeter(window=1, peak_flops=None)
    first = slow(1.0)  # as a first step that compiles: it is still running
    computed = returns_while_it_runs(lambda: meter.on_batch_end(None, 0, {"loss": first}), first)
    meter.on_batch_end(None, 1, {"loss": ready(1.0)})
    # the clock started when step 0 was computed, and step 1 took no time beyond it
    assert 1 / meter.latest["steps_per_sec"] < computed / 2


def test_batch_begin_times_a_computed_window_end_without_waiting(slow):
    meter = ThroughputMeter(window=1, peak_flops=None)
    meter.on_batch_end(None, 0, {"loss": ready(1.0)})
    loss = slow(1.0)
    meter.on_batch_end(None, 1, {"loss": loss})
    computed = returns_while_it_runs(lambda: meter.on_batch_begin(None, 2), loss)  # it polls only
    assert meter.latest == {}
    meter.on_batch_begin(None, 2)  # now computed: timed here
    assert 1 / meter.latest["steps_per_sec"] >= computed


def test_train_end_times_and_logs_the_last_window(slow):
    logger = ListLogger()
    meter = ThroughputMeter(logger, window=2, peak_flops=None)
    meter.on_train_begin(None)
    for step in range(2):
        meter.on_batch_end(None, step, {"loss": ready(1.0)})
    loss = slow(1.0)
    returns_while_it_runs(lambda: meter.on_batch_end(None, 2, {"loss": loss}), loss)
    assert logger.records == []
    meter.on_train_end(None)
    assert [step for step, _ in logger.records] == [2]
