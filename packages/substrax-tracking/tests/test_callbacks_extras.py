import io
import json
import math
import re
import statistics

import pytest

from substrax.callbacks import (
    LossSpikeDetector,
    MissingMetricError,
    NoLearningRateFoundError,
    ProgressCallback,
    ReduceLROnPlateauCallback,
)


def plateau(values, **options):
    callback = ReduceLROnPlateauCallback(monitor="loss", **options)
    for epoch, value in enumerate(values):
        callback.on_epoch_end(None, epoch, {"loss": value})
    return callback


def test_plateau_scale_patience_cooldown_and_floor():
    assert plateau([1.0, 1.0], factor=0.5, patience=2).scale == 1.0
    assert plateau([1.0, 1.0, 1.0], factor=0.5, patience=2).scale == 0.5
    # cooldown: the two checks after a reduction do not count
    assert plateau([1.0, 1.0, 1.0, 1.0], factor=0.5, patience=1, cooldown=2).scale == 0.5
    assert plateau([1.0] * 5, factor=0.5, patience=1, cooldown=2).scale == 0.25
    assert plateau([1.0] * 10, factor=0.5, patience=1, min_scale=0.2).scale == 0.2
    assert plateau([1.0, 0.5, 0.25], factor=0.5, patience=1).scale == 1.0


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"factor": 1.0}, "factor"),
        ({"factor": 0.0}, "factor"),
        ({"patience": 0}, "patience"),
        ({"cooldown": -1}, "cooldown"),
        ({"min_scale": 2.0}, "min_scale"),
    ],
)
def test_plateau_refuses_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        ReduceLROnPlateauCallback(**options)


def test_plateau_strict_missing_key():
    with pytest.raises(MissingMetricError):
        ReduceLROnPlateauCallback(monitor="val_loss").on_epoch_end(None, 0, {"loss": 1.0})
    ReduceLROnPlateauCallback(monitor="val_loss", strict=False).on_epoch_end(None, 0, {})


def test_plateau_drives_optax_reduce_on_plateau_state():
    jnp = pytest.importorskip("jax.numpy", reason="jax is needed to build an optax state")
    optax = pytest.importorskip("optax", reason="optax is needed for reduce_on_plateau")
    params = {"w": jnp.ones(3)}
    tx = optax.chain(optax.sgd(1.0), optax.contrib.reduce_on_plateau(patience=10**9))
    state = tx.init(params)
    callback = plateau([1.0, 1.0], factor=0.5, patience=1)
    state = callback.apply(state)
    updates, _ = tx.update({"w": jnp.ones(3)}, state, params, value=jnp.asarray(1.0))
    assert float(updates["w"][0]) == pytest.approx(-0.5)


def test_plateau_drives_an_injected_learning_rate_in_an_nnx_optimizer():
    pytest.importorskip("jax", reason="jax is needed for an nnx optimizer")
    optax = pytest.importorskip("optax", reason="optax is needed for inject_hyperparams")
    nnx = pytest.importorskip("flax.nnx", reason="flax is needed for nnx.Optimizer")
    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(
        model, optax.inject_hyperparams(optax.sgd)(learning_rate=0.1), wrt=nnx.Param
    )

    class Trainer:
        pass

    trainer = Trainer()
    trainer.model, trainer.optimizer = model, optimizer
    callback = ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1)
    for epoch in range(3):
        callback.on_epoch_end(trainer, epoch, {"loss": 1.0})
    lr = optimizer.opt_state.hyperparams["learning_rate"]
    assert float(lr.get_value()) == pytest.approx(0.025)


