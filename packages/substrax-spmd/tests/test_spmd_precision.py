import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.mesh import create_device_mesh
from substrax.spmd import PrecisionPolicy, TrainStep


def test_policy_validates_and_casts_only_floating_leaves():
    policy = PrecisionPolicy(compute_dtype=jnp.bfloat16, output_dtype="float32")
    assert policy.compute_dtype == jnp.bfloat16
    cast = policy.cast_to_compute({"x": np.ones(2, np.float32), "ids": jnp.arange(2), "n": 3})
    assert cast["x"].dtype == jnp.bfloat16
    assert cast["ids"].dtype == jnp.int32
    assert cast["n"] == 3
    assert policy.cast_to_output(jnp.ones(2, jnp.bfloat16)).dtype == jnp.float32
    with pytest.raises(ValueError, match="compute_dtype must be a floating dtype"):
        PrecisionPolicy(compute_dtype="int8")
    with pytest.raises(ValueError, match="param_dtype must be a dtype"):
        PrecisionPolicy(param_dtype="float33")


def test_bfloat16_compute_keeps_float32_params_and_optimizer_state(new_train_step, host_batches):
    mesh = create_device_mesh({"data": 8})
    seen: list[tuple[str, jnp.dtype]] = []

    def loss_fn(model, batch):
        hidden = model.up(batch["x"])
        seen.extend(
            [
                ("kernel", model.up.kernel.get_value().dtype),
                ("x", batch["x"].dtype),
                ("hidden", hidden.dtype),
            ]
        )
        return ((model.down(jax.nn.relu(hidden)) - batch["y"]) ** 2).mean()

    policy = PrecisionPolicy(param_dtype="float32", compute_dtype="bfloat16")
    step = new_train_step(mesh, loss_fn=loss_fn, precision=policy)
    losses = [step(b) for b in host_batches]
    assert dict(seen) == {"kernel": jnp.bfloat16, "x": jnp.bfloat16, "hidden": jnp.bfloat16}
    assert {loss.dtype for loss in losses} == {jnp.dtype("float32")}
    state = step.state
    kinds = {leaf.dtype for leaf in jax.tree.leaves(state[0])}
    assert kinds == {jnp.dtype("float32")}  # the stored parameters: no bf16 copy kept
    mu = step.optimizer.opt_state[0].mu["up"]["kernel"].get_value()
    assert mu.dtype == jnp.float32

    plain = new_train_step(loss_fn=loss_fn)
    expected = [float(plain(b)) for b in host_batches]
    np.testing.assert_allclose([float(x) for x in losses], expected, rtol=3e-2)
    np.testing.assert_allclose(
        np.asarray(step.model.up.kernel.get_value()),
        np.asarray(plain.model.up.kernel.get_value()),
        atol=2e-2,
    )


def test_parameters_not_in_the_param_dtype_are_refused(new_mlp):
    model = new_mlp(param_dtype=jnp.bfloat16)
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    with pytest.raises(ValueError, match=r"parameter .*bias.* is bfloat16 .* float32"):
        TrainStep(model, optimizer, lambda m, b: m(b).mean(), precision=PrecisionPolicy())
