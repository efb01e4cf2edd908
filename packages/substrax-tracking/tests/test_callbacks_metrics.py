import io
import re

import jax.numpy as jnp
import numpy as np
import pytest

from substrax.callbacks import (
    EarlyStoppingCallback,
    EarlyStoppingConfig,
    LossSpikeDetector,
    MetricValueError,
    MonitorMismatchError,
    ProgressCallback,
)


def _progress(**options):
    from rich.console import Console

    return ProgressCallback(console=Console(file=io.StringIO(), width=200), **options)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (np.ones(3), "shape (3,)"),
        (None, "None"),
        ("0.5", "'0.5'"),
        (jnp.ones((2, 2)), "(2, 2)"),
        (True, "True (bool)"),  # hostile finding: bools were read as 1.0
        (jnp.array(True), "Array"),
        (10**400, "(int)"),  # hostile finding: a bare OverflowError naming no metric
    ],
)
@pytest.mark.parametrize(
    "feed",
    [
        lambda logs: LossSpikeDetector().on_batch_end(None, 0, logs),
        lambda logs: _progress().on_batch_end(None, 0, logs),
        lambda logs: EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss")).on_epoch_end(
            None, 0, logs
        ),
    ],
    ids=["spike", "progress", "early_stopping"],
)
def test_a_metric_that_is_not_one_number_is_refused_naming_it(feed, value, shown):
    with pytest.raises(MetricValueError, match=r"metric 'loss'.*" + re.escape(shown)) as info:
        feed({"loss": value})
    assert info.value.metric == "loss"
    assert isinstance(info.value, TypeError)


def test_a_vector_of_losses_is_refused_saying_how_to_pass_a_stacked_calls_loss():
    # hostile finding: TrainStep(steps_per_call=4) returns 4 losses; the message said only .mean()
    with pytest.raises(MetricValueError) as info:
        LossSpikeDetector().on_batch_end(None, 0, {"loss": jnp.ones(4)})
    assert "TrainStep(steps_per_call=4) returns one loss per step: pass the last, losses[-1]" in (
        str(info.value)
    )
    with pytest.raises(MetricValueError) as info:
        LossSpikeDetector().on_batch_end(None, 0, {"loss": jnp.ones((2, 2))})
    assert "steps_per_call" not in str(info.value)


def test_numpy_and_jax_scalars_are_read_as_numbers():
    detector = LossSpikeDetector(window=4, warmup=2)
    for step, loss in enumerate([np.float32(1.0), jnp.asarray(1.0), 1]):
        detector.on_batch_end(None, step, {"loss": loss})
    assert detector.spikes == []


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn])
def test_a_bfloat16_or_float8_metric_is_one_number(dtype):
    # hostile finding: numpy calls ml_dtypes' floats void ('V'), so the callbacks refused them
    from substrax.callbacks import ReduceLROnPlateauCallback

    loss, host = jnp.asarray(0.5, dtype=dtype), np.asarray(0.5, dtype=dtype)
    stopper = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss"))
    stopper.on_epoch_end(None, 0, {"loss": loss})
    stopper.on_epoch_end(None, 1, {"loss": host})
    assert stopper.best_score == 0.5
    plateau = ReduceLROnPlateauCallback(monitor="loss", patience=1)
    plateau.on_epoch_end(None, 0, {"loss": loss})
    detector = LossSpikeDetector(window=4, warmup=2)
    for step in range(3):
        detector.on_batch_end(None, step, {"loss": loss})
    detector.flush()
    assert detector.spikes == []
    progress = _progress()
    progress.on_batch_end(None, 0, {"loss": loss})
    progress.on_train_end(None)
    assert progress.latest == {"loss": 0.5}


def test_a_record_dtype_is_still_refused():
    record = np.zeros((), dtype=[("a", "f4")])
    with pytest.raises(MetricValueError, match="metric 'loss'"):
        LossSpikeDetector().on_batch_end(None, 0, {"loss": record})


def test_a_one_element_array_is_one_number_as_the_loggers_take_it():
    # a (1,) loss was refused by the callbacks while every logger logged it as its value
    detector = LossSpikeDetector(window=4, warmup=2)
    for step, loss in enumerate([jnp.ones(1), np.ones(1), jnp.full((1, 1), 1.0), jnp.ones(1)]):
        detector.on_batch_end(None, step, {"loss": loss})
    detector.flush()
    assert detector.spikes == []
    stopper = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=1))
    stopper.on_epoch_end(None, 0, {"loss": jnp.asarray([0.5])})
    stopper.on_epoch_end(None, 1, {"loss": np.asarray([0.25])})
    assert stopper.get_state()["stopper"]["best"] == 0.25
    _progress().on_batch_end(None, 0, {"loss": jnp.ones(1)})


def test_a_misspelled_spike_metric_is_warned_about_once_naming_what_was_logged(caplog):
    detector = LossSpikeDetector(monitor="losss")
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        for step in range(5):
            detector.on_batch_end(None, step, {"loss": 1.0, "lr": 0.1})
    warnings = [r for r in caplog.records if "losss" in r.getMessage()]
    assert len(warnings) == 1
    assert "['loss', 'lr']" in warnings[0].getMessage()


def test_a_spike_metric_logged_only_sometimes_is_not_warned_about(caplog):
    detector = LossSpikeDetector(monitor="loss")
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        detector.on_batch_end(None, 0, {"loss": 1.0})
        detector.on_batch_end(None, 1, {"lr": 0.1})
    assert caplog.records == []


def test_a_misspelled_progress_metric_is_warned_about_once(caplog):
    progress = _progress(metrics=("loss", "acc"))
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        progress.on_train_begin(None)
        for step in range(3):
            progress.on_batch_end(None, step, {"loss": 0.5, "accuracy": 0.9})
        progress.on_train_end(None)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "'acc'" in warnings[0]
    assert "['accuracy', 'loss']" in warnings[0]


def test_a_single_string_is_one_progress_metric():
    assert _progress(metrics="loss").metrics == ("loss",)
    assert _progress(metrics=["loss", "lr"]).metrics == ("loss", "lr")
    with pytest.raises(TypeError, match="must be metric names"):
        _progress(metrics=["loss", 3])


def test_early_stopping_state_for_another_metric_or_mode_is_refused():
    saved = EarlyStoppingCallback(EarlyStoppingConfig(monitor="val_loss", mode="min"))
    saved.on_epoch_end(None, 0, {"val_loss": 0.3})
    state = saved.get_state()
    for monitor, mode in [("val_acc", "max"), ("val_acc", "min"), ("val_loss", "max")]:
        other = EarlyStoppingCallback(EarlyStoppingConfig(monitor=monitor, mode=mode))
        with pytest.raises(MonitorMismatchError, match="restore it into a callback") as info:
            other.set_state(state)
        assert info.value.saved == ("val_loss", "min")
        assert info.value.configured == (monitor, mode)
    same = EarlyStoppingCallback(EarlyStoppingConfig(monitor="val_loss", mode="min"))
    same.set_state(state)
    assert same.best_score == pytest.approx(0.3)
