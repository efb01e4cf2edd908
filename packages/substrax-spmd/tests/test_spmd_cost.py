import functools

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.mesh import create_device_mesh
from substrax.spmd import (
    BatchPlacementError,
    BatchSplitError,
    PrecisionPolicy,
    StepCost,
    TrainStep,
    create_data_parallel_sharding,
)
from substrax.testing import expect_compiles


ROWS = 64


def batch(rows=ROWS):
    rng = np.random.default_rng(0)
    return {
        "x": rng.normal(size=(rows, 8)).astype(np.float32),
        "y": rng.normal(size=(rows, 1)).astype(np.float32),
    }


def stacked(k, rows=ROWS):
    return jax.tree.map(lambda x: np.stack([x] * k), batch(rows))


@pytest.fixture(scope="module")
def mesh():
    return create_device_mesh({"data": 8})


def mse(model, batch):
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


@pytest.fixture(scope="module")
def new_step(new_train_step):
    """``new_train_step`` with SGD, not Adam: the optimizer adds no matmul to the costs these
    tests read, and SGD's step compiles in about half the time."""
    return functools.partial(new_train_step, optimizer=optax.sgd(1e-2))


@pytest.fixture(scope="module")
def plain_step(new_step, mesh):
    """A data-parallel step that is costed (compiled) but never called: tests only read it."""
    return new_step(mesh)


@pytest.fixture(scope="module")
def plain_cost(plain_step):
    return plain_step.cost(batch())


def test_the_flops_are_the_programs_matmuls_over_its_devices_and_the_bytes_xla_s(
    plain_step, mesh, plain_cost
):
    step = plain_step  # the program its cost compiled (jax's cache: not compiled again)
    placed = jax.device_put(batch(), create_data_parallel_sharding(mesh))
    with jax.set_mesh(mesh):
        compiled = step.jitted.lower(jax.tree.leaves(step.state), placed).compile()
    # forward and both weight gradients of the 8-32-1 MLP, and the hidden layer's input
    # gradient, over the whole batch, one eighth of it on each device
    matmuls = 2 * ROWS * (2 * (8 * 32 + 32 * 1) + 32 * 1)
    assert plain_cost == StepCost(
        flops=matmuls / 8,
        bytes_accessed=compiled.cost_analysis()["bytes accessed"],
        devices=8,
    )
    assert plain_cost.bytes_accessed > 0
    assert plain_cost.total_flops == matmuls
    assert plain_cost.flops_reason is None


def test_a_step_whose_flops_cannot_be_counted_says_why(new_mlp):
    model = new_mlp()
    mix = np.full((8, 8), 0.1, np.float32)

    def loss_fn(m, x):  # the batch is mixed in a while loop: its trip count is data
        x = jax.lax.while_loop(lambda h: h.sum() > 1.0, lambda h: h @ mix, x)
        return (m(x) ** 2).mean()

    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), loss_fn)
    cost = step.cost(np.ones((4, 8), np.float32))
    assert cost.flops is None
    assert "while loop" in cost.flops_reason
    assert step.flops_per_step(np.ones((4, 8), np.float32)) is None


def test_more_rows_cost_more_and_the_figure_is_per_device(new_step, plain_step, plain_cost):
    assert plain_step.flops_per_step(batch(4 * ROWS)) > 2 * plain_cost.flops
    one_device = new_step(None).cost(batch())
    assert one_device.devices == 1
    assert one_device.flops > 4 * plain_cost.flops  # the whole batch on one device


@pytest.mark.parametrize(
    "options",
    [{"accumulate_steps": 4}, {"steps_per_call": 3}, {"accumulate_steps": 2, "steps_per_call": 3}],
    ids=["accumulate", "steps_per_call", "both"],
)
def test_the_cost_is_per_optimizer_step_whatever_the_loops(new_step, mesh, plain_cost, options):
    step = new_step(mesh, **options)
    k = options.get("steps_per_call", 1)
    given = stacked(k) if k > 1 else batch()
    cost = step.cost(given)
    # one optimizer step on the whole batch: the plain step's figure, not a loop body's
    assert cost.flops == plain_cost.flops
    assert cost.accumulate_steps == options.get("accumulate_steps", 1)
    assert cost.steps_per_call == k
    # the step still runs and trains on the batch it was costed for
    losses = step(given)
    assert np.shape(losses) == ((k,) if k > 1 else ())


def test_a_plain_step_compiles_once_for_its_cost_and_its_calls(new_step, mesh):
    step = new_step(mesh)
    with expect_compiles(1):
        cost = step.cost(batch())
        step(batch())
        step(batch())
        assert step.cost(batch()) is cost  # analysed once per batch signature


def test_precision_is_costed_as_compiled(new_step, mesh, plain_cost):
    policy = PrecisionPolicy(param_dtype="float32", compute_dtype="bfloat16")
    cost = new_step(mesh, precision=policy, accumulate_steps=2).cost(batch())
    assert cost.flops is not None
    assert cost.flops >= plain_cost.flops / 2  # same matmuls, plus the casts


@pytest.mark.parametrize(
    ("options", "given", "error"),
    [
        ({"steps_per_call": 4, "mesh": None}, batch(), BatchSplitError),  # not stacked
        # refused as unstacked, not for its 64 rows on the 4 stacked batches' axis
        ({"steps_per_call": 4}, batch(), BatchSplitError),
        ({"steps_per_call": 4}, stacked(3), BatchSplitError),  # 3 batches for 4 steps
        ({"accumulate_steps": 3}, batch(), BatchSplitError),  # 3 does not divide 64 rows
        ({"accumulate_steps": 3, "steps_per_call": 2}, stacked(2), BatchSplitError),
        ({}, batch(12), BatchPlacementError),  # 8 data shards do not divide 12 rows
        ({}, jax.device_put(batch(12)), BatchPlacementError),
    ],
    ids=[
        "unstacked",
        "unstacked-sharded",
        "short-stack",
        "accumulate",
        "accumulate-in-stack",
        "rows",
        "jax-rows",
    ],
)
def test_a_batch_the_call_refuses_is_refused_by_cost_with_the_same_error(
    new_step, mesh, options, given, error
):
    options = {"mesh": mesh, **options}
    step = new_step(options.pop("mesh"), **options)
    with pytest.raises(error) as by_cost:
        step.flops_per_step(given)
    with pytest.raises(error) as by_call:
        step(given)
    assert str(by_cost.value) == str(by_call.value)
    assert by_cost.value.path in ("['x']", "['y']")


def test_cost_refuses_a_bare_array_batch_naming_it(new_mlp):
    model = new_mlp()
    step = TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param),
        lambda m, x: (m(x) ** 2).mean(),
        steps_per_call=4,
    )
    rows = np.ones((32, 8), np.float32)
    with pytest.raises(BatchSplitError, match=r"^the batch of shape \(32, 8\) does not hold"):
        step.cost(rows)
    assert step.flops_per_step(np.stack([rows] * 4)) is not None


def test_an_uncommitted_jax_batch_is_costed_as_the_call_places_it(new_mlp, mesh):
    model = new_mlp()
    step = TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param),
        lambda m, x: (m(x) ** 2).mean(),
        mesh=mesh,
    )
    rows = jax.numpy.ones((32, 8))  # not committed to a device: the call places it
    with expect_compiles(1):
        cost = step.cost(rows)
        step(rows)
    assert cost.flops is not None