def test_a_resumed_plateau_whose_optimizer_was_not_restored_says_so(caplog):
    """A spec review: only the schedule was named as the cause when a resume restored the
    callback's state into a fresh optimizer."""
    pytest.importorskip("jax", reason="jax is needed for an nnx optimizer")
    optax = pytest.importorskip("optax", reason="optax is needed for inject_hyperparams")
    nnx = pytest.importorskip("flax.nnx", reason="flax is needed for nnx.Optimizer")

    def fresh():
        model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
        return nnx.Optimizer(model, tx, wrt=nnx.Param)

    first = ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1, optimizer=fresh())
    for epoch in range(3):
        first.on_epoch_end(None, epoch, {"loss": 1.0})
    resumed = ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1, optimizer=fresh())
    resumed.set_state(first.get_state())
    resumed.on_epoch_end(None, 3, {"loss": 0.5})
    assert "the optimizer's state was not restored with this callback's" in caplog.text


def test_plateau_scales_each_injected_group_from_its_own_base_and_leaves_the_state_given():
    """Hostile findings: two ``inject_hyperparams`` groups got one base (the first group's), a
    10x learning-rate change before any plateau; ``apply`` also changed the state given."""
    jnp = pytest.importorskip("jax.numpy", reason="jax is needed to build an optax state")
    optax = pytest.importorskip("optax", reason="optax is needed for inject_hyperparams")
    params = {"kernel": jnp.ones(2), "bias": jnp.ones(1)}
    tx = optax.multi_transform(
        {
            "kernel": optax.inject_hyperparams(optax.sgd)(learning_rate=0.1),
            "bias": optax.inject_hyperparams(optax.sgd)(learning_rate=0.01),
        },
        {"kernel": "kernel", "bias": "bias"},
    )
    state = tx.init(params)
    callback = ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1)

    def rates(opt_state):
        inner = opt_state.inner_states
        return {k: float(inner[k].inner_state.hyperparams["learning_rate"]) for k in inner}

    given = rates(state)
    state = callback.apply(state)  # scale 1: every group keeps its own rate
    assert rates(state) == pytest.approx({"kernel": 0.1, "bias": 0.01})
    callback.on_epoch_end(None, 0, {"loss": 1.0})
    callback.on_epoch_end(None, 1, {"loss": 1.0})  # a plateau: scale 0.5
    halved = callback.apply(state)
    assert rates(halved) == pytest.approx({"kernel": 0.05, "bias": 0.005})
    assert rates(state) == pytest.approx(given)  # the state given is left as it was
    restored = ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1)
    restored.set_state(callback.get_state())
    assert callback.get_state()["base_lr"] == pytest.approx([0.1, 0.01])
    assert rates(restored.apply(state)) == pytest.approx({"kernel": 0.05, "bias": 0.005})


def test_plateau_warns_once_when_a_schedule_overrides_its_scale(caplog):
    jnp = pytest.importorskip("jax.numpy", reason="jax is needed to build an optax state")
    optax = pytest.importorskip("optax", reason="optax is needed for inject_hyperparams")
    params = {"w": jnp.ones(2)}
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=optax.constant_schedule(0.1))
    state = tx.init(params)
    callback = plateau([1.0, 1.0, 1.0], factor=0.5, patience=1)  # scale 0.25
    for _ in range(3):
        state = callback.apply(state)
        _, state = tx.update({"w": jnp.ones(2)}, state, params)  # the schedule sets it again
    warnings = [r.getMessage() for r in caplog.records if "does not last" in r.getMessage()]
    assert len(warnings) == 1
    assert "the injected learning_rate is 0.1, not the 0.025 it was set to" in warnings[0]


@pytest.mark.parametrize("hyperparam", ["", 3, None])
def test_plateau_refuses_a_hyperparam_that_is_no_name(hyperparam):
    with pytest.raises(TypeError, match=r"hyperparam=.* must name an injected hyperparameter"):
        ReduceLROnPlateauCallback(hyperparam=hyperparam)


def test_plateau_refuses_a_state_without_a_learning_rate():
    with pytest.raises(NoLearningRateFoundError, match="inject_hyperparams"):
        ReduceLROnPlateauCallback().apply(({"mu": 1.0},))


def test_plateau_state_round_trip():
    callback = plateau([1.0, 1.0, 1.0], factor=0.5, patience=1)
    restored = ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1)
    restored.set_state(callback.get_state())
    assert restored.scale == callback.scale
    with pytest.raises(ValueError, match="exactly"):
        restored.set_state({"scale": 1.0})


