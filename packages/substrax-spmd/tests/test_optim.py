import typing

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from substrax.optim import (
    EXCLUDE_BIAS_AND_NORM_SCALE,
    OPTIMIZER_TYPES,
    LearningRateNotFoundError,
    OptimizerConfig,
    OptimizerConfigError,
    OptimizerType,
    create_optimizer,
    create_transformation,
    current_learning_rate,
    mask_from_filter,
    switch_at,
    update_with_line_search,
    weight_decay_mask,
    with_strong_state_types,
)


def test_optimizer_type_is_a_literal_typing_reads():
    # as 0.1.22's `OptimizerType = Literal[...]`: a test can list the optimizers
    assert typing.get_args(OptimizerType) == OPTIMIZER_TYPES
    assert len(OPTIMIZER_TYPES) == 8


class Net(nnx.Module):
    def __init__(self, rngs):
        self.dense = nnx.Linear(3, 3, rngs=rngs)
        self.norm = nnx.LayerNorm(3, rngs=rngs)

    def __call__(self, x):
        return self.norm(self.dense(x))


@pytest.fixture
def net():
    return Net(nnx.Rngs(0))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"optimizer_type": "adamax"}, OptimizerConfigError, "optimizer_type 'adamax' is unknown"),
        ({"gradient_clip_norm": 1.0, "gradient_clip_value": 1.0}, OptimizerConfigError, "not both"),
        (
            {"gradient_clip_norm": 0.0},
            OptimizerConfigError,
            "gradient_clip_norm=0.0 must be a finite number > 0",
        ),
        (
            {"gradient_clip_value": -1.0},
            OptimizerConfigError,
            "gradient_clip_value=-1.0 must be a finite number > 0",
        ),
        (
            {"weight_decay": -0.1, "optimizer_type": "adamw"},
            OptimizerConfigError,
            "weight_decay=-0.1 must be a finite number >= 0",
        ),
        ({"weight_decay": 0.1}, OptimizerConfigError, "'adam' has none"),
        ({"momentum": 0.9}, OptimizerConfigError, "momentum is for"),
        ({"weight_decay_filter": "kernel"}, TypeError, "reads as a tag"),
        (
            {"learning_rate": 0.0},
            OptimizerConfigError,
            "learning_rate=0.0 must be a finite number > 0",
        ),
        (
            {"learning_rate": "fast"},
            TypeError,
            "learning_rate='fast' must be a finite number > 0.*optax schedule",
        ),
    ],
)
def test_config_refusals(kwargs, error, match):
    with pytest.raises(error, match=match):
        OptimizerConfig(**{"learning_rate": 1e-3, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"learning_rate": float("inf")}, "learning_rate"),
        ({"optimizer_type": "adamw", "weight_decay": float("nan")}, "weight_decay"),
        ({"optimizer_type": "adamw", "weight_decay": float("inf")}, "weight_decay"),
        ({"gradient_clip_norm": float("nan")}, "gradient_clip_norm"),
        ({"gradient_clip_norm": float("inf")}, "gradient_clip_norm"),
        ({"b1": 1.5}, "b1"),
        ({"b1": 1.0}, "b1"),
        ({"b2": -0.1}, "b2"),
        ({"eps": -1e-8}, "eps"),
        ({"optimizer_type": "sgd", "momentum": -0.9}, "momentum"),
        ({"optimizer_type": "sgd", "momentum": float("nan")}, "momentum"),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(OptimizerConfigError, match=f"{field}=.* must be a finite number") as info:
        OptimizerConfig(**{"learning_rate": 1e-3, **kwargs})
    assert info.value.field == field


@pytest.mark.parametrize("rate", [np.float32(1e-3), np.float64(1e-3), jnp.asarray(1e-3)])
def test_a_numpy_or_jax_scalar_learning_rate_is_refused_asking_for_a_float(rate):
    with pytest.raises(TypeError, match=r"pass a Python number: float\(learning_rate\)"):
        OptimizerConfig(learning_rate=rate)


