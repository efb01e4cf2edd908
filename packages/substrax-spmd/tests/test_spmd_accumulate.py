import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.mesh import create_device_mesh
from substrax.spmd import (
    BatchSplitError,
    TrainStep,
    create_data_parallel_sharding,
    place_batch_on_shards,
)
from substrax.spmd._accumulate import accumulate_gradients, split_microbatches
from substrax.testing import expect_compiles


def mse_with_aux(model, batch):
    pred = model(batch["x"])
    return ((pred - batch["y"]) ** 2).mean(), {"mean_pred": pred.mean()}


def params_of(model):
    return {
        "/".join(map(str, k)): np.asarray(v.get_value())
        for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }


@pytest.fixture(scope="module")
def new_sgd_step(new_train_step):
    """``new_train_step`` with SGD: ``new_sgd_step(mesh, loss_fn, ...)``.

    SGD, not Adam: its update is the gradient itself, so microbatch gradients summed where they
    should be averaged change the parameters (Adam's normalised update would hide it); its step
    also compiles in about half Adam's time.
    """

    def build(mesh, loss_fn, **options):
        return new_train_step(mesh, loss_fn=loss_fn, optimizer=optax.sgd(0.1), **options)

    return build


def train(new_sgd_step, host_batches, *, accumulate_steps, mesh=None):
    step = new_sgd_step(mesh, mse_with_aux, has_aux=True, accumulate_steps=accumulate_steps)
    with expect_compiles(1):
        outs = [step(b) for b in host_batches]
    return outs, params_of(step.model)


def test_microbatches_take_strided_rows_and_indivisible_batches_are_refused():
    batch = {"x": np.arange(8 * 3).reshape(8, 3), "y": np.arange(8)}
    micro = split_microbatches(batch, 4)
    assert micro["x"].shape == (4, 2, 3)
    np.testing.assert_array_equal(micro["y"], [[0, 4], [1, 5], [2, 6], [3, 7]])
    with pytest.raises(BatchSplitError, match=r"\['y'\].*accumulate_steps=3") as caught:
        split_microbatches({"x": np.ones((9, 3)), "y": np.ones(8)}, 3)
    assert (caught.value.path, caught.value.shape, caught.value.parts) == ("['y']", (8,), 3)


def test_accumulated_step_equals_one_step_on_the_whole_batch(new_sgd_step, host_batches):
    mesh = create_device_mesh({"data": 8})
    whole, whole_params = train(new_sgd_step, host_batches, accumulate_steps=1, mesh=mesh)
    # 16 rows: 2 microbatches of 8, one row per device in each
    accumulated, params = train(new_sgd_step, host_batches, accumulate_steps=2, mesh=mesh)
    for (loss, aux), (want, want_aux) in zip(accumulated, whole, strict=True):
        assert float(loss) == pytest.approx(float(want), rel=1e-5)
        assert float(aux["mean_pred"]) == pytest.approx(float(want_aux["mean_pred"]), rel=1e-4)
    for name, value in whole_params.items():
        np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # on one device, 4 microbatches of 4 rows
    unsharded, unsharded_params = train(new_sgd_step, host_batches, accumulate_steps=4)
    assert float(unsharded[-1][0]) == pytest.approx(float(whole[-1][0]), rel=1e-5)
    for name, value in whole_params.items():
        np.testing.assert_allclose(unsharded_params[name], value, rtol=1e-5, atol=1e-6)


def masked_mse(model, batch):
    """The mean squared error over the rows the mask counts (padded rows left out)."""
    pred = model(batch["x"])[:, 0]
    mask, count = batch["mask"], batch["mask"].sum()
    per_row = (pred - batch["y"][:, 0]) ** 2
    return (per_row * mask).sum() / count, {"mean_pred": (pred * mask).sum() / count}