def test_progress_bar_shows_steps_rate_and_metrics():
    from rich.console import Console

    out = io.StringIO()
    progress = ProgressCallback(
        total_steps=3, console=Console(file=out, width=140), metrics=("loss",)
    )
    progress.on_train_begin(None)
    for step in range(3):
        progress.on_batch_end(None, step, {"loss": 0.5 / (step + 1)})
    progress.on_train_end(None)
    text = out.getvalue()
    assert progress.steps == 3
    assert "3/3" in text
    assert "loss=0.1667" in text
    assert "steps/s" in text


def test_a_resumed_run_s_bar_starts_at_its_restored_step():
    """Hostile finding: a run resumed at step 5 of 10 ended its bar at 5/10."""
    from rich.console import Console

    out = io.StringIO()
    progress = ProgressCallback(
        total_steps=10, initial_step=5, console=Console(file=out, width=140)
    )
    progress.on_train_begin(None)
    for step in range(5, 10):
        progress.on_batch_end(None, step, {"loss": 0.5})
    progress.on_train_end(None)
    assert progress.steps == 10
    assert "10/10" in out.getvalue()


def test_progress_refuses_negative_total():
    with pytest.raises(ValueError, match="total_steps"):
        ProgressCallback(total_steps=-1)
    with pytest.raises(ValueError, match="initial_step"):
        ProgressCallback(initial_step=-1)


def test_loss_spike_detector_flags_spikes_and_non_finite(caplog):
    seen = []
    detector = LossSpikeDetector(
        window=10, warmup=5, threshold=4.0, max_spikes=2, on_spike=seen.append
    )
    values = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 9.0, 1.0, math.nan]
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        for step, value in enumerate(values):
            assert not detector.should_stop
            detector.on_batch_end(None, step, {"loss": value})
    assert [spike.batch for spike in detector.spikes] == [6, 8]
    assert seen == detector.spikes
    assert detector.spikes[0].mean == pytest.approx(1.0, abs=0.01)
    assert detector.should_stop
    assert "spiked at step 6" in caplog.text


def test_an_infinity_in_the_good_direction_is_one_plateau_not_a_best_to_beat():
    """Hostile finding: a +inf accuracy (PSNR of a perfect batch) became the best, and the scale
    was then cut every ``patience`` epochs while the metric kept improving."""
    callback = ReduceLROnPlateauCallback(monitor="acc", mode="max", patience=2, factor=0.5)
    for epoch, value in enumerate([0.1, math.inf, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]):
        callback.on_epoch_end(None, epoch, {"acc": value})
    assert callback.scale == 0.5


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e-6, 1e-9])
def test_loss_spike_detector_sees_a_spike_at_any_loss_scale(scale):
    """Hostile finding: float32's resolution was an absolute floor, hiding spikes below 7e-7."""
    detector = LossSpikeDetector(window=10, warmup=3)
    for step in range(20):
        detector.on_batch_end(None, step, {"loss": scale * (1.0 + 0.01 * (step % 3))})
    detector.on_batch_end(None, 20, {"loss": 100 * scale})
    assert [spike.batch for spike in detector.spikes] == [20]


def test_loss_spike_detector_quiet_during_warmup_and_on_a_flat_loss():
    detector = LossSpikeDetector(window=5, warmup=3)
    for step, value in enumerate([100.0, 1.0, 1.0, 1.0, 1.0, 1.001]):
        detector.on_batch_end(None, step, {"loss": value})
    detector.on_batch_end(None, 9, {"other": 1.0})
    assert detector.spikes == []


def test_loss_spike_detector_ignores_rounding_above_a_loss_of_zero():
    detector = LossSpikeDetector(window=10, warmup=3)
    # a memorised batch: the loss reaches 0.0, then float32 rounding leaves 2.4e-7 at times
    for step, value in enumerate([0.5, 0.1, 0.0, 0.0, 0.0, 0.0, *[2.38419e-07, 0.0] * 20]):
        detector.on_batch_end(None, step, {"loss": value})
    assert detector.spikes == []
    detector.on_batch_end(None, 99, {"loss": 1e-3})  # a real rise from zero still counts
    assert [spike.batch for spike in detector.spikes] == [99]