def test_a_callable_that_is_not_a_schedule_is_refused_at_construction():
    def two_arguments(step, total):
        return 1e-3

    with pytest.raises(OptimizerConfigError, match="calling it on step 0 raised TypeError") as info:
        OptimizerConfig(learning_rate=two_arguments)
    assert info.value.field == "learning_rate"
    with pytest.raises(OptimizerConfigError, match="must return one finite number"):
        OptimizerConfig(learning_rate=lambda _step: jnp.ones(3) * 1e-3)
    with pytest.raises(OptimizerConfigError, match="must return one finite number"):
        OptimizerConfig(learning_rate=lambda _step: float("nan"))
    with pytest.raises(OptimizerConfigError, match="must return one finite number"):
        OptimizerConfig(learning_rate=lambda _step: None)


def test_optax_schedules_and_warmup_from_zero_are_accepted():
    OptimizerConfig(learning_rate=optax.linear_schedule(0.0, 1e-3, transition_steps=10))
    OptimizerConfig(learning_rate=optax.cosine_decay_schedule(1e-3, decay_steps=100))
    OptimizerConfig(learning_rate=optax.constant_schedule(1e-3))


def test_config_error_carries_field_and_value():
    with pytest.raises(OptimizerConfigError) as info:
        OptimizerConfig(learning_rate=-1.0)
    assert (info.value.field, info.value.value) == ("learning_rate", -1.0)


def test_config_is_frozen_and_keyword_only():
    config = OptimizerConfig(learning_rate=1e-3)
    with pytest.raises(AttributeError):
        config.learning_rate = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        OptimizerConfig("adam", 1e-3)  # type: ignore[misc]


@pytest.mark.parametrize("kind", OPTIMIZER_TYPES)
def test_every_optimizer_type_builds_and_steps(net, kind):
    extra = {"momentum": 0.9} if kind in ("sgd", "rmsprop") else {}
    if kind in ("adamw", "lamb"):
        extra = {"weight_decay": 0.01, "weight_decay_filter": EXCLUDE_BIAS_AND_NORM_SCALE}
    optimizer = create_optimizer(
        net, OptimizerConfig(optimizer_type=kind, learning_rate=0.1, **extra)
    )
    before = np.asarray(net.dense.kernel.get_value())
    grads = nnx.grad(lambda m: (m.dense(jnp.ones((2, 3))) ** 2).sum())(net)
    optimizer.update(net, grads)
    assert not np.allclose(np.asarray(net.dense.kernel.get_value()), before)
    assert float(current_learning_rate(optimizer)) == pytest.approx(0.1)


def test_weight_decay_mask_excludes_bias_and_scale(net):
    config = OptimizerConfig(
        optimizer_type="adamw",
        learning_rate=0.1,
        weight_decay=0.5,
        weight_decay_filter=EXCLUDE_BIAS_AND_NORM_SCALE,
    )
    assert weight_decay_mask(net, config) == {
        "dense": {"bias": False, "kernel": True},
        "norm": {"bias": False, "scale": False},
    }
    everything = OptimizerConfig(optimizer_type="adamw", learning_rate=0.1, weight_decay=0.5)
    assert weight_decay_mask(net, everything)["norm"]["scale"] is True


def _decaying(path_part: str) -> OptimizerConfig:
    """AdamW (lr 0.1) decaying by 0.5 only the parameters whose path contains ``path_part``."""
    return OptimizerConfig(
        optimizer_type="adamw",
        learning_rate=0.1,
        weight_decay=0.5,
        weight_decay_filter=nnx.PathContains(path_part),
    )


