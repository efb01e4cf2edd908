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