def test_loss_spike_detector_takes_a_lasting_level_as_the_new_window():
    detector = LossSpikeDetector(window=10, warmup=3)
    for step, value in enumerate([1.0] * 5 + [5.0] * 20 + [25.0]):
        detector.on_batch_end(None, step, {"loss": value})
    # the rise to 5 is flagged while it lasts less than warmup steps, then 5 is the level
    assert [spike.batch for spike in detector.spikes] == [5, 6, 7, 25]


def test_loss_spike_detector_keeps_a_short_spike_out_of_the_window():
    detector = LossSpikeDetector(window=10, warmup=3)
    for step, value in enumerate([1.0] * 5 + [9.0, 9.0] + [1.0] * 3 + [9.0]):
        detector.on_batch_end(None, step, {"loss": value})
    assert [spike.batch for spike in detector.spikes] == [5, 6, 10]


def test_loss_spike_detector_takes_a_diverging_float64_loss_without_overflow():
    # a float64 loss that has diverged to 1e170: squaring its deviations would overflow
    detector = LossSpikeDetector(window=10, warmup=3)
    values = [1e170, 2e170, 3e170, 2e170, 1e172]
    for step, value in enumerate(values):
        detector.on_batch_end(None, step, {"loss": value})
    (spike,) = detector.spikes
    assert spike.batch == 4
    assert spike.mean == pytest.approx(statistics.fmean(values[:4]))
    assert spike.std == pytest.approx(statistics.pstdev(values[:4]))


def test_a_resumed_loss_spike_detector_flags_what_the_uninterrupted_one_does():
    """Hostile finding: it had no state to checkpoint; a resumed run's empty window flagged a
    step the uninterrupted run did not."""
    from substrax.callbacks import CallbackList, is_checkpointable

    losses = [1.07, 2.19, 1.19, 0.60, 1.35, 1.45, 0.98, 1.15, 0.73, 1.01, 0.85, 0.68, 1.03, 0.75]
    losses += [0.38, 0.63, 0.53, 0.51, 0.63, 0.91, 0.66, 0.74, 0.71, 0.59, 0.57, 0.57, 0.41, 0.61]
    losses += [0.48, 0.59, 0.54, 0.53, 0.56, 0.81, 0.33, 0.57, 0.46, 0.57, 0.54, 0.61, math.nan]
    uninterrupted, first = (
        LossSpikeDetector(window=20, warmup=5),
        LossSpikeDetector(window=20, warmup=5),
    )
    for step, loss in enumerate(losses):
        uninterrupted.on_batch_end(None, step, {"loss": loss})
    for step, loss in enumerate(losses[:28]):
        first.on_batch_end(None, step, {"loss": loss})
    assert is_checkpointable(first)
    state = json.loads(json.dumps(CallbackList([first]).get_state(), allow_nan=False))
    resumed = LossSpikeDetector(window=20, warmup=5)
    CallbackList([resumed]).set_state(state)
    for step, loss in enumerate(losses[28:], start=28):
        resumed.on_batch_end(None, step, {"loss": loss})
    assert resumed.spikes == uninterrupted.spikes  # the NaN's, with its step, and no other
    assert [spike.batch for spike in resumed.spikes] == [40]
    fresh = LossSpikeDetector(window=20, warmup=5)  # resumed without its state
    for step, loss in enumerate(losses[28:], start=28):
        fresh.on_batch_end(None, step, {"loss": loss})
    assert [spike.batch for spike in fresh.spikes] == [33, 40]
    with pytest.raises(ValueError, match="LossSpikeDetector state"):
        resumed.set_state({"recent": ["x"], "streak": [], "spikes": []})


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"window": 1}, "window"),
        ({"warmup": 1}, "warmup"),
        ({"threshold": 0}, "threshold"),
        ({"max_spikes": 0}, "max_spikes"),
    ],
)
def test_loss_spike_detector_refuses_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        LossSpikeDetector(**options)


