import json
import math
import re

import jax.numpy as jnp
import numpy as np
import pytest

from substrax.callbacks import (
    BestMetricTracker,
    EarlyStopping,
    EarlyStoppingCallback,
    EarlyStoppingConfig,
    MissingMetricError,
    Mode,
    MonitorMismatchError,
    PlateauMode,
    ReduceLROnPlateauCallback,
)
from substrax.support import Mode as SupportMode


def test_spec_example_runs_as_written():
    stopper = EarlyStopping(patience=2, min_delta=0.01, mode="min")
    improved = []
    for step, loss in enumerate([1.0, 0.5, 0.49, 0.495, 0.5]):  # noqa: B007  (the spec's example, as written)
        improved.append(stopper.update(loss))
        if stopper.should_stop:
            break
    assert improved == [True, True, False, False]  # 0.49 is not 0.01 better than 0.5
    assert step == 3  # two updates in a row without improvement


def test_tracker_min_and_max_modes_with_min_delta():
    low = BestMetricTracker(mode=PlateauMode.MIN, min_delta=0.1)
    assert low.best == math.inf
    assert [low.register(v) for v in (1.0, 0.95, 0.85, 0.9)] == [True, False, True, False]
    assert (low.best, low.num_bad_epochs) == (0.85, 1)
    high = BestMetricTracker(mode="max", min_delta=0.0)
    assert high.best == -math.inf
    assert [high.register(v) for v in (1.0, 1.0, 2.0)] == [True, False, True]
    assert high.mode is PlateauMode.MAX


@pytest.mark.parametrize(
    "bad", ["1.0", b"1", True, np.True_, None, 1j, np.array([1.0, 2.0]), jnp.array(True)]
)
@pytest.mark.parametrize("make", [BestMetricTracker, lambda: EarlyStopping(patience=1)])
def test_a_value_that_is_not_one_real_number_is_refused_naming_it(make, bad):
    tracker = make()
    who = type(tracker).__name__
    with pytest.raises(TypeError, match=rf"{who} got value=.* it wants one real number"):
        tracker.update(bad) if isinstance(tracker, EarlyStopping) else tracker.register(bad)
    assert (tracker.best, tracker.num_bad_epochs) == (math.inf, 0)  # nothing was recorded


@pytest.mark.parametrize("make", [BestMetricTracker, lambda: EarlyStopping(patience=1)])
def test_an_int_too_large_for_a_float_is_refused_naming_it(make):
    """Hostile finding: a bare OverflowError named neither the value nor the tracker."""
    tracker = make()
    with pytest.raises(ValueError, match=rf"{type(tracker).__name__} got value=1000.* too large"):
        tracker.register(10**400)
    assert (tracker.best, tracker.num_bad_epochs) == (math.inf, 0)


def test_numpy_and_jax_scalars_are_real_numbers():
    tracker = BestMetricTracker()
    assert [tracker.register(v) for v in (3, np.float32(2.0), jnp.array(1.0), np.int64(0))] == [
        True,
        True,
        True,
        True,
    ]
    assert tracker.best == 0.0


def test_the_mode_is_the_shared_one_under_both_names():
    assert Mode is SupportMode
    assert PlateauMode is SupportMode  # the old name keeps working
    assert EarlyStoppingConfig(mode="max").mode is Mode.MAX
    assert BestMetricTracker(mode=Mode.MAX).mode == "max"


@pytest.mark.parametrize("bad", [-0.1, math.nan])
def test_tracker_refuses_a_negative_min_delta(bad):
    with pytest.raises(ValueError, match="min_delta"):
        BestMetricTracker(mode="min", min_delta=bad)


def test_tracker_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="'min' or 'max'"):
        BestMetricTracker(mode="sideways")


def test_tracker_state_round_trip_and_strict_keys():
    tracker = BestMetricTracker(mode="min")
    tracker.register(2.0)
    tracker.register(3.0)
    state = tracker.get_state()
    assert state == {"best": 2.0, "num_bad_epochs": 1, "mode": "min"}
    other = BestMetricTracker(mode="min")
    other.set_state(state)
    assert (other.best, other.num_bad_epochs) == (2.0, 1)
    with pytest.raises(ValueError, match=r"missing \['num_bad_epochs'\]"):
        other.set_state({"best": 1.0})
    with pytest.raises(ValueError, match=r"unknown \['extra'\]"):
        other.set_state({"best": 1.0, "num_bad_epochs": 0, "extra": 1})


