import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from substrax.mesh import create_device_mesh
from substrax.spmd import (
    BatchSplitError,
    PrecisionPolicy,
)
from substrax.testing import expect_compiles


def kernel(step):
    return np.asarray(step.model.up.kernel.get_value())


def stacked(host_batches):
    return jax.tree.map(lambda *xs: np.stack(xs), *host_batches)


@pytest.fixture(scope="module")
def mesh():
    return create_device_mesh({"data": 8})


@pytest.fixture(scope="module")
def single_steps(new_train_step, mesh, host_batches):
    step = new_train_step(mesh)
    losses = [float(step(b)) for b in host_batches]
    return losses, kernel(step), int(step.optimizer.step.get_value())


def test_k_steps_in_one_call_equal_k_single_steps(new_train_step, mesh, host_batches, single_steps):
    step = new_train_step(mesh, steps_per_call=3)
    with expect_compiles(1):
        losses = step(stacked(host_batches))  # a host batch, placed with rows over "data"
    assert losses.shape == (3,)
    np.testing.assert_allclose(np.asarray(losses), single_steps[0], rtol=1e-5)
    np.testing.assert_allclose(kernel(step), single_steps[1], rtol=1e-5, atol=1e-6)
    assert int(step.optimizer.step.get_value()) == single_steps[2] == 3


def test_placed_batches_keep_the_data_axis_on_the_rows(new_train_step, mesh, host_batches):
    step = new_train_step(mesh, steps_per_call=3)
    placed = jax.device_put(
        stacked(host_batches), jax.sharding.NamedSharding(mesh, P(None, "data"))
    )
    assert placed["x"].addressable_shards[0].data.shape == (3, 2, 8)
    with expect_compiles(1):
        first = step(placed)
        second = step(placed)
    assert float(second[0]) < float(first[0])


def test_combines_with_accumulation_and_precision(new_train_step, mesh, host_batches, single_steps):
    step = new_train_step(
        mesh,
        steps_per_call=3,
        accumulate_steps=2,
        precision=PrecisionPolicy(compute_dtype="float32"),
    )
    losses = step(stacked(host_batches))
    np.testing.assert_allclose(np.asarray(losses), single_steps[0], rtol=1e-5)
    np.testing.assert_allclose(kernel(step), single_steps[1], rtol=1e-5, atol=1e-6)


def test_a_batch_without_k_steps_on_its_leading_axis_is_refused(new_train_step, mesh, host_batches):
    step = new_train_step(mesh, steps_per_call=3)
    with pytest.raises(BatchSplitError, match=r"\['x'\] of shape \(2, 16, 8\).*steps_per_call=3"):
        step(stacked(host_batches[:2]))


def test_counts_below_one_are_refused(new_train_step, mesh):
    with pytest.raises(ValueError, match="steps_per_call=0"):
        new_train_step(mesh, steps_per_call=0)
    with pytest.raises(TypeError, match=r"accumulate_steps=2\.0"):
        new_train_step(mesh, accumulate_steps=2.0)