def test_a_plain_optax_state_gets_the_reduced_scale_written_back():
    """Hostile finding: with optimizer= an object holding a plain optax state (immutable
    tuples), the callback's scale dropped but the optimizer's stayed 1.0, without a word."""
    jnp = pytest.importorskip("jax.numpy", reason="jax is needed to build an optax state")
    optax = pytest.importorskip("optax", reason="optax is needed for reduce_on_plateau")

    class Holder:
        def __init__(self, opt_state):
            self.opt_state = opt_state

    tx = optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau(patience=1000))
    holder = Holder(tx.init({"w": jnp.ones(3)}))
    callback = ReduceLROnPlateauCallback(monitor="loss", patience=1, factor=0.5, optimizer=holder)
    for epoch in range(3):
        callback.on_epoch_end(None, epoch, {"loss": 1.0})
    assert callback.scale == 0.25
    assert float(holder.opt_state[1].scale) == 0.25


@pytest.mark.parametrize("value", [None, "0.5", [1.0, 2.0]])
def test_plateau_refuses_a_monitored_value_that_is_not_one_number(value):
    from substrax.callbacks import MetricValueError

    with pytest.raises(MetricValueError, match="ReduceLROnPlateauCallback"):
        ReduceLROnPlateauCallback(monitor="loss").on_epoch_end(None, 0, {"loss": value})


@pytest.mark.parametrize("monitor", [None, ""])
def test_plateau_refuses_a_monitor_that_is_not_a_name(monitor):
    with pytest.raises(ValueError, match="must be a non-empty metric name"):
        ReduceLROnPlateauCallback(monitor=monitor)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"min_std_fraction": math.inf}, "min_std_fraction=inf"),
        ({"min_std_fraction": math.nan}, "min_std_fraction=nan"),
        ({"min_std_fraction": -0.5}, "min_std_fraction=-0.5"),
        ({"threshold": math.nan}, "threshold=nan"),
        ({"threshold": math.inf}, "threshold=inf"),
        ({"monitor": ""}, "monitor=''"),
    ],
)
def test_loss_spike_detector_refuses_a_non_finite_or_negative_option_naming_it(options, named):
    """Hostile finding: min_std_fraction=inf or nan was taken, and no spike was ever flagged."""
    with pytest.raises(ValueError, match=re.escape(named)):
        LossSpikeDetector(**options)


@pytest.mark.parametrize(
    ("options", "named"),
    [({"min_std_fraction": "0.1"}, "min_std_fraction"), ({"on_spike": 5}, "on_spike=5")],
)
def test_loss_spike_detector_refuses_an_option_of_the_wrong_type(options, named):
    with pytest.raises(TypeError, match=named):
        LossSpikeDetector(**options)


def test_a_second_run_starts_a_fresh_bar_and_leaves_the_first_as_it_was():
    """Hostile finding: a second on_train_begin added a bar beside the first run's finished one,
    which was drawn again (a stale, duplicated bar), and the step count went on from the first."""
    from rich.console import Console

    out = io.StringIO()
    progress = ProgressCallback(total_steps=3, console=Console(file=out, width=140))
    for steps in (3, 1):
        progress.on_train_begin(None)
        for step in range(steps):
            progress.on_batch_end(None, step, {"loss": 0.5})
        progress.on_train_end(None)
        assert progress.steps == steps
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["3/3", "1/3"]  # no stale bar drawn again


def test_a_run_that_never_ended_has_its_bar_closed_by_the_next_run():
    from rich.console import Console

    out = io.StringIO()
    progress = ProgressCallback(total_steps=3, console=Console(file=out, width=140))
    progress.on_train_begin(None)
    progress.on_batch_end(None, 0, {"loss": 0.5})  # the run raises here, before on_train_end
    progress.on_train_begin(None)
    for step in range(2):
        progress.on_batch_end(None, step, {"loss": 0.25})
    progress.on_train_end(None)
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["1/3", "2/3"]
    assert progress.latest == {"loss": 0.25}
    assert progress.steps == 2


