"""What a TrainStep refuses of its objects and batches: replaced Variables, sown ones, no rows."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.spmd import EvalStep, PrecisionPolicy, StateChangedError, TrainStep


X = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)


class Two(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.up = nnx.Linear(4, 8, rngs=rngs)
        self.down = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.down(self.up(x))


def squares(model, batch):
    return jnp.mean(model(batch) ** 2)


def _tx():
    return optax.sgd(1e-2, momentum=0.9)  # an optimizer state to replace; compiles faster than Adam


def _step():
    model = Two(nnx.Rngs(0))
    step = TrainStep(model, nnx.Optimizer(model, _tx(), wrt=nnx.Param), squares)
    step(X)
    return step


# --- objects left stale by a step, read by another ------------------------------------------


@pytest.mark.parametrize("donate", [True, False])
def test_an_eval_step_or_a_second_train_step_over_stale_objects_is_refused(donate):
    """Hostile findings: without donation an EvalStep over the model read the parameters before
    training, silently; with it, and for a second TrainStep, jax's bare "Array has been deleted"."""
    model = Two(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, _tx(), wrt=nnx.Param)
    step = TrainStep(model, optimizer, squares, donate=donate)
    other = TrainStep(model, optimizer, squares, donate=donate)
    evaluate = EvalStep(model, lambda m, b: {"loss": squares(m, b)})
    step(X)
    with pytest.raises(StateChangedError, match="an EvalStep reads a model that a TrainStep"):
        evaluate(X)
    with pytest.raises(StateChangedError, match=r"a TrainStep reads a model .* sync"):
        other(X)
    step(X)  # the step itself goes on
    step.sync()  # from now on the objects hold every step's state
    step(X)
    assert float(evaluate(X)["loss"]) == pytest.approx(
        float(EvalStep(step, squares_metric)(X)["loss"])
    )
    other(X)  # it reads what the live step wrote into the objects


@pytest.mark.parametrize("donate", [True, False])
def test_a_train_step_built_over_objects_another_left_stale_is_refused(donate):
    """Hostile finding: with donation the constructor raised jax's bare "Array has been deleted"."""
    model = Two(nnx.Rngs(0))
    step = TrainStep(model, nnx.Optimizer(model, _tx(), wrt=nnx.Param), squares, donate=donate)
    step(X)
    with pytest.raises(StateChangedError, match=r"a TrainStep reads a model .* sync"):
        TrainStep(model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param), squares)
    TrainStep(step.model, nnx.Optimizer(step.model, optax.adam(1e-3), wrt=nnx.Param), squares)


@pytest.mark.parametrize("donate", [True, False])
def test_a_synced_steps_objects_trained_since_by_another_step_are_refused_by_its_accessors(donate):
    """Hostile finding: ``a.model`` handed back deleted arrays (donated) or, without donation,
    wrote its older state over what the other step had trained, silently."""
    model = Two(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, _tx(), wrt=nnx.Param)
    a = TrainStep(model, optimizer, squares, donate=donate)
    b = TrainStep(model, optimizer, squares, donate=donate)
    a(X)
    a.sync()
    b(X)
    for read in (lambda: a.model, lambda: a.optimizer, lambda: a.state, a.sync):
        with pytest.raises(StateChangedError, match=r"a TrainStep reads a model"):
            read()
    assert int(b.optimizer.step.get_value()) == 2  # b's state, written back by b


class Tempered(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(4, 2, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.temperature = 1.0

    def __call__(self, x):
        return self.drop(self.linear(x)) / self.temperature


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: m.eval(), r"model\.drop\.deterministic changed from False to True"),
        (
            lambda m: setattr(m, "temperature", 100.0),
            r"model\.temperature changed from 1\.0 to 100",
        ),
    ],
)
def test_a_plain_attribute_changed_after_the_step_was_built_is_refused(change, match):
    """Hostile finding: ``step.model.eval()`` left the step training in train mode (dropout on,
    batch statistics updated) and a new temperature unused, silently."""
    model = Tempered(nnx.Rngs(0))
    step = TrainStep(model, nnx.Optimizer(model, _tx(), wrt=nnx.Param), squares)
    step(X)
    step.model.temperature = 1.0  # set again, equal: nothing changed
    step(X)
    change(step.model)
    with pytest.raises(StateChangedError, match=match) as info:
        step(X)
    assert info.value.path.startswith("model.")


class Configured(nnx.Module):
    temperature = 1.0  # a class default, set on the instance later

    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(4, 2, rngs=rngs)
        self._scale = 1.0
        self.scales = [1.0, 2.0]
        self.clip = float("nan")

    def __call__(self, x):
        return self.linear(x) * self._scale * self.scales[0] / self.temperature


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: setattr(s.model, "temperature", 100.0), r"model\.temperature was set on"),
        (lambda s: setattr(s.model, "_scale", 10.0), r"model\._scale changed"),
        (lambda s: setattr(s.model, "scales", [10.0, 2.0]), r"model\.scales changed"),
        (lambda s: s.model.scales.__setitem__(0, 10.0), r"model\.scales changed"),
        (lambda s: setattr(s.optimizer, "tx", optax.sgd(0.0)), r"optimizer\.tx changed"),
    ],
)
def test_plain_data_changed_in_any_form_is_refused_at_the_next_call(change, match):
    """Second-pass findings: a class default shadowed, an underscore attribute, a list replaced
    or changed in place, and the optimizer's tx replaced all went unseen."""
    model = Configured(nnx.Rngs(0))
    step = TrainStep(model, nnx.Optimizer(model, _tx(), wrt=nnx.Param), squares)
    step(X)
    change(step)
    with pytest.raises(StateChangedError, match=match):
        step(X)


