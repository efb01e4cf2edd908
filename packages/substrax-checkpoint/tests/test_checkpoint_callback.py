import logging
import signal
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from substrax.checkpoint import (
    CheckpointCallback,
    CheckpointNotWrittenError,
    OrbaxCheckpointStore,
    PreemptionHandler,
)
from substrax.support import MissingExtraError


class Trainer:
    def __init__(self):
        self.model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))


HOOKS = (
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_batch_begin",
    "on_batch_end",
    "on_validation_begin",
    "on_validation_end",
)


def _run(callback, trainer, epochs, batches):
    callback.on_train_begin(trainer)
    for epoch in range(epochs):
        callback.on_epoch_begin(trainer, epoch)
        for batch in range(batches):
            callback.on_batch_begin(trainer, batch)
            callback.on_batch_end(trainer, batch, {"loss": 1.0 / (batch + 1)})
        callback.on_validation_begin(trainer)
        callback.on_validation_end(trainer, {"val_loss": 0.5})
        callback.on_epoch_end(trainer, epoch, {"val_loss": 1.0 / (epoch + 1), "note": "x"})
    callback.on_train_end(trainer)


def test_callback_has_every_hook():
    assert all(callable(getattr(CheckpointCallback, hook)) for hook in HOOKS)


def test_saves_every_n_epochs_with_monitored_metrics(store_dir):
    trainer = Trainer()
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(store, every_n_epochs=2, monitor=["val_loss"])
        _run(callback, trainer, epochs=4, batches=3)
        assert store.list_steps() == [6, 12]
        record = store.read_metadata(12)
        assert (record.epoch, record.metrics) == (3, {"val_loss": 0.25})
        restored = store.restore(12, templates={"model": nnx.state(trainer.model)})
        assert isinstance(restored.items["model"], nnx.State)


def test_saves_every_n_steps_and_resumes(store_dir):
    trainer = Trainer()
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(
            store,
            items=lambda t: {"model": nnx.state(t.model), "data_iterator": {"pos": 1}},
            every_n_epochs=None,
            every_n_steps=2,
        )
        _run(callback, trainer, epochs=1, batches=5)
        assert store.list_steps() == [2, 4]
        assert store.read_metadata(4).metrics == {"loss": 0.25}
        resumed = CheckpointCallback(store, every_n_epochs=1)
        _run(resumed, trainer, epochs=1, batches=1)
        assert store.list_steps() == [2, 4, 5]


def _items(_trainer):
    return {"model": {"w": np.zeros(2)}}


@pytest.mark.parametrize("epochs_again", [False, True])
def test_a_resumed_run_driven_by_epochs_alone_goes_on_saving(store_dir, caplog, epochs_again):
    # the resumed run's trainer counts its epochs on (3, 4, 5) or from 0 again
    for epochs in (range(3), range(3) if epochs_again else range(3, 6)):
        with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
            callback = CheckpointCallback(store, items=_items)
            callback.on_train_begin(None)
            for epoch in epochs:
                callback.on_epoch_end(None, epoch, {"val_loss": 1.0 / (epoch + 1)})
            callback.on_train_end(None)
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [0, 1, 2, 3, 4, 5]
        assert reader.read_metadata(5).epoch == (2 if epochs_again else 5)
    assert "skipped" not in caplog.text


def test_a_save_skipped_as_not_newer_is_warned_about(store_dir, caplog):
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(store, items=_items)
        callback.on_train_begin(None)
        callback.on_batch_end(None, 0, {"loss": 1.0})
        callback.on_epoch_end(None, 0, {"val_loss": 0.5})
        callback.on_epoch_end(None, 1, {"val_loss": 0.4})  # an epoch without a batch
        callback.on_train_end(None)
        assert store.list_steps() == [1]
    assert "the save of step 1 (epoch 1) is skipped: the store's latest step is 1" in caplog.text