@pytest.mark.parametrize(
    "make", [BestMetricTracker, lambda mode: EarlyStopping(patience=1, mode=mode)]
)
def test_a_tracker_state_saved_in_another_mode_is_refused(make):
    # hostile finding: EarlyStopping(mode="max") took a mode="min" state, its best a worst
    saved = make(mode="min")
    saved.register(0.5)
    with pytest.raises(
        MonitorMismatchError, match="mode 'min', but this callback watches mode 'max'"
    ):
        make(mode="max").set_state(saved.get_state())
    legacy = make(mode="max")  # a state saved without its mode, by 0.1.x, still loads
    legacy.set_state({"best": 0.5, "num_bad_epochs": 0})
    assert legacy.best == 0.5


@pytest.mark.parametrize("patience", [0, -1])
def test_early_stopping_refuses_bad_patience(patience):
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=patience)


@pytest.mark.parametrize("patience", [1.5, True])
def test_early_stopping_refuses_a_patience_that_is_not_an_integer(patience):
    with pytest.raises(TypeError, match="patience"):
        EarlyStopping(patience=patience)


def test_early_stopping_state_round_trip():
    stopper = EarlyStopping(patience=2)
    stopper.update(1.0)
    stopper.update(1.5)
    restored = EarlyStopping(patience=2)
    restored.set_state(stopper.get_state())
    restored.update(1.2)
    assert restored.should_stop


def test_config_validation():
    assert EarlyStoppingConfig().monitor == "val_loss"
    assert EarlyStoppingConfig(mode="max").mode is PlateauMode.MAX
    with pytest.raises(ValueError, match="patience"):
        EarlyStoppingConfig(patience=0)
    with pytest.raises(ValueError, match="min_delta"):
        EarlyStoppingConfig(min_delta=-1.0)
    with pytest.raises(ValueError, match="monitor"):
        EarlyStoppingConfig(monitor="")
    with pytest.raises(ValueError, match="mode"):
        EarlyStoppingConfig(mode="up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stopping_threshold"):
        EarlyStoppingConfig(stopping_threshold=math.inf)
    with pytest.raises(ValueError, match="never check"):
        EarlyStoppingConfig(check_on_epoch_end=False)
    with pytest.raises(TypeError):
        EarlyStoppingConfig("loss")  # type: ignore[misc]  # keyword-only
    with pytest.raises(AttributeError):
        EarlyStoppingConfig().patience = 3  # type: ignore[misc]  # frozen


def run(callback, values, key="loss"):
    for epoch, value in enumerate(values):
        callback.on_epoch_end(None, epoch, {key: value})
        if callback.should_stop:
            return epoch
    return None


def test_callback_stops_after_patience():
    callback = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=2))
    assert callback.best_score is None
    assert run(callback, [1.0, 0.9, 0.95, 0.99, 0.5]) == 3
    assert callback.stopped_epoch == 3
    assert callback.best_score == 0.9
    assert callback.wait_count == 2
    assert "did not improve" in callback.stop_reason


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_callback_stops_at_once_on_a_non_finite_value(bad):
    callback = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=10))
    assert run(callback, [1.0, bad]) == 1
    assert "not finite" in callback.stop_reason


def test_callback_ignores_non_finite_when_check_finite_is_off():
    callback = EarlyStoppingCallback(
        EarlyStoppingConfig(monitor="loss", patience=10, check_finite=False)
    )
    assert run(callback, [1.0, math.nan, 0.5]) is None


def test_stopping_threshold_min_and_max():
    low = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", stopping_threshold=0.1))
    assert run(low, [1.0, 0.5, 0.1, 0.05]) == 2
    assert "stopping_threshold" in low.stop_reason
    high = EarlyStoppingCallback(
        EarlyStoppingConfig(monitor="acc", mode="max", stopping_threshold=0.9)
    )
    assert run(high, [0.5, 0.95], key="acc") == 1