def test_equal_plain_values_set_again_and_a_flag_set_back_are_no_refusal():
    """Second-pass findings: NaN set again and 1 for 1.0 were refused; so was every read of
    step.model after step.model.eval(), so model.train() could not undo it."""
    model = Configured(nnx.Rngs(0))
    model.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(1))
    step = TrainStep(model, nnx.Optimizer(model, _tx(), wrt=nnx.Param), squares)
    step(X)
    step.model.clip = float("nan")
    step.model._scale = 1
    step.model.eval()
    assert step.model.drop.deterministic  # evaluating through step.model is allowed
    with pytest.raises(StateChangedError, match=r"set it back \(model\.train\(\) undoes"):
        step(X)
    step.model.train()
    step(X)


@pytest.mark.parametrize(
    "tx",
    [
        optax.lbfgs(),
        optax.polyak_sgd(),
        optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau(patience=10**9)),
    ],
    ids=["lbfgs", "polyak", "reduce_on_plateau"],
)
def test_an_optimizer_whose_update_needs_the_loss_is_refused_at_construction(tx):
    """Hostile findings: optax's own TypeError from inside the trace (missing 'value')."""
    model = Two(nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"needs arguments a train step does not pass.*'value"):
        TrainStep(model, nnx.Optimizer(model, tx, wrt=nnx.Param), squares)


def test_an_optimizer_with_state_named_value_and_grad_is_no_line_search():
    """Second-pass finding: state fields named value and grad were taken for a line search."""

    def scaled(value, grad):
        return optax.chain(optax.scale(-value), optax.scale(grad))

    model = Two(nnx.Rngs(0))
    tx = optax.inject_hyperparams(scaled)(value=0.1, grad=1.0)
    TrainStep(model, nnx.Optimizer(model, tx, wrt=nnx.Param), squares)(X)


def squares_metric(model, batch):
    return {"loss": squares(model, batch)}


# --- F1: a Variable or submodule replaced after construction --------------------------------


def test_a_replaced_variable_is_refused_by_name_at_the_next_call():
    """Hostile finding: the step went on training the old kernel, silently, and never wrote
    into the new Variable again."""
    step = _step()
    step.model.down.kernel = nnx.Param(jnp.zeros((8, 2)))
    with pytest.raises(
        StateChangedError, match=r"model\.down\.kernel was replaced.*down\.kernel\.set_value"
    ):
        step(X)


def test_a_replaced_submodule_is_refused_by_the_step_and_an_eval_step_over_it():
    step = _step()
    evaluate = EvalStep(step, lambda m, b: {"s": m(b) ** 2})
    step.model.down = nnx.Linear(8, 2, rngs=nnx.Rngs(5))
    with pytest.raises(StateChangedError, match=r"model\.down was replaced") as info:
        evaluate(X)
    assert info.value.path == "model.down"
    assert isinstance(info.value, ValueError)
    with pytest.raises(StateChangedError, match=r"model\.down was replaced"):
        step(X)


def test_a_reset_optimizer_state_is_refused_by_name():
    step = _step()
    optimizer = step.optimizer
    fresh = nnx.Optimizer(step.model, _tx(), wrt=nnx.Param)
    optimizer.opt_state = fresh.opt_state
    with pytest.raises(StateChangedError, match=r"optimizer\.opt_state was replaced"):
        step(X)


def test_a_variable_added_is_refused_at_the_next_call_and_by_sync():
    step = _step()
    step.model.extra = nnx.Param(jnp.ones(3))
    with pytest.raises(StateChangedError, match=r"model\.extra was added"):
        step(X)
    with pytest.raises(StateChangedError, match=r"model\.extra was added"):
        step.sync()


def test_a_plain_attribute_added_is_no_refusal():
    step = _step()
    step.model.note = "fine-tuned"
    step(X)
    step.sync()


def test_values_written_into_the_variables_are_still_taken():
    step = _step()
    step.model.down.kernel[...] = jnp.zeros((8, 2))
    nnx.update(step.model.up, nnx.state(Two(nnx.Rngs(3)).up))
    step(X)  # no refusal: the same Variables, new values
    assert step.model.down.kernel.get_value().shape == (8, 2)


# --- F2: sow without a pop -------------------------------------------------------------------


class Sows(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.a = nnx.Linear(4, 8, rngs=rngs)
        self.b = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        h = self.a(x)
        self.sow(nnx.Intermediate, "h", h.mean())
        return self.b(h)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("options", [{}, {"precision": PrecisionPolicy()}, {"accumulate_steps": 2}])
def test_an_intermediate_left_by_sow_is_named_with_the_fix(options):
    """Hostile finding: jax's out_shardings pytree error, or zip()'s length error."""
    model = Sows(nnx.Rngs(0))
    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), squares, **options)
    with pytest.raises(
        StateChangedError, match=r"model\.h appeared.*nnx\.pop\(model, nnx\.Intermediate\)"
    ):
        step(X)


# --- F4: a batch of no rows ------------------------------------------------------------------


def test_an_empty_batch_is_refused_naming_the_leaf_and_nothing_changes():
    """Hostile finding: the loss was NaN and the update applied, the step count went up."""
    model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
    step = TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param),
        lambda m, b: jnp.mean((m(b["x"]) - b["y"]) ** 2),
    )
    with pytest.raises(ValueError, match=r"batch leaf \['x'\] of shape \(0, 4\) has no rows"):
        step({"x": np.zeros((0, 4), np.float32), "y": np.zeros((0, 2), np.float32)})
    assert int(step.optimizer.step.get_value()) == 0