@pytest.mark.parametrize("devices", [None, 8], ids=["one device", "8 devices"])
def test_a_masked_mean_loss_with_mask_equals_the_whole_batch(new_sgd_step, host_batches, devices):
    """A hostile review: microbatches counting different numbers of rows were weighted alike
    (a microbatch of one counted row weighed as much as one of 16), so a masked mean trained
    differently from the whole batch, silently; and a microbatch counting none made it NaN."""
    mesh = None if devices is None else create_device_mesh({"data": devices})
    mask = np.zeros(16, np.float32)
    mask[::2] = 1.0  # microbatch 0 (rows 0, 2, ...) counts 8 rows, microbatch 1 none but row 1
    mask[1] = 1.0
    for where in (mask, np.where(np.arange(16) % 2 == 0, mask, 0.0).astype(np.float32)):
        batches = [dict(b, mask=where) for b in host_batches]  # the second: one counts none
        whole = new_sgd_step(mesh, masked_mse, has_aux=True)
        split = new_sgd_step(mesh, masked_mse, has_aux=True, accumulate_steps=2, mask="mask")
        for batch in batches:
            (loss, aux), (want, want_aux) = split(batch), whole(batch)
            assert float(loss) == pytest.approx(float(want), rel=1e-5)
            assert float(aux["mean_pred"]) == pytest.approx(float(want_aux["mean_pred"]), rel=1e-5)
        for name, value in params_of(whole.model).items():
            np.testing.assert_allclose(params_of(split.model)[name], value, rtol=1e-5, atol=1e-6)


def test_a_token_mask_weighs_each_row_by_its_tokens(new_sgd_step):
    """A second pass: a (rows, tokens) mask was refused, and a per-row "row is real" mask
    trained as without one; a row weighs the tokens the loss counts in it."""
    rng = np.random.default_rng(1)
    lengths = np.array([6, 1, 6, 1, 6, 1, 2, 1] * 2)
    batch = {
        "x": rng.normal(size=(16, 6, 8)).astype(np.float32),
        "y": rng.normal(size=(16, 6, 1)).astype(np.float32),
        "tokens": (np.arange(6)[None] < lengths[:, None]).astype(np.float32),
    }

    def token_mse(model, batch):
        per_token = ((model(batch["x"]) - batch["y"]) ** 2)[..., 0]
        return (per_token * batch["tokens"]).sum() / batch["tokens"].sum()

    whole = new_sgd_step(None, token_mse)
    split = new_sgd_step(None, token_mse, accumulate_steps=2, mask="tokens")
    assert float(split(batch)) == pytest.approx(float(whole(batch)), rel=1e-5)
    for name, value in params_of(whole.model).items():
        np.testing.assert_allclose(params_of(split.model)[name], value, rtol=1e-5, atol=1e-6)


def test_a_batch_that_counts_nothing_leaves_the_parameters_finite(new_sgd_step, host_batches):
    """A second pass: a batch whose mask counts no row (a padded last batch) made every
    parameter NaN; its gradients are zero now (SGD: no change), and its loss NaN (0/0)."""
    step = new_sgd_step(None, masked_mse, has_aux=True, accumulate_steps=2, mask="mask")
    before = params_of(step.model)
    loss, _ = step(dict(host_batches[0], mask=np.zeros(16, np.float32)))
    assert np.isnan(float(loss))
    for name, value in params_of(step.model).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_a_mask_that_is_not_a_key_or_a_batch_without_it_is_refused(new_sgd_step, host_batches):
    with pytest.raises(TypeError, match=r"TrainStep\(mask=3\): mask must be the batch's key"):
        new_sgd_step(None, masked_mse, has_aux=True, accumulate_steps=2, mask=3)
    step = new_sgd_step(None, mse_with_aux, has_aux=True, accumulate_steps=2, mask="mask")
    with pytest.raises(ValueError, match=r"TrainStep\(mask='mask'\): the batch has no 'mask'"):
        step(host_batches[0])


@pytest.mark.x64
def test_float64_gradients_are_summed_in_float64():
    # they were summed in float32: a float64 model lost its gradients' last 8 digits
    params = {"w": jnp.ones(3, jnp.float64)}

    def grad_fn(p, rest, micro):
        return (micro["g"][0], ()), jax.tree.map(lambda x: x * 0 + micro["g"][0], p), rest

    batch = {"g": jnp.asarray([1.0, 1.0 + 1e-12], jnp.float64)}  # two microbatches of one row
    (loss, _), grads, _ = accumulate_gradients(grad_fn, params, (), batch, 2)
    assert grads["w"].dtype == jnp.float64
    np.testing.assert_array_equal(grads["w"], np.full(3, (1.0 + (1.0 + 1e-12)) / 2))
    assert float(loss) == (1.0 + (1.0 + 1e-12)) / 2


def test_a_batch_the_microbatch_count_does_not_divide_is_refused(new_mlp, host_batches):
    model = new_mlp()
    step = TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param),
        lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
        accumulate_steps=3,
    )
    with pytest.raises(BatchSplitError, match=r"\['x'\] of shape \(16, 8\)") as caught:
        step(host_batches[0])
    assert caught.value.parts == 3
    assert step(jax.tree.map(lambda x: x[:15], host_batches[0])).shape == ()


