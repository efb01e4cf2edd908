import pytest

from substrax.callbacks import (
    BaseCallback,
    CallbackList,
    CallbackStateMismatchError,
    EarlyStopping,
    EarlyStoppingCallback,
    EarlyStoppingConfig,
    TrainerLike,
    TrainingCallback,
    is_checkpointable,
)


HOOKS = [
    ("on_train_begin", ()),
    ("on_train_end", ()),
    ("on_epoch_begin", (1,)),
    ("on_epoch_end", (1, {"loss": 1.0})),
    ("on_batch_begin", (2,)),
    ("on_batch_end", (2, {"loss": 1.0})),
    ("on_validation_begin", ()),
    ("on_validation_end", ({"val_loss": 1.0},)),
]


class Recorder(BaseCallback):
    def __init__(self, name, calls):
        self.name = name
        self.calls = calls

    def __getattribute__(self, attr):
        if attr.startswith("on_"):
            calls, name = (
                object.__getattribute__(self, "calls"),
                object.__getattribute__(self, "name"),
            )
            return lambda *args: calls.append((name, attr, args))
        return object.__getattribute__(self, attr)


class Counter(BaseCallback):
    def __init__(self):
        self.count = 0

    def get_state(self):
        return {"count": self.count}

    def set_state(self, state, /):
        self.count = state["count"]


def test_base_callback_is_a_training_callback_with_noop_hooks():
    callback = BaseCallback()
    assert isinstance(callback, TrainingCallback)
    for hook, args in HOOKS:
        assert getattr(callback, hook)(object(), *args) is None
    assert not hasattr(callback, "__dict__")


def test_an_object_missing_a_hook_is_not_a_training_callback():
    class Partial:
        def on_train_begin(self, trainer, /):
            pass

    assert not isinstance(Partial(), TrainingCallback)


def test_hook_parameters_are_positional_only():
    with pytest.raises(TypeError):
        BaseCallback().on_epoch_end(trainer=None, epoch=0, logs={})  # type: ignore[call-arg]


def test_trainer_like_needs_a_model():
    class Trainer:
        model = "m"

    assert isinstance(Trainer(), TrainerLike)
    assert not isinstance(object(), TrainerLike)


@pytest.mark.parametrize(("hook", "args"), HOOKS)
def test_callback_list_dispatches_every_hook_in_order(hook, args):
    calls = []
    callbacks = CallbackList([Recorder("a", calls), Recorder("b", calls)])
    trainer = object()
    getattr(callbacks, hook)(trainer, *args)
    assert calls == [("a", hook, (trainer, *args)), ("b", hook, (trainer, *args))]


def test_callback_list_add_remove_len_iter():
    first, second = BaseCallback(), BaseCallback()
    callbacks = CallbackList()
    assert len(callbacks) == 0
    callbacks.add(first)
    callbacks.add(second)
    assert list(callbacks) == [first, second]
    callbacks.remove(first)
    assert list(callbacks) == [second]
    with pytest.raises(ValueError, match="not in this CallbackList"):
        callbacks.remove(first)


def test_callback_list_state_round_trip_keyed_by_position():
    counter, stopper = (
        Counter(),
        EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=2)),
    )
    callbacks = CallbackList([BaseCallback(), counter, stopper])
    counter.count = 7
    stopper.on_epoch_end(None, 0, {"loss": 1.0})
    stopper.on_epoch_end(None, 1, {"loss": 2.0})
    state = callbacks.get_state()
    assert set(state) == {"1", "2"}
    assert is_checkpointable(counter)
    assert not is_checkpointable(BaseCallback())

    fresh_counter = Counter()
    fresh_stopper = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=2))
    CallbackList([BaseCallback(), fresh_counter, fresh_stopper]).set_state(state)
    assert fresh_counter.count == 7
    assert fresh_stopper.wait_count == 1
    assert fresh_stopper.best_score == 1.0


def test_callback_list_refuses_state_saved_for_other_positions():
    state = CallbackList([Counter()]).get_state()
    with pytest.raises(CallbackStateMismatchError) as info:
        CallbackList([BaseCallback(), Counter()]).set_state(state)
    assert info.value.expected == ("1",)
    assert info.value.found == ("0",)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad", [None, "01", [{"count": 1}]])
def test_callback_list_refuses_a_state_that_is_not_a_mapping_naming_it(bad):
    wanted = r"state must be a dict from CallbackList.get_state\(\)"
    with pytest.raises(TypeError, match=rf"{wanted}, not {type(bad).__name__}"):
        CallbackList([BaseCallback(), Counter()]).set_state(bad)


def test_plain_early_stopping_is_checkpointable():
    assert is_checkpointable(EarlyStopping(patience=1))


