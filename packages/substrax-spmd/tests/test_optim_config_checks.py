"""Configs and models an optimizer cannot run well on are refused up front, by name."""

import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from substrax.optim import (
    EXCLUDE_BIAS_AND_NORM_SCALE,
    OptimizerConfig,
    OptimizerConfigError,
    create_optimizer,
    create_transformation,
)


@pytest.mark.parametrize(
    ("schedule", "match"),
    [
        (optax.constant_schedule(-0.1), "returned -0.1 for step 0"),
        (optax.linear_schedule(0.1, -0.1, transition_steps=10), r"returned .*-0\.1.* for step 10"),
        (lambda step: 0.1 / (1 - step) * (1 - step), r"returned .*nan.* for step 1\b"),
        (optax.exponential_decay(0.1, 1000, 10.0), r"returned .*inf.* for step 100000\b"),
    ],
    ids=["negative", "negative later", "nan at step 1", "overflows"],
)
def test_a_schedule_going_negative_or_non_finite_at_a_checked_step_is_refused(schedule, match):
    with pytest.raises(OptimizerConfigError, match=match) as info:
        OptimizerConfig(optimizer_type="sgd", learning_rate=schedule)
    assert info.value.field == "learning_rate"
    assert "finite number >= 0" in str(info.value)


def test_a_schedule_branching_in_python_is_refused_with_the_jnp_where_advice():
    with pytest.raises(OptimizerConfigError, match=r"traced step.*jnp\.where") as info:
        OptimizerConfig(learning_rate=lambda step: 0.1 if step < 100 else 0.01)
    assert "TracerBoolConversionError" in str(info.value)
    assert info.value.field == "learning_rate"


def test_the_jnp_where_form_of_that_schedule_runs_under_jit():
    schedule = lambda step: jnp.where(step < 1, 0.1, 0.01)  # noqa: E731
    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    optimizer = create_optimizer(
        model, OptimizerConfig(optimizer_type="sgd", learning_rate=schedule)
    )

    @nnx.jit
    def step(model, optimizer):
        optimizer.update(model, nnx.grad(lambda m: m(jnp.ones((1, 2))).sum())(model))

    step(model, optimizer)
    step(model, optimizer)
    assert float(optimizer.opt_state.hyperparams["learning_rate"].get_value()) == pytest.approx(
        0.01
    )


@pytest.mark.parametrize("momentum", [1.0, 1.5])
def test_momentum_of_one_or_more_is_refused(momentum):
    with pytest.raises(OptimizerConfigError, match=rf"momentum={momentum} .*< 1") as info:
        OptimizerConfig(optimizer_type="sgd", learning_rate=0.1, momentum=momentum)
    assert info.value.field == "momentum"
    OptimizerConfig(optimizer_type="rmsprop", learning_rate=0.1, momentum=0.0)


@pytest.mark.parametrize("kind", ["adam", "adamw", "lamb", "radam", "nadam", "rmsprop"])
def test_zero_eps_is_refused_where_the_optimizer_divides_by_it(kind):
    with pytest.raises(OptimizerConfigError, match=rf"eps=0.0 must be .*> 0 for {kind}.*NaN"):
        OptimizerConfig(optimizer_type=kind, learning_rate=0.1, eps=0.0)


def test_zero_eps_is_kept_where_it_is_safe():
    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    optimizer = create_optimizer(
        model, OptimizerConfig(optimizer_type="adagrad", learning_rate=0.1, eps=0.0)
    )
    zero = nnx.grad(lambda m: 0.0 * m(jnp.ones((1, 2))).sum())(model)
    optimizer.update(model, zero)
    assert bool(jnp.isfinite(model.kernel.get_value()).all())


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("rmsprop", "b2", 0.5),  # was silently optax's decay of 0.9
        ("rmsprop", "b1", 0.5),
        ("sgd", "b1", 0.5),
        ("sgd", "b2", 0.5),
        ("sgd", "eps", 0.5),
        ("adagrad", "b2", 0.5),
    ],
)
def test_a_moment_field_the_optimizer_would_ignore_is_refused(kind, field, value):
    with pytest.raises(OptimizerConfigError, match=rf"{field}={value} is for .*{kind!r} does not"):
        OptimizerConfig(optimizer_type=kind, learning_rate=0.1, **{field: value})
    OptimizerConfig(optimizer_type="adam", learning_rate=0.1, **{field: value})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"optimizer_type": "adam"}, r"'adam' with weight_decay=0.0 decays no parameter"),
        ({"optimizer_type": "sgd"}, r"'sgd' with weight_decay=0.0"),
        ({"optimizer_type": "adamw"}, r"'adamw' with weight_decay=0.0 decays no parameter"),
        ({"optimizer_type": "lamb", "weight_decay": 0.0}, r"'lamb' with weight_decay=0.0"),
    ],
)
def test_a_weight_decay_filter_without_weight_decay_is_refused(kwargs, match):
    with pytest.raises(OptimizerConfigError, match=match) as info:
        OptimizerConfig(learning_rate=0.1, weight_decay_filter=nnx.PathContains("kernel"), **kwargs)
    assert info.value.field == "weight_decay_filter"
    assert "PathContains('kernel'" in str(info.value)


class Empty(nnx.Module):
    def __init__(self):
        self.size = 3


@pytest.mark.parametrize(
    ("model", "config", "match"),
    [
        (Empty(), OptimizerConfig(learning_rate=0.1), "of the Empty model"),
        (
            Empty(),
            OptimizerConfig(
                optimizer_type="adamw",
                learning_rate=0.1,
                weight_decay=0.1,
                weight_decay_filter=EXCLUDE_BIAS_AND_NORM_SCALE,
            ),
            "of the Empty model",
        ),
        (
            nnx.Linear(2, 1, rngs=nnx.Rngs(0)),
            OptimizerConfig(learning_rate=0.1, wrt=nnx.BatchStat),
            "BatchStat.* of the Linear model",
        ),
    ],
    ids=["no parameters", "no parameters, filtered decay", "wrt selects none"],
)
def test_an_optimizer_that_would_update_nothing_is_refused(model, config, match):
    for build in (create_transformation, create_optimizer):
        with pytest.raises(OptimizerConfigError, match=rf"wrt=.*{match}.*update nothing") as info:
            build(model, config)
        assert info.value.field == "wrt"


def test_create_optimizer_names_a_config_of_the_wrong_type():
    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"^config must be an OptimizerConfig\(\.\.\.\), not dict"):
        create_optimizer(model, {"learning_rate": 1e-3})
    with pytest.raises(TypeError, match=r"^model must be an nnx\.Module, not dict"):
        create_optimizer({"w": jnp.ones(2)}, OptimizerConfig(learning_rate=1e-3))
