"""A real TrainStep loop, counted: one dispatch per step, no host transfer, no retrace."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.mesh import DeviceMeshManager
from substrax.spmd import TrainStep, create_data_parallel_sharding, place_batch_on_shards
from substrax.testing import TooManyCallsError, by_package, counted_calls, per_iteration


KEYS = by_package("substrax", __name__)


def _loss(model, batch):
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


@pytest.fixture
def loop():
    mesh = DeviceMeshManager.create_device_mesh({"data": 8})
    sharding = create_data_parallel_sharding(mesh)
    model = nnx.Sequential(
        nnx.Linear(4, 16, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(16, 1, rngs=nnx.Rngs(1))
    )
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    step = TrainStep(model, optimizer, _loss, mesh=mesh, batch_sharding=sharding)
    rng = np.random.default_rng(0)

    def batch(size):
        host = {"x": rng.normal(size=(size, 4)), "y": rng.normal(size=(size, 1))}
        return place_batch_on_shards(jax.tree.map(np.float32, host), sharding)

    placed = batch(16)
    step(placed)  # warm up: the first step compiles
    return step, placed, batch


def test_steps_make_one_dispatch_each_and_no_host_transfer(loop):
    step, placed, _ = loop

    def count(n):
        with counted_calls(KEYS) as calls:
            for _ in range(n):
                step(placed)
        return calls

    limits = {"dispatch": 1, "host_to_device": 0, "device_to_host": 0, "compile": 0}
    per = per_iteration(count, short=2, long=6, at_most=limits)
    assert per.kinds() == {"dispatch": 1, "host_to_device": 0, "device_to_host": 0, "compile": 0}
    assert per.packages("dispatch") == {"substrax": 1}  # made by TrainStep, not by the test


def test_reading_the_loss_every_step_is_one_transfer_per_iteration(loop):
    step, placed, _ = loop

    def count(n):
        with counted_calls(KEYS) as calls:
            for _ in range(n):
                float(step(placed))
        return calls

    with pytest.raises(TooManyCallsError) as info:
        per_iteration(count, short=2, long=5, at_most={"device_to_host": 0})
    assert (info.value.observed, info.value.packages) == (1, ((__name__, 1),))
    per = per_iteration(count, short=2, long=5)
    assert per.kinds() == {"dispatch": 1, "host_to_device": 0, "device_to_host": 1, "compile": 0}


def test_placing_host_batches_every_step_shows_as_host_transfers(loop):
    step, _, batch = loop
    host = {"x": np.ones((16, 4), np.float32), "y": np.zeros((16, 1), np.float32)}
    step(host)  # the same shapes as the placed batch: no retrace

    def count(n):
        with counted_calls(KEYS) as calls:
            for _ in range(n):
                step(host)
        return calls

    per = per_iteration(count, short=1, long=3)
    assert per.of("host_to_device", "substrax") == 2  # both leaves, placed by TrainStep
    assert per.of("compile") == 0
    del batch


def test_a_new_batch_shape_retraces_and_compiles(loop):
    step, placed, batch = loop
    bigger = batch(32)
    with counted_calls(KEYS) as calls:
        step(placed)
        step(bigger)
        step(bigger)
    assert calls.of("dispatch", "substrax") == 3
    assert calls.of("compile", "substrax") >= 1
    sizes = iter(range(40, 400, 8))
    batches = [batch(next(sizes)) for _ in range(12)]  # placed up front: not counted

    def count(n):
        with counted_calls(KEYS) as calls:
            for _ in range(n):
                step(batches.pop())
        return calls

    with pytest.raises(TooManyCallsError) as info:  # every iteration compiles the step anew
        per_iteration(count, short=1, long=3, at_most={"compile": 0})
    assert info.value.kind == "compile"
    assert dict(info.value.packages) == {"substrax": info.value.observed}
    assert "compiles again every iteration" in str(info.value)