def test_the_epoch_metrics_reach_a_step_that_every_n_steps_saved_at_the_epoch_end(
    store_dir, caplog
):
    with OrbaxCheckpointStore(
        store_dir, max_to_keep=2, keep_best=1, best_metric="val_loss"
    ) as store:
        callback = CheckpointCallback(
            store, items=_items, every_n_steps=10, monitor=["loss", "val_loss"]
        )
        callback.on_train_begin(None)
        for epoch, val_loss in enumerate([0.3, 0.1, 0.5, 0.6]):
            for batch in range(10):
                callback.on_batch_end(None, batch, {"loss": 5.0 - epoch})
            callback.on_epoch_end(None, epoch, {"val_loss": val_loss})
        callback.on_train_end(None)
        assert store.best_step("val_loss") == 20
        assert store.list_steps() == [20, 30, 40]  # the best kept beside the latest two
        record = store.read_metadata(20)
        assert (record.epoch, record.metrics) == (1, {"loss": 4.0, "val_loss": 0.1})
    # a spec review: "monitored key 'loss' is not in the logs of this epoch's end ... its save
    # records no value for it" was warned, though the save held the batch's loss
    assert "monitored key" not in caplog.text


def _holding(weights):
    """Items of a model whose one weight array is ``weights["w"]``, as it is at each save."""
    return lambda _trainer: {"model": dict(weights)}


def _first_fit(callback, weights):
    """Four steps, each step's weights its number; an epoch ends after step 2 (the best, as its
    val_loss is the only one), and the fit stops after step 4's every_n_steps=2 save."""
    callback.on_train_begin(None)
    for step in range(1, 5):
        weights["w"] = np.full(2, float(step))
        callback.on_batch_end(None, step, {"loss": 10.0 - step})
        if step == 2:
            callback.on_epoch_end(None, 0, {"val_loss": 1.0})
    callback.on_train_end(None)


def test_a_resume_from_an_older_step_than_the_latest_never_overwrites_the_latest(store_dir):
    """A second pass: restored from the best step (2), not the latest (4, saved at a step), the
    resumed epoch end overwrote step 4 with step 2's weights."""
    weights = {"w": np.zeros(2)}
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        _first_fit(CheckpointCallback(store, items=_holding(weights), every_n_steps=2), weights)
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        weights["w"] = np.asarray(store.restore(2).items["model"]["w"])
        resumed = CheckpointCallback(store, items=_holding(weights), every_n_steps=2)
        resumed.on_train_begin(None)
        resumed.on_epoch_end(None, 1, {"val_loss": 5.0})
        resumed.on_train_end(None)
        assert store.list_steps() == [2, 4, 5]
        np.testing.assert_array_equal(store.restore(4).items["model"]["w"], [4.0, 4.0])
        assert store.read_metadata(4).epoch is None


def test_a_callback_used_again_for_a_second_fit_never_overwrites_the_latest(store_dir, caplog):
    """A fourth pass: the first fit's last batch save (step 4) was still taken for the epoch end's
    own step, so the second fit's first epoch end wrote step 2's restored weights over step 4."""
    weights = {"w": np.zeros(2)}
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(store, items=_holding(weights), every_n_steps=2)
        _first_fit(callback, weights)
        weights["w"] = np.asarray(store.restore(2).items["model"]["w"])
        callback.on_train_begin(None)  # the second fit
        callback.on_epoch_end(None, 1, {"val_loss": 5.0})
        callback.on_train_end(None)
        assert store.list_steps() == [2, 4]  # no optimizer step counted since 4: skipped
        np.testing.assert_array_equal(store.restore(4).items["model"]["w"], [4.0, 4.0])
    assert "the save of step 4 (epoch 1) is skipped" in caplog.text


def test_an_epoch_driven_resume_from_a_step_saved_checkpoint_never_overwrites_it(store_dir):
    """A trainer driven by epochs alone trains before its epoch end: the state is no longer the
    restored step's, which stays as it was (the resumed epoch end saves the next step)."""
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(4, _items(None), metrics={"loss": 1.0})  # a preemption's save: no epoch
        resumed = CheckpointCallback(store, items=_items, monitor=["val_loss"])
        resumed.on_train_begin(None)
        resumed.on_epoch_end(None, 0, {"val_loss": 0.5})
        resumed.on_train_end(None)
        assert store.list_steps() == [4, 5]
        assert (store.read_metadata(4).epoch, store.read_metadata(4).metrics) == (
            None,
            {"loss": 1.0},
        )