def test_the_value_that_reaches_the_stopping_threshold_is_the_best_score():
    """Hostile finding: best_score (and the saved state) left out the value that stopped training."""
    low = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", stopping_threshold=0.1))
    assert run(low, [1.0, 0.5, 0.05]) == 2
    assert low.best_score == 0.05
    assert low.get_state()["stopper"]["best"] == 0.05
    high = EarlyStoppingCallback(
        EarlyStoppingConfig(monitor="acc", mode="max", stopping_threshold=0.9)
    )
    assert run(high, [0.95], key="acc") == 0
    assert high.best_score == 0.95
    diverged = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", divergence_threshold=10.0))
    assert run(diverged, [1.0, 11.0]) == 1
    assert diverged.best_score == 1.0  # a diverged value is never the best


def test_an_evaluation_checked_at_validation_end_is_not_counted_again_at_the_epoch_end():
    """Hostile finding: with check_on_validation_end (check_on_epoch_end on by default) each
    value counted twice, so patience=3 stopped after two bad epochs."""
    stopper = EarlyStoppingCallback(
        EarlyStoppingConfig(monitor="val_loss", patience=3, check_on_validation_end=True)
    )
    waits = []
    for epoch, val_loss in enumerate([1.0, 1.1, 1.1, 1.1]):
        stopper.on_epoch_begin(None, epoch)
        stopper.on_validation_end(None, {"val_loss": val_loss})
        stopper.on_epoch_end(None, epoch, {"val_loss": val_loss})
        waits.append(stopper.wait_count)
    assert waits == [0, 1, 2, 3]
    assert stopper.stopped_epoch == 3
    epoch_only = EarlyStoppingCallback(EarlyStoppingConfig(monitor="val_loss", patience=3))
    assert run(epoch_only, [1.0, 1.1, 1.1, 1.1], key="val_loss") == 3


def test_an_evaluation_checked_at_the_epoch_end_is_not_counted_again_at_validation_end():
    """Hostile finding: a loop calling on_validation_end after on_epoch_end, both checking, had
    each value counted twice, so patience=3 stopped after two bad epochs."""
    stopper = EarlyStoppingCallback(
        EarlyStoppingConfig(monitor="val_loss", patience=3, check_on_validation_end=True)
    )
    waits = []
    for epoch, val_loss in enumerate([1.0, 1.1, 1.1, 1.1]):
        stopper.on_epoch_begin(None, epoch)
        stopper.on_epoch_end(None, epoch, {"val_loss": val_loss})
        stopper.on_validation_end(None, {"val_loss": val_loss})
        waits.append(stopper.wait_count)
    assert waits == [0, 1, 2, 3]
    assert stopper.stopped_epoch == 3


def test_a_stopped_epoch_given_as_a_numpy_or_jax_index_is_saved_as_an_int():
    # hostile finding: the loop's np.int64 epoch reached get_state(), which is not strict JSON
    for index in (np.int64, jnp.asarray):
        stopper = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=1))
        for epoch, loss in enumerate([1.0, 2.0]):
            stopper.on_epoch_end(None, index(epoch), {"loss": loss})
        assert type(stopper.get_state()["stopped_epoch"]) is int
        json.dumps(stopper.get_state(), allow_nan=False)


def test_divergence_threshold_min_and_max():
    low = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", divergence_threshold=10.0))
    assert run(low, [1.0, 5.0, 11.0]) == 2
    assert "diverged" in low.stop_reason
    high = EarlyStoppingCallback(
        EarlyStoppingConfig(monitor="acc", mode="max", divergence_threshold=0.1)
    )
    assert run(high, [0.5, 0.05], key="acc") == 1


def test_strict_refuses_a_missing_key_with_a_key_error():
    callback = EarlyStoppingCallback(EarlyStoppingConfig(monitor="val_loss"))
    with pytest.raises(MissingMetricError) as info:
        callback.on_epoch_end(None, 0, {"loss": 1.0})
    assert isinstance(info.value, KeyError)
    assert info.value.monitor == "val_loss"
    assert info.value.available == ("loss",)
    assert "strict=False" in str(info.value)
    assert "'val_loss'" in str(info.value)