SPIKY = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 50.0, 1.0, 1.01, 0.99, 1.0]


def test_a_state_saved_at_a_spike_still_kept_unread_holds_it():
    """Hostile finding: get_state() left out the jax value kept from the last step (decided one
    step late), so a run resumed from a checkpoint saved at the spiking step lost that spike."""
    jnp = pytest.importorskip("jax.numpy", reason="the kept value is a jax array")
    uninterrupted, first = (
        LossSpikeDetector(window=10, warmup=5),
        LossSpikeDetector(window=10, warmup=5),
    )
    for step, loss in enumerate(SPIKY):
        uninterrupted.on_batch_end(None, step, {"loss": jnp.asarray(loss)})
    uninterrupted.on_train_end(None)
    for step, loss in enumerate(SPIKY[:8]):  # saved at step 7, then preempted: no on_train_end
        first.on_batch_end(None, step, {"loss": jnp.asarray(loss)})
    state = json.loads(json.dumps(first.get_state(), allow_nan=False))
    resumed = LossSpikeDetector(window=10, warmup=5)
    resumed.set_state(state)
    resumed.on_train_begin(None)
    for step, loss in enumerate(SPIKY[8:], start=8):
        resumed.on_batch_end(None, step, {"loss": jnp.asarray(loss)})
    resumed.on_train_end(None)
    assert [spike.batch for spike in uninterrupted.spikes] == [7]
    assert resumed.spikes == uninterrupted.spikes


def test_a_spike_state_is_refused_by_a_detector_of_another_monitor():
    # hostile finding: a "loss" detector's window restored into a "grad_norm" one flagged spikes
    from substrax.callbacks import MonitorMismatchError

    saved = LossSpikeDetector(monitor="loss", window=4, warmup=2)
    for step in range(3):
        saved.on_batch_end(None, step, {"loss": 1.0})
    state = saved.get_state()
    with pytest.raises(MonitorMismatchError, match="'loss', but this callback watches 'grad_norm'"):
        LossSpikeDetector(monitor="grad_norm", window=4, warmup=2).set_state(state)
    legacy = {key: state[key] for key in ("recent", "streak", "spikes")}  # saved by 0.1.x
    LossSpikeDetector(monitor="grad_norm", window=4, warmup=2).set_state(legacy)


def test_a_spike_state_holds_the_latest_spikes_and_the_count_of_all():
    """Hostile finding: the state grew by four leaves a spike (2000 NaN steps made a checkpoint
    save take 10 s); it now holds the latest 16 spikes and the count."""
    detector = LossSpikeDetector(window=4, warmup=2, max_spikes=2000)
    for step in range(2000):
        detector.on_batch_end(None, step, {"loss": math.nan})
    state = detector.get_state()
    assert len(state["spikes"]) == 16
    assert state["spikes"][-1][0] == 1999
    assert state["spike_count"] == 2000
    restored = LossSpikeDetector(window=4, warmup=2, max_spikes=2000)
    restored.set_state(json.loads(json.dumps(state)))
    assert restored.spike_count == 2000
    assert [spike.batch for spike in restored.spikes] == list(range(1984, 2000))
    assert restored.should_stop  # max_spikes counts the spikes before the restore
    restored.on_batch_end(None, 2000, {"loss": math.nan})
    assert restored.spike_count == 2001
    with pytest.raises(ValueError, match="spike_count=3"):
        restored.set_state({**state, "spike_count": 3})


def test_a_spike_state_is_strict_json_with_a_numpy_or_jax_step_index():
    # hostile finding: LossSpike.batch kept the loop's Array(4), and get_state() held it
    np = pytest.importorskip("numpy")
    jnp = pytest.importorskip("jax.numpy", reason="a jax step index")
    detector = LossSpikeDetector(window=4, warmup=2)
    for step, loss in enumerate([1.0, 1.0, 1.0, 1.0, math.nan, math.nan]):
        index = jnp.asarray(step) if step % 2 else np.int64(step)
        detector.on_batch_end(None, index, {"loss": loss})
    assert [type(spike.batch) for spike in detector.spikes] == [int, int]
    json.dumps(detector.get_state(), allow_nan=False)