def test_callback_validation(store_dir):
    with pytest.raises(ValueError, match="every_n_steps"):
        CheckpointCallback(OrbaxCheckpointStore(store_dir), every_n_steps=0)
    assert np.isfinite(1.0)


def test_saving_the_model_without_flax_names_the_extra(store_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "flax.nnx", None)  # flax.nnx cannot be imported
    with OrbaxCheckpointStore(store_dir) as store:
        callback = CheckpointCallback(store)
        with pytest.raises(MissingExtraError, match=r"substrax-runtime\[nnx\]") as error:
            callback.on_epoch_end(Trainer(), 0, {"loss": 1.0})
        assert "pass items=" in str(error.value)
        assert store.list_steps() == []


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_logged_metric_costs_no_checkpoint(store_dir, value):
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(
            store, items=lambda _: {"model": {"w": np.zeros(2)}}, every_n_steps=1
        )
        callback.on_train_begin(None)
        callback.on_batch_end(None, 0, {"loss": 0.5})
        callback.on_batch_end(None, 1, {"loss": value, "acc": 0.75})  # a diverged step
        callback.on_train_end(None)
        assert store.list_steps() == [1, 2]
        record = store.read_metadata(2)
        assert record.metrics == {"acc": 0.75}
        assert [*record.nonfinite_metrics] == ["loss"]
        assert store.best_step("loss") == 1


@pytest.mark.parametrize("stacked", ["numpy", "jax"])
def test_steps_per_call_counts_optimizer_steps_and_takes_the_last_stacked_loss(store_dir, stacked):
    # TrainStep(steps_per_call=4): one on_batch_end per call of 4 optimizer steps, its loss
    # stacked (one value per optimizer step)
    make = np.asarray if stacked == "numpy" else jnp.asarray
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(
            store,
            items=lambda _: {"model": {"w": np.zeros(2)}},
            every_n_epochs=1,
            every_n_steps=6,
            steps_per_call=4,
        )
        callback.on_train_begin(None)
        for call in range(6):
            losses = make([10.0 * call + i for i in range(4)], dtype=np.float32)
            callback.on_batch_end(None, call, {"loss": losses})
        assert callback.steps == 24
        callback.on_epoch_end(None, 0, {"loss": make([1.0, 2.0, 3.0, 0.5], dtype=np.float32)})
        callback.on_train_end(None)
        # a save at the first call that reaches each multiple of 6 optimizer steps: 8, 12, 20, 24
        assert store.list_steps() == [8, 12, 20, 24]
        assert store.read_metadata(8).metrics == {"loss": 13.0}  # the last of call 1's losses
        assert store.read_metadata(20).metrics == {"loss": 43.0}
        # the epoch ends at step 24, which its last call saved: saved again with the epoch's loss
        record = store.read_metadata(24)
        assert (record.epoch, record.metrics) == (0, {"loss": 0.5})
        assert store.best_step("loss") == 24


def test_steps_per_call_is_validated(store_dir):
    with (
        OrbaxCheckpointStore(store_dir) as store,
        pytest.raises(ValueError, match="steps_per_call=0 must be an integer >= 1"),
    ):
        CheckpointCallback(store, steps_per_call=0)


class _Watched:
    """A store that notes each save in ``events`` (and otherwise is the store it wraps)."""

    def __init__(self, store, events):
        self._store = store
        self._events = events

    def save(self, step, items, **options):
        self._events.append(("save", step))
        return self._store.save(step, items, **options)

    def __getattr__(self, name):
        return getattr(self._store, name)


class _Logger:
    """A logger as the callback sees one: something with a flush()."""

    def __init__(self, events, name, fails=False):
        self._events = events
        self._name = name
        self._fails = fails

    def flush(self):
        self._events.append(("flush", self._name))
        if self._fails:
            raise OSError(28, "No space left on device")


def test_the_loggers_are_flushed_before_each_save(store_dir, caplog):
    events = []
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(
            _Watched(store, events),
            items=lambda _trainer: {"model": {"w": np.zeros(2)}},
            every_n_epochs=1,
            every_n_steps=2,
            flush=[_Logger(events, "files"), _Logger(events, "mlflow", fails=True)],
        )
        _run(callback, None, epochs=1, batches=5)
        assert store.list_steps() == [2, 4, 5]  # a flush that fails costs no checkpoint
    flushed = [("flush", "files"), ("flush", "mlflow")]
    assert events == [*flushed, ("save", 2), *flushed, ("save", 4), *flushed, ("save", 5)]
    assert "could not flush before the save of step 2" in caplog.text