def test_non_strict_skips_a_missing_key():
    callback = EarlyStoppingCallback(
        EarlyStoppingConfig(monitor="val_loss", strict=False, patience=1)
    )
    for epoch in range(3):
        callback.on_epoch_end(None, epoch, {"loss": 1.0})
    assert not callback.should_stop
    assert callback.wait_count == 0


def test_check_on_validation_end():
    config = EarlyStoppingConfig(
        monitor="val_loss", patience=1, check_on_epoch_end=False, check_on_validation_end=True
    )
    callback = EarlyStoppingCallback(config)
    callback.on_epoch_begin(None, 0)
    callback.on_validation_end(None, {"val_loss": 1.0})
    callback.on_epoch_end(None, 0, {"loss": 5.0})  # not checked, and no strict error either
    callback.on_epoch_begin(None, 1)
    callback.on_validation_end(None, {"val_loss": 2.0})
    assert callback.should_stop
    assert callback.stopped_epoch == 1


def test_validation_end_is_not_checked_by_default():
    callback = EarlyStoppingCallback(EarlyStoppingConfig(monitor="val_loss", patience=1))
    callback.on_validation_end(None, {})
    assert not callback.should_stop


def test_callback_state_round_trip_and_refusal():
    callback = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=2))
    run(callback, [1.0, 2.0, 3.0])
    state = callback.get_state()
    assert set(state) == {"stopper", "stopped_epoch", "stop_reason", "monitor", "mode"}
    restored = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=2))
    restored.set_state(state)
    assert restored.should_stop
    assert restored.stopped_epoch == 2
    assert restored.best_score == 1.0
    # the reference's two-key state is accepted too
    legacy = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=2))
    legacy.set_state({"stopper": {"best": 1.0, "num_bad_epochs": 1}, "stopped_epoch": None})
    assert not legacy.should_stop
    with pytest.raises(ValueError, match="stopper"):
        legacy.set_state({"stopped_epoch": None})


def test_verbose_logs_the_reason(caplog):
    callback = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=1, verbose=True))
    with caplog.at_level("INFO", logger="substrax.callbacks"):
        run(callback, [1.0, 2.0])
    assert "early stopping at epoch 1" in caplog.text


def _plateau(monitor="loss", mode="min"):
    return ReduceLROnPlateauCallback(monitor=monitor, mode=mode, factor=0.5, patience=1)


def _stopper(monitor="loss", mode="min"):
    return EarlyStoppingCallback(EarlyStoppingConfig(monitor=monitor, mode=mode, patience=2))


TRACKER = {"best": 1.0, "num_bad_epochs": 0}
PLATEAU = {"tracker": TRACKER, "scale": 0.5, "cooldown_left": 0, "base_lr": None}
STOPPER = {"stopper": TRACKER, "stopped_epoch": None}


@pytest.mark.parametrize(
    ("make", "state", "named"),
    [
        (BestMetricTracker, {"best": math.nan, "num_bad_epochs": 0}, "best=nan"),
        (BestMetricTracker, {"best": "0.3", "num_bad_epochs": 0}, "best='0.3'"),
        (BestMetricTracker, {"best": 1.0, "num_bad_epochs": -3}, "num_bad_epochs=-3"),
        (BestMetricTracker, {"best": 1.0, "num_bad_epochs": 1.5}, "num_bad_epochs=1.5"),
        (BestMetricTracker, {"best": 1.0, "num_bad_epochs": True}, "num_bad_epochs=True"),
        (_stopper, {**STOPPER, "stopped_epoch": -5}, "stopped_epoch=-5"),
        (_stopper, {**STOPPER, "stopped_epoch": "3"}, "stopped_epoch='3'"),
        (_stopper, {**STOPPER, "stopped_epoch": 2, "stop_reason": 5}, "stop_reason=5"),
        (_stopper, {**STOPPER, "stop_reason": "patience"}, "stop_reason='patience'"),
        (_stopper, {**STOPPER, "stopper": {"best": math.nan, "num_bad_epochs": 0}}, "best=nan"),
        (_plateau, {**PLATEAU, "scale": 5.0}, "scale=5.0"),
        (_plateau, {**PLATEAU, "scale": math.nan}, "scale=nan"),
        (_plateau, {**PLATEAU, "cooldown_left": -1}, "cooldown_left=-1"),
        (_plateau, {**PLATEAU, "base_lr": math.inf}, "base_lr=inf"),
        (_plateau, {**PLATEAU, "tracker": {"best": 1.0, "num_bad_epochs": -1}}, "num_bad_epochs"),
    ],
)
def test_a_malformed_state_is_refused_naming_the_field_and_value(make, state, named):
    """Hostile finding: set_state took a negative count, a NaN best or a scale of 5 silently."""
    callback = make()
    before = callback.get_state()
    with pytest.raises(ValueError, match=re.escape(named)):
        callback.set_state(state)
    assert callback.get_state() == before  # nothing restored halfway