def test_masked_weight_decay_only_decays_the_selected_parameters(net):
    config = _decaying("kernel")
    optimizer = create_optimizer(net, config)
    bias = np.asarray(net.dense.bias.get_value())
    kernel = np.asarray(net.dense.kernel.get_value())
    zero = jax.tree.map(jnp.zeros_like, nnx.state(net, nnx.Param))
    optimizer.update(net, zero)
    np.testing.assert_allclose(np.asarray(net.dense.bias.get_value()), bias)
    np.testing.assert_allclose(
        np.asarray(net.dense.kernel.get_value()), kernel * (1 - 0.1 * 0.5), rtol=1e-6
    )


def test_a_filter_that_selects_nothing_is_refused(net):
    config = _decaying("embedding")
    with pytest.raises(
        OptimizerConfigError, match="selects none of the model's parameters"
    ) as info:
        create_transformation(net, config)
    assert (info.value.field, info.value.value) == (
        "weight_decay_filter",
        config.weight_decay_filter,
    )
    assert isinstance(info.value, ValueError)
    for kind in ("adamw", "lamb"):  # at any decay rate, and through create_optimizer too
        silent = OptimizerConfig(
            optimizer_type=kind,
            learning_rate=0.1,
            weight_decay=0.01,
            weight_decay_filter=nnx.PathContains("nope"),
        )
        with pytest.raises(OptimizerConfigError, match=f"{kind} would decay nothing"):
            create_optimizer(net, silent)


@pytest.mark.parametrize("kind", ["adamw", "lamb"])
def test_the_state_tree_does_not_depend_on_the_weight_decay_filter(net, kind, tmp_path):
    def state(filter_):
        config = OptimizerConfig(
            optimizer_type=kind, learning_rate=0.1, weight_decay=0.5, weight_decay_filter=filter_
        )
        return nnx.as_pure(create_optimizer(net, config).opt_state)

    trees = {
        name: state(filter_)
        for name, filter_ in [
            ("none", None),
            ("kernels", nnx.PathContains("kernel")),
            ("no bias or scale", EXCLUDE_BIAS_AND_NORM_SCALE),
        ]
    }
    structures = {name: jax.tree.structure(tree) for name, tree in trees.items()}
    assert len(set(structures.values())) == 1, structures
    # a checkpoint of the unfiltered optimizer restores into the filtered one's state
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "state", trees["none"])
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(tmp_path / "state", trees["kernels"])
    assert jax.tree.structure(restored) == structures["kernels"]


def test_mask_from_filter_on_plain_pytrees():
    params = {"layer": {"kernel": jnp.ones(2), "bias": jnp.ones(2)}}
    assert mask_from_filter(params, EXCLUDE_BIAS_AND_NORM_SCALE) == {
        "layer": {"kernel": True, "bias": False}
    }


def test_clipping_is_chained_before_the_optimizer(net):
    tx = create_transformation(
        net, OptimizerConfig(optimizer_type="sgd", learning_rate=1.0, gradient_clip_norm=1.0)
    )
    params = {"w": jnp.zeros(2)}
    updates, _ = tx.update({"w": jnp.array([30.0, 40.0])}, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["w"]), [-0.6, -0.8], rtol=1e-6)
    tx = create_transformation(
        net, OptimizerConfig(optimizer_type="sgd", learning_rate=1.0, gradient_clip_value=0.5)
    )
    updates, _ = tx.update({"w": jnp.array([30.0, -0.25])}, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["w"]), [-0.5, 0.25])


def test_schedules_are_followed(net):
    schedule = optax.linear_schedule(1.0, 0.0, transition_steps=4)
    optimizer = create_optimizer(net, OptimizerConfig(optimizer_type="sgd", learning_rate=schedule))
    grads = jax.tree.map(jnp.ones_like, nnx.state(net, nnx.Param))
    assert float(current_learning_rate(optimizer)) == pytest.approx(1.0)
    optimizer.update(net, grads)
    optimizer.update(net, grads)
    # the rate of the latest update: step 1 of the schedule
    assert float(current_learning_rate(optimizer)) == pytest.approx(0.75)