def test_one_logger_is_taken_as_flush_and_what_cannot_flush_is_refused(store_dir):
    events = []
    with OrbaxCheckpointStore(store_dir) as store:
        callback = CheckpointCallback(
            store,
            items=lambda _trainer: {"model": {"w": np.zeros(2)}},
            flush=_Logger(events, "one"),
        )
        callback.on_epoch_end(None, 0, {})
        assert events == [("flush", "one")]
        with pytest.raises(TypeError, match="flush="):
            CheckpointCallback(store, flush=[object()])
        with pytest.raises(TypeError, match="flush="):
            CheckpointCallback(store, flush=3)


# --- PreemptionHandler(flush=...): the run's loggers are flushed before the preemption save


@pytest.mark.parametrize("fails", [False, True])
def test_the_preemption_save_flushes_the_loggers_first(store_dir, fails):
    events = []
    store = OrbaxCheckpointStore(store_dir)
    items = lambda: {"model": {"w": np.zeros(2)}}  # noqa: E731
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with PreemptionHandler(
            _Watched(store, events), flush=[_Logger(events, "logger", fails=fails)]
        ) as preemption:
            preemption.check(0, items)
            assert events == []  # no signal yet: nothing is flushed at a step boundary
            signal.raise_signal(signal.SIGTERM)
            with pytest.raises(SystemExit):
                preemption.check(1, items)
    finally:
        signal.signal(signal.SIGTERM, previous)  # after a save it keeps absorbing signals
    assert events == [("flush", "logger"), ("save", 1)]  # a flush that fails costs no checkpoint
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1]


def test_what_cannot_flush_is_refused_at_construction(store_dir):
    with OrbaxCheckpointStore(store_dir) as store, pytest.raises(TypeError, match="flush="):
        PreemptionHandler(store, flush=["not a logger"])


def _preempted_at(store_dir, step):
    """``check(step)`` after a SIGTERM, under a handler on the store at ``store_dir``."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with PreemptionHandler(OrbaxCheckpointStore(store_dir)) as preemption:
            signal.raise_signal(signal.SIGTERM)
            preemption.check(step, lambda: {"model": {"w": np.full(2, 42.0)}})
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_metric_past_floats_range_costs_the_preemption_save_nothing(store_dir):
    """Hostile finding: check(..., metrics={"loss": 10**400}) raised OverflowError: no save."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with PreemptionHandler(OrbaxCheckpointStore(store_dir)) as preemption:
            signal.raise_signal(signal.SIGTERM)
            with pytest.raises(SystemExit) as stopped:
                preemption.check(
                    3, lambda: {"model": {"w": np.zeros(2)}}, metrics={"loss": 10**400, "ok": 0.5}
                )
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 0
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [3]
        assert reader.read_metadata(3).metrics == {"ok": 0.5}


def test_a_signal_after_the_last_check_exits_on_leaving_the_block(store_dir, caplog):
    """Hostile finding: a SIGTERM in the loop's end (after the last check) was dropped silently,
    and the process went on as if no scheduler had asked it to stop."""

    def signalled_late(error: Exception | None) -> None:
        with OrbaxCheckpointStore(store_dir) as store, PreemptionHandler(store) as preemption:
            preemption.check(1, lambda: {"model": {"w": np.zeros(2)}})
            signal.raise_signal(signal.SIGTERM)
            if error is not None:
                raise error

    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as stopped:
            signalled_late(None)
        assert stopped.value.code == 0
        assert "told to stop after the last check()" in caplog.text
        with pytest.raises(KeyError):  # the block's own error is not replaced by SystemExit
            signalled_late(KeyError("the block's own error"))
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_preemption_below_the_latest_step_raises_and_never_exits_as_saved(store_dir):
    # a loop that counts from 0 again after a resume: its state cannot be saved as step 3
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1000, {"model": {"w": np.zeros(2)}})
    with pytest.raises(CheckpointNotWrittenError) as refused:
        _preempted_at(store_dir, 3)
    assert (refused.value.step, refused.value.latest_step) == (3, 1000)
    assert refused.value.reason == "below_latest"
    assert "its state is NOT saved, so it does not exit 0" in "".join(refused.value.__notes__)
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1000]