class Wide(nnx.Module):
    """Few parameters, wide activations: activation memory dominates a step."""

    def __init__(self, rngs: nnx.Rngs):
        self.up = nnx.Linear(4, 1024, rngs=rngs)
        self.down = nnx.Linear(1024, 1, rngs=rngs)

    def __call__(self, x):
        hidden = self.up(x)
        return self.down(jax.nn.gelu(hidden) * jnp.tanh(hidden) + jnp.sin(hidden))


def compiled(step, batch):
    with jax.set_mesh(step.mesh):
        return step.jitted.lower(jax.tree.leaves(step.state), batch).compile()


def test_peak_memory_is_one_microbatch_not_the_whole_batch():
    mesh = create_device_mesh({"data": 8})
    sharding = create_data_parallel_sharding(mesh)

    def build(accumulate_steps):
        model = Wide(nnx.Rngs(0))
        return TrainStep(
            model,
            # SGD: no optimizer state to update, so the temporaries are the activations'
            nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param),
            lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
            mesh=mesh,
            batch_sharding=sharding,
            accumulate_steps=accumulate_steps,
        )

    def rows(n):
        return place_batch_on_shards({"x": np.ones((n, 4)), "y": np.ones((n, 1))}, sharding)

    accumulated = compiled(build(8), rows(2048))
    micro = compiled(build(1), rows(256)).memory_analysis().temp_size_in_bytes
    whole = compiled(build(1), rows(2048)).memory_analysis().temp_size_in_bytes
    temp = accumulated.memory_analysis().temp_size_in_bytes
    assert temp <= 1.2 * micro, (temp, micro)  # one microbatch's activations + one gradient
    assert whole > 4 * micro  # and the model's activations do dominate
    # the strided split keeps each device's rows on it: only the gradient all-reduce remains
    collectives = set(
        re.findall(r"all-gather|all-to-all|collective-permute", accumulated.as_text())
    )
    assert collectives == set()


def test_batch_statistics_and_rng_state_advance_per_microbatch(new_stateful, host_batches):
    model = new_stateful()
    mean_before = np.asarray(model.norm.mean.get_value()).copy()
    step = TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(1e-2), wrt=nnx.Param),
        lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
        accumulate_steps=4,
    )
    with expect_compiles(1):
        losses = [float(step(b)) for b in host_batches]
    assert len(set(losses)) == 3
    synced = step.model
    assert not np.allclose(np.asarray(synced.norm.mean.get_value()), mean_before)
    assert int(synced.drop.rngs.count.get_value()) == 3 * 4  # one dropout key per microbatch


def per_class(model, batch):
    """A (4,) aux that depends on which rows it sees (max, min, sum), and a (10,) one."""
    errors = ((model(batch["x"]) - batch["y"]) ** 2)[:, 0]
    stats = jnp.stack([errors.max(), errors.min(), errors.sum(), errors.mean()])
    return errors.mean(), {"per_class": stats, "hist": jnp.zeros(10) + errors.mean()}


@pytest.mark.parametrize("sharded", [False, True], ids=["one device", "data mesh"])
def test_a_per_class_aux_is_the_mean_over_microbatches_of_each_microbatchs(
    new_mlp, new_sgd_step, host_batches, sharded
):
    """Review of today's refusal: an aux with no per-example axis (per-class metrics, a
    histogram) was refused under accumulate_steps > 1; averaging it over microbatches is right."""
    batch = host_batches[0]
    mesh = create_device_mesh({"data": 8}) if sharded else None
    step = new_sgd_step(mesh, per_class, has_aux=True, accumulate_steps=2)
    loss, aux = step(batch)
    model = new_mlp()  # the parameters the step's loss and aux were computed with
    # microbatch i takes rows i, i + 2, ...
    each = [per_class(model, jax.tree.map(lambda x, i=i: x[i::2], batch))[1] for i in (0, 1)]
    assert aux["per_class"].shape == (4,)
    assert aux["hist"].shape == (10,)
    for name in ("per_class", "hist"):
        want = (np.asarray(each[0][name]) + np.asarray(each[1][name])) / 2
        np.testing.assert_allclose(np.asarray(aux[name]), want, rtol=1e-5, err_msg=name)
    # the whole batch's max and min are not the microbatches' mean of them
    whole = per_class(model, batch)[1]["per_class"]
    assert not np.allclose(np.asarray(aux["per_class"])[:3], np.asarray(whole)[:3])
    assert float(loss) == pytest.approx(float(whole[3]), rel=1e-5)
