"""switch_at: the running optimizer's learning rate, and line-search values only from it."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.optim import (
    LearningRateNotFoundError,
    LineSearchStateError,
    current_learning_rate,
    switch_at,
    update_with_line_search,
    with_strong_state_types,
)


X = jnp.asarray(np.random.default_rng(0).normal(size=(16, 3)), jnp.float32)
Y = X @ jnp.array([[1.0], [-2.0], [0.5]])


def _loss(model):
    return ((model(X) - Y) ** 2).mean()


def _rates(tx, updates, *, jit=False):
    """The learning rate before any update and after each; ``jit``: the updates in one program.

    Eager, every update compiles its ``lax.cond`` anew: the tests that read rates through a
    switch, not eager execution itself, run under ``jit``.
    """
    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    loss = lambda m: (m(jnp.ones((1, 2))) ** 2).sum()  # noqa: E731

    def step(model, optimizer):
        optimizer.update(model, nnx.grad(loss)(model))
        return current_learning_rate(optimizer)

    run = nnx.jit(step) if jit else step
    before = float(current_learning_rate(optimizer))
    return before, [round(float(run(model, optimizer)), 6) for _ in range(updates)]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_current_learning_rate_is_the_running_optimizers_after_the_switch(jit):
    first = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
    second = optax.inject_hyperparams(optax.sgd)(learning_rate=0.5)
    before, rates = _rates(switch_at(first, second, step=2), 4, jit=jit)
    assert before == pytest.approx(1e-3)
    assert rates == [0.001, 0.001, 0.5, 0.5]


def test_a_switch_inside_a_chain_is_refused_not_read_as_its_first_rate():
    # a hostile finding: optax.chain(clip, switch_at(...)) read the first optimizer's rate
    # (0.1) after the switch, where the second's (0.5) ran
    first = optax.inject_hyperparams(optax.adam)(learning_rate=0.1)
    second = optax.inject_hyperparams(optax.sgd)(learning_rate=0.5)
    chained = optax.chain(optax.clip_by_global_norm(1.0), switch_at(first, second, step=2))
    with pytest.raises(ValueError, match=r"switch_at\(optax.chain\(clip, first\)"):
        _rates(chained, 3, jit=True)
    # written as the message says, the rate is the running optimizer's
    clip = optax.clip_by_global_norm(1.0)
    top = switch_at(optax.chain(clip, first), optax.chain(clip, second), step=2)
    assert _rates(top, 3, jit=True)[1] == [0.1, 0.1, 0.5]


def test_current_learning_rate_follows_nested_switches_and_schedules():
    inner = switch_at(
        optax.inject_hyperparams(optax.sgd)(learning_rate=0.1),
        optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(0.4, 0.0, 4)),
        step=1,
    )
    tx = switch_at(inner, optax.inject_hyperparams(optax.sgd)(learning_rate=0.7), step=3)
    # inner's first for update 0, its second (steps 0, 1 of its schedule) for 1 and 2, then 0.7
    assert _rates(tx, 5, jit=True)[1] == [0.1, 0.4, 0.3, 0.7, 0.7]


def test_a_switch_into_an_optimizer_without_a_learning_rate_is_named():
    tx = switch_at(optax.inject_hyperparams(optax.sgd)(learning_rate=0.1), optax.sgd(0.2), step=1)
    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    assert float(current_learning_rate(optimizer)) == pytest.approx(0.1)
    optimizer.update(model, nnx.grad(lambda m: m(jnp.ones((1, 2))).sum())(model))
    assert float(current_learning_rate(optimizer)) == pytest.approx(0.1)
    optimizer.update(model, nnx.grad(lambda m: m(jnp.ones((1, 2))).sum())(model))
    with pytest.raises(LearningRateNotFoundError, match="the state of the optimizer switch_at ran"):
        current_learning_rate(optimizer)


def _losses(make, *objective_changed, steps=6):
    """Train one model per ``objective_changed`` value on the same batch, in one compiled step.

    Returns, per value, the losses the steps returned and the losses after each step.
    """
    models = [nnx.Linear(3, 1, rngs=nnx.Rngs(0)) for _ in objective_changed]
    optimizers = [nnx.Optimizer(model, make(), wrt=nnx.Param) for model in models]

    @nnx.jit
    def step(models, optimizers):
        return [
            update_with_line_search(model, optimizer, _loss, objective_changed=changed)
            for model, optimizer, changed in zip(models, optimizers, objective_changed, strict=True)
        ]

    runs = [([], []) for _ in objective_changed]
    for _ in range(steps):
        for (returned, after), loss, model in zip(
            runs, step(models, optimizers), models, strict=True
        ):
            returned.append(float(loss))
            after.append(float(_loss(model)))
    return runs


@pytest.mark.parametrize(
    "make",
    [
        lambda: switch_at(optax.lbfgs(), optax.sgd(0.05), step=2),
        lambda: switch_at(optax.adam(1e-2), optax.lbfgs(), step=2),
        lambda: switch_at(optax.lbfgs(), optax.lbfgs(memory_size=3), step=2),
        lambda: switch_at(switch_at(optax.lbfgs(), optax.sgd(0.05), step=2), optax.lbfgs(), step=4),
    ],
    ids=["lbfgs-sgd", "adam-lbfgs", "lbfgs-lbfgs", "nested"],
)
def test_a_stored_gradient_is_reused_only_while_its_line_search_runs(make):
    # same batch each step: reusing the stored value must change nothing but the cost (both
    # runs, on models of their own, are compiled as one program: one compilation, not two)
    (reused, reused_after), (fresh, fresh_after) = _losses(make, False, True)
    np.testing.assert_allclose(reused, fresh, rtol=1e-5)
    np.testing.assert_allclose(reused_after, fresh_after, rtol=1e-5)
    # the returned loss is the loss before each update: never a frozen one
    np.testing.assert_allclose(reused[1:], reused_after[:-1], rtol=1e-5)


def test_a_line_search_under_a_foreign_condition_is_never_reused():
    # an optax.conditionally_transform this package did not build: whether it runs is unknown
    def make():
        return with_strong_state_types(
            optax.chain(
                optax.conditionally_transform(optax.lbfgs(), lambda step: step < 2),
                optax.conditionally_transform(optax.sgd(0.05), lambda step: step >= 2),
            )
        )

    [(returned, after)] = _losses(make, False)
    np.testing.assert_allclose(returned[1:], after[:-1], rtol=1e-5)


def test_several_line_searches_outside_switch_at_are_refused_by_name():
    tx = with_strong_state_types(optax.chain(optax.lbfgs(), optax.lbfgs(memory_size=3)))
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    with pytest.raises(LineSearchStateError, match=r"several places.*switch_at") as info:
        update_with_line_search(model, optimizer, _loss, objective_changed=False)
    assert len(info.value.paths) == 4
    assert len(str(info.value)) < 600  # names the paths, not the whole state


@pytest.mark.parametrize(
    ("first", "second", "name"),
    [(optax.adam(1e-3), "sgd", "second"), (lambda g: g, optax.sgd(0.1), "first")],
)
def test_switch_at_refuses_what_is_not_a_transformation(first, second, name):
    with pytest.raises(TypeError, match=rf"^{name} must be an optax transformation"):
        switch_at(first, second, step=2)