def test_a_preemption_at_the_latest_step_saves_it_again_keeping_its_record(store_dir):
    """Hostile finding: the step was not saved again, so what changed after its save (an epoch
    end's learning-rate cut, a callback's counters) was lost, and the resumed run diverged."""
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(5, {"model": {"w": np.zeros(2)}}, epoch=1, metrics={"val_loss": 0.5})
    with pytest.raises(SystemExit) as stopped:
        _preempted_at(store_dir, 5)
    assert stopped.value.code == 0
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [5]
        record = reader.read_metadata(5)
        assert (record.epoch, record.metrics, record.extra) == (
            1,
            {"val_loss": 0.5},
            {"preempted": True},
        )
        np.testing.assert_array_equal(reader.restore(5).items["model"]["w"], [42.0, 42.0])


def test_a_preemption_saving_the_latest_step_without_some_of_its_items_warns(store_dir, caplog):
    """A fifth pass: a preemption at the step a CheckpointCallback had just saved (with the
    optimizer) saved it again with the model alone, and exited 0 without a word."""
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(5, {"model": {"w": np.zeros(2)}, "optimizer": {"mu": np.zeros(2)}})
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit):
        _preempted_at(store_dir, 5)
    assert "step 5 is saved again without the items ['optimizer']" in caplog.text


def test_a_second_fit_s_epoch_end_before_any_batch_is_labelled_by_the_steps_counted(
    store_dir, caplog
):
    """A fifth pass: a callback used again for a second fit labelled its first epoch end by the
    epoch number (step 10 holding 6 optimizer steps); no step was counted since step 6."""
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(store, items=_items, every_n_steps=4)
        callback.on_train_begin(None)
        for epoch in range(2):
            for batch in range(3):
                callback.on_batch_end(None, batch, {"loss": 1.0})
            callback.on_epoch_end(None, epoch, {"val_loss": 1.0})
        callback.on_train_begin(None)  # the second fit
        callback.on_epoch_end(None, 10, {"val_loss": 0.9})
        for batch in range(6):
            callback.on_batch_end(None, batch, {"loss": 1.0})
        callback.on_train_end(None)
        assert store.list_steps() == [3, 4, 6, 8, 12]
    assert "the save of step 6 (epoch 10) is skipped" in caplog.text


def test_items_that_are_not_a_function_are_refused_at_the_first_step_not_at_the_preemption(
    store_dir,
):
    with OrbaxCheckpointStore(store_dir) as store, PreemptionHandler(store) as preemption:
        with pytest.raises(TypeError, match=r"items must be a function .* not dict"):
            preemption.check(0, {"model": {"w": np.zeros(2)}})  # no preemption yet
        preemption.check(0, lambda: {"model": {"w": np.zeros(2)}})


def test_monitor_takes_one_key_as_a_string_and_warns_of_a_key_an_epoch_end_lacks(store_dir, caplog):
    """Hostile finding: ``monitor="val_loss"`` was split into its letters and recorded nothing,
    and a misspelt key recorded nothing without a word."""
    items = lambda _trainer: {"model": {"w": np.zeros(2)}}  # noqa: E731
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        CheckpointCallback(store, items=items, monitor="val_loss").on_epoch_end(
            None, 0, {"val_loss": 0.5, "acc": 0.9}
        )
        misspelt = CheckpointCallback(store, items=items, monitor=["val_los"], every_n_steps=1)
        misspelt.on_batch_end(None, 0, {"loss": 1.0})  # a step's logs: no warning
        assert "val_los" not in caplog.text
        for epoch in (1, 2):
            misspelt.on_epoch_end(None, epoch, {"val_loss": 0.4})
        store.wait()
        assert store.read_metadata(0).metrics == {"val_loss": 0.5}
        assert store.read_metadata(store.latest_step()).metrics == {}
    assert caplog.text.count("monitored key 'val_los' is not in the logs") == 1
    with pytest.raises(TypeError, match=r"monitor=.* must be a log key or keys"):
        CheckpointCallback(store, monitor=["val_loss", 3])