def test_a_raising_callback_is_named_and_train_end_still_reaches_every_callback():
    """Hostile finding: the first callback that raised ended the hook for the rest (a profiler
    kept tracing, a progress bar stayed open) and the error did not say which callback raised."""
    calls = []

    class Raising(BaseCallback):
        def __init__(self, message):
            self.message = message

        def __repr__(self):
            return f"Raising({self.message!r})"

        def on_batch_end(self, _trainer, _batch, _logs, /):
            raise RuntimeError(self.message)

        def on_train_end(self, _trainer, /):
            raise RuntimeError(self.message)

    callbacks = CallbackList([Raising("first"), Recorder("a", calls), Raising("second")])
    with pytest.raises(RuntimeError, match="first") as raised:
        callbacks.on_batch_end(None, 3, {"loss": 1.0})
    assert raised.value.__notes__ == [
        "in Raising('first').on_batch_end (callback 0 of this CallbackList)"
    ]
    assert calls == []  # a step's hook ends at its first error
    with pytest.raises(RuntimeError, match="first") as raised:
        callbacks.on_train_end(None)
    assert calls == [("a", "on_train_end", (None,))]  # the end of training reaches every callback
    assert raised.value.__notes__ == [
        "in Raising('first').on_train_end (callback 0 of this CallbackList)",
        "in Raising('second').on_train_end (callback 2 of this CallbackList), after it, also: "
        "RuntimeError: second",
    ]


@pytest.mark.parametrize("bad", [None, "callback", 5])
def test_something_that_is_not_a_callback_is_refused_naming_it(bad):
    with pytest.raises(TypeError, match="CallbackList takes callbacks with every"):
        CallbackList().add(bad)
    with pytest.raises(TypeError, match=repr(bad)[:8]):
        CallbackList([bad])
    assert len(CallbackList([])) == 0


class _MemoryStore:
    """A checkpoint store in a dict, enough for ``CheckpointCallback``."""

    def __init__(self) -> None:
        self.saved: dict[int, dict] = {}

    def save(self, step, items, **_labels):  # epoch=, metrics=, overwrite=
        self.saved[step] = items

    def latest_step(self):
        return max(self.saved, default=None)


def _checkpointed_run(order, losses, store, *, restore_from=None):
    """Epochs of ``losses`` with an early stopper saving its state: (stopped epoch, best)."""
    checkpoint_callback = pytest.importorskip("substrax.checkpoint").CheckpointCallback
    stopper = EarlyStoppingCallback(EarlyStoppingConfig(monitor="val_loss", patience=2))
    holder = {}
    saver = checkpoint_callback(
        store, items=lambda _trainer: {"extensions": holder["list"].get_state()}
    )
    holder["list"] = callbacks = CallbackList(
        [saver, stopper] if order == "before" else [stopper, saver]
    )
    start = 0
    if restore_from is not None:
        callbacks.set_state(store.saved[restore_from]["extensions"])
        start = restore_from + 1
    callbacks.on_train_begin(None)
    for epoch in range(start, len(losses)):
        callbacks.on_epoch_end(None, epoch, {"val_loss": losses[epoch]})
        if stopper.should_stop:
            return epoch, stopper.best_score
    return None, stopper.best_score


def test_a_checkpoint_saved_after_the_callbacks_with_state_resumes_as_the_run_goes(caplog):
    """Hostile finding: with the CheckpointCallback ahead of EarlyStoppingCallback, a save held
    the state before that epoch's value: a run resumed from it lost its best (0.6, not 0.5).
    Put after them, a resumed run goes as the uninterrupted one."""
    losses = [0.6, 0.5, 0.7, 0.8, 0.9, 1.0]
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        uninterrupted = _checkpointed_run("after", losses, _MemoryStore())
        store = _MemoryStore()
        _checkpointed_run("after", losses[:2], store)  # preempted after epoch 1's save
        assert (
            _checkpointed_run("after", losses, store, restore_from=1) == uninterrupted == (3, 0.5)
        )
    assert caplog.records == []
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        store = _MemoryStore()
        _checkpointed_run("before", losses[:2], store)
        assert _checkpointed_run("before", losses, store, restore_from=1) == (3, 0.6)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2  # once a list: the first run's and the resumed one's
    for warning in warnings:
        assert "get_state() was called from callback 0's on_epoch_end" in warning
        assert "before callbacks 1, which have state, ran that hook" in warning
        assert "put the saving callback after the callbacks with state" in warning


def test_a_checkpoint_before_callbacks_with_state_that_saves_only_the_model_is_not_warned_about(
    caplog,
):
    """Second-pass finding: the list warned of the order whatever the saver saved."""
    checkpoint_callback = pytest.importorskip("substrax.checkpoint").CheckpointCallback
    store = _MemoryStore()
    saver = checkpoint_callback(store, items=lambda _trainer: {"model": {"w": 1.0}})
    stopper = EarlyStoppingCallback(EarlyStoppingConfig(monitor="val_loss", patience=2))
    callbacks = CallbackList([saver, stopper])
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        callbacks.on_train_begin(None)
        for epoch in range(3):
            callbacks.on_epoch_end(None, epoch, {"val_loss": 1.0})
        callbacks.get_state()  # between hooks: nothing is half-updated
    assert caplog.records == []