def _chained_plateau_epochs(callback, *, patience, updates):
    """Three flat epochs of ``updates`` updates of sgd chained with a reduce_on_plateau of
    ``patience``, the callback applied at each epoch end; the last state."""
    jnp = pytest.importorskip("jax.numpy", reason="jax is needed to build an optax state")
    optax = pytest.importorskip("optax", reason="optax is needed for reduce_on_plateau")
    params = {"w": jnp.ones(2)}
    tx = optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau(patience=patience, factor=0.5))
    state = tx.init(params)
    for epoch in range(3):
        for _ in range(updates):
            _, state = tx.update({"w": jnp.ones(2)}, state, params, value=jnp.asarray(1.0))
        callback.on_epoch_end(None, epoch, {"loss": 1.0})
        state = callback.apply(state)
    return state


def test_plateau_warns_once_when_a_chained_reduce_on_plateau_lowers_the_scale_itself(caplog):
    """Hostile finding: a chained reduce_on_plateau with its own small patience lowered the
    scale itself, the callback set it back each epoch end, and the run trained at 1/8 of the
    rate it reported, without a word."""
    callback = ReduceLROnPlateauCallback(monitor="loss", patience=100)
    _chained_plateau_epochs(callback, patience=1, updates=4)  # its own plateaus
    warnings = [r.getMessage() for r in caplog.records if "reduce_on_plateau's" in r.getMessage()]
    assert len(warnings) == 1
    assert "lowers it itself" in warnings[0]
    assert "not the 1 it was set to" in warnings[0]


def test_plateau_built_with_a_large_patience_is_not_warned_about(caplog):
    callback = ReduceLROnPlateauCallback(monitor="loss", patience=1, factor=0.5)
    state = _chained_plateau_epochs(callback, patience=10**9, updates=1)
    callback.on_train_end(None)
    assert float(state[1].scale) == 0.25
    assert caplog.records == []


def test_plateau_warns_once_of_a_lowered_scale_written_nowhere(caplog):
    """Hostile finding: with a trainer without ``.optimizer`` and no ``optimizer=``, the scale
    dropped but the learning rate did not, silently."""

    class Trainer:
        model = None

    callback = ReduceLROnPlateauCallback(monitor="loss", patience=1, factor=0.5)
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        for epoch in range(4):
            callback.on_epoch_end(Trainer(), epoch, {"loss": 1.0})
        callback.on_train_end(Trainer())
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "lowered its learning-rate scale to 0.5, but wrote it nowhere" in warnings[0]
    assert "pass optimizer=" in warnings[0]


def test_plateau_driven_through_apply_by_hand_is_not_warned_about(caplog):
    optax = pytest.importorskip("optax", reason="optax is needed for reduce_on_plateau")
    jnp = pytest.importorskip("jax.numpy", reason="jax is needed to build an optax state")
    state = optax.contrib.reduce_on_plateau(patience=10**9).init({"w": jnp.ones(2)})
    callback = ReduceLROnPlateauCallback(monitor="loss", patience=1, factor=0.5)
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        for epoch in range(4):
            callback.on_epoch_end(None, epoch, {"loss": 1.0})
            state = callback.apply(state)  # the documented way for a plain optax state
        callback.on_train_end(None)
    assert caplog.records == []
    assert float(state.scale) == 0.125


def test_progress_refuses_metrics_that_are_no_names_naming_them():
    # hostile finding: metrics=3 raised a bare "'int' object is not iterable"
    from rich.console import Console

    with pytest.raises(TypeError, match=r"metrics=3 \(int\) must be a metric name or names"):
        ProgressCallback(metrics=3, console=Console(file=io.StringIO()))