@pytest.mark.parametrize("make", [BestMetricTracker, _stopper, _plateau])
@pytest.mark.parametrize("state", [None, [1.0, 0], "state"])
def test_a_state_that_is_not_a_dict_is_refused_naming_it(make, state):
    with pytest.raises(TypeError, match="must be a dict from get_state"):
        make().set_state(state)


@pytest.mark.parametrize("make", [_stopper, _plateau])
@pytest.mark.parametrize(
    ("monitor", "mode", "differs"),
    [("acc", "min", "another monitor"), ("loss", "max", "another mode"), ("acc", "max", "and")],
)
def test_a_state_saved_for_another_monitor_or_mode_is_refused_saying_which(
    make, monitor, mode, differs
):
    state = make().get_state()
    with pytest.raises(MonitorMismatchError, match=differs) as info:
        make(monitor, mode).set_state(state)
    assert info.value.saved == ("loss", "min")
    assert info.value.configured == (monitor, mode)


def test_a_plateau_state_without_monitor_and_mode_is_still_restored():
    saved = plateau_run([1.0, 1.0, 1.0])
    state = {k: v for k, v in saved.get_state().items() if k not in ("monitor", "mode")}
    restored = _plateau()
    restored.set_state(state)
    assert restored.scale == saved.scale == 0.25


def plateau_run(values):
    callback = _plateau()
    for epoch, value in enumerate(values):
        callback.on_epoch_end(None, epoch, {"loss": value})
    return callback


def _patience(mode="min"):
    return EarlyStopping(patience=2, mode=mode)


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("make", [BestMetricTracker, _patience, _stopper, _plateau])
def test_every_state_is_strict_json_and_round_trips_through_it(make, mode):
    """Hostile finding: a fresh tracker's best is inf, which strict JSON cannot hold."""
    for values in ([], [1.0, 2.0]):
        saved = make(mode=mode)
        for epoch, value in enumerate(values):
            if isinstance(saved, BestMetricTracker):
                saved.register(value)
            else:
                saved.on_epoch_end(None, epoch, {"loss": value})
        restored = make(mode=mode)
        restored.set_state(json.loads(json.dumps(saved.get_state(), allow_nan=False)))
        assert restored.get_state() == saved.get_state()
        if isinstance(saved, BestMetricTracker):
            assert restored.best == saved.best  # inf or -inf before the first value, as saved


def test_a_tracker_takes_none_and_an_infinite_best_as_no_best_yet():
    for best, mode, restored in [
        (None, "min", math.inf),
        (None, "max", -math.inf),
        (math.inf, "min", math.inf),
        (-math.inf, "min", -math.inf),
    ]:
        tracker = BestMetricTracker(mode=mode)
        tracker.set_state({"best": best, "num_bad_epochs": 0})
        assert tracker.best == restored
    diverged = BestMetricTracker(mode="min")
    diverged.register(-math.inf)  # a best of -inf is written finite and read back as -inf
    tracker = BestMetricTracker(mode="min")
    tracker.set_state(json.loads(json.dumps(diverged.get_state(), allow_nan=False)))
    assert tracker.best == -math.inf