def test_current_learning_rate_needs_injected_hyperparameters(net):
    with pytest.raises(LearningRateNotFoundError, match="inject_hyperparams") as info:
        current_learning_rate(nnx.Optimizer(net, optax.sgd(0.1), wrt=nnx.Param))
    assert isinstance(info.value, LookupError)
    assert isinstance(info.value, ValueError)  # what 0.1.22 raised


def test_with_strong_state_types():
    def init(params):
        return {"scale": jnp.asarray(0.5)}  # a Python float: weakly typed

    def update(updates, state, params=None):
        return jax.tree.map(lambda u: u * state["scale"], updates), state

    tx = optax.GradientTransformation(init, update)
    assert tx.init({}).get("scale").weak_type
    strong = with_strong_state_types(tx)
    state = strong.init({"w": jnp.ones(2)})
    assert not state["scale"].weak_type
    assert state["scale"].dtype == jnp.float32
    updates, _ = strong.update({"w": jnp.ones(2)}, state)
    np.testing.assert_allclose(np.asarray(updates["w"]), [0.5, 0.5])


def test_switch_at_changes_transformation_at_the_step():
    tx = switch_at(optax.sgd(1.0), optax.sgd(0.1), step=2)
    params = {"w": jnp.zeros(1)}
    state = tx.init(params)
    seen = []
    for _ in range(4):
        updates, state = tx.update({"w": jnp.ones(1)}, state, params)
        seen.append(round(float(updates["w"][0]), 6))
    assert seen == [-1.0, -1.0, -0.1, -0.1]


def test_switch_at_from_adam_into_lbfgs_needs_no_hand_made_strong_types():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32))
    y = x @ jnp.array([[1.0], [-2.0], [0.5]]) + 0.3
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    tx = switch_at(optax.adam(1e-2), optax.lbfgs(), step=3)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    traces = []

    def body(model, optimizer):
        traces.append(None)
        return update_with_line_search(
            model, optimizer, lambda m: ((m(x) - y) ** 2).mean(), objective_changed=False
        )

    step = nnx.jit(body)
    values = [float(step(model, optimizer)) for _ in range(8)]
    assert len(traces) == 1, "the step recompiled across the switch"
    # adam's small steps first, then L-BFGS drives the least-squares loss to ~0
    assert values[1] < values[0]
    assert values[2] < values[1]
    assert values[3] > 0.5 * values[0]
    assert values[-1] < 1e-3 * values[0]


@pytest.mark.parametrize(
    ("step", "error"), [(0, ValueError), (-3, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_switch_at_refuses_a_bad_step(step, error):
    with pytest.raises(error, match=r"step=.* must be an integer >= 1"):
        switch_at(optax.sgd(1.0), optax.sgd(0.1), step=step)


def test_a_wrong_argument_type_is_named_not_an_attribute_error(net):
    config = OptimizerConfig(learning_rate=0.1)
    with pytest.raises(TypeError, match="config must be an OptimizerConfig"):
        create_transformation(net, {"learning_rate": 0.1})
    with pytest.raises(TypeError, match=r"model must be an nnx\.Module"):
        create_transformation(None, config)
    with pytest.raises(TypeError, match=r"optimizer must be an nnx\.Optimizer, not int 42"):
        current_learning_rate(42)
    with pytest.raises(TypeError, match="tx must be an optax transformation"):
        with_strong_state_types("adam")


def test_create_optimizer_refuses_ref_parameters_by_name_and_takes_hijax_ones():
    with nnx.var_defaults(ref=True):  # optax.inject_hyperparams reads a dtype a Ref lacks
        refs = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"^create_optimizer takes .*; bias holds a jax\.Ref"):
        create_optimizer(refs, OptimizerConfig(learning_rate=0.1))
    with nnx.var_defaults(hijax=True):
        hijax = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    optimizer = create_optimizer(hijax, OptimizerConfig(learning_rate=0.5))
    assert float(current_learning_rate(optimizer)) == 0.5
