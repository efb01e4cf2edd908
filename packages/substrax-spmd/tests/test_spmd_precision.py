import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.mesh import create_device_mesh
from substrax.spmd import PrecisionPolicy, TrainStep, create_data_parallel_sharding


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


def _momentum_step(model, loss_fn, mesh=None, **options):
    """A TrainStep with SGD and momentum: an optimizer state like the parameters, and a step
    that compiles faster than Adam's."""
    return TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(1e-2, momentum=0.9), wrt=nnx.Param),
        loss_fn,
        mesh=mesh,
        batch_sharding=None if mesh is None else create_data_parallel_sharding(mesh),
        **options,
    )


def test_bfloat16_compute_keeps_float32_params_and_optimizer_state(new_mlp, host_batches):
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
    step = _momentum_step(new_mlp(), loss_fn, mesh, precision=policy)
    losses = [step(b) for b in host_batches]
    # the batch is passed as given; the layer casts it, and computes in bfloat16
    assert dict(seen) == {"kernel": jnp.bfloat16, "x": jnp.float32, "hidden": jnp.bfloat16}
    assert {loss.dtype for loss in losses} == {jnp.dtype("float32")}
    state = step.state
    kinds = {leaf.dtype for leaf in jax.tree.leaves(state[0])}
    assert kinds == {jnp.dtype("float32")}  # the stored parameters: no bf16 copy kept
    trace = step.optimizer.opt_state[0].trace["up"]["kernel"].get_value()
    assert trace.dtype == jnp.float32

    plain = _momentum_step(new_mlp(), loss_fn)
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


class _Tower(nnx.Module):
    """Embed -> Linear -> LayerNorm -> Linear, with float32 parameters and flax's default dtypes."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(16, 8, rngs=rngs)
        self.hidden = nnx.Linear(8, 8, rngs=rngs)
        self.norm = nnx.LayerNorm(8, rngs=rngs)
        self.head = nnx.Linear(8, 16, rngs=rngs)


def _tower_loss(seen):
    def loss_fn(model, ids):
        embedded = model.embed(ids)
        hidden = model.hidden(embedded)
        normed = model.norm(hidden)
        logits = model.head(normed)
        seen.update(embedded=embedded.dtype, hidden=hidden.dtype, normed=normed.dtype)
        seen.update(logits=logits.dtype)
        labels = jnp.roll(ids, 1, axis=-1)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), labels
        ).mean()

    return loss_fn


def test_every_standard_layer_computes_in_the_compute_dtype_and_stores_float32():
    from substrax.spmd import EvalStep

    model = _Tower(nnx.Rngs(0))
    seen: dict[str, jnp.dtype] = {}
    policy = PrecisionPolicy(param_dtype="float32", compute_dtype="bfloat16")
    step = _momentum_step(model, _tower_loss(seen), precision=policy)
    ids = jnp.arange(32, dtype=jnp.int32).reshape(4, 8) % 16
    loss = step(ids)
    bf16 = jnp.dtype(jnp.bfloat16)
    assert seen == {"embedded": bf16, "hidden": bf16, "normed": bf16, "logits": bf16}
    assert loss.dtype == jnp.float32
    assert {leaf.dtype for leaf in jax.tree.leaves(step.state)} <= {
        jnp.dtype("float32"),
        jnp.dtype("int32"),
        jnp.dtype("uint32"),
    }
    assert step.model.embed.embedding.get_value().dtype == jnp.float32
    assert step.model.head.kernel.get_value().dtype == jnp.float32
    assert step.model.embed.dtype == jnp.float32  # the user's model keeps its own dtypes

    seen.clear()
    metrics = EvalStep(step, lambda m, b: {"loss": _tower_loss(seen)(m, b)})  # the step's policy
    assert metrics(ids)["loss"].dtype == jnp.float32
    assert seen["logits"] == bf16


def test_set_compute_dtype_touches_only_floating_or_unset_dtypes():
    class Custom(nnx.Module):
        def __init__(self) -> None:
            self.dtype = jnp.int8  # a user's own meaning: not a computation dtype
            self.linear = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

    model = Custom()
    PrecisionPolicy(compute_dtype="bfloat16").set_compute_dtype(model)
    assert model.dtype == jnp.int8
    assert model.linear.dtype == jnp.bfloat16
    assert model.linear.kernel.get_value().dtype == jnp.float32


def test_float16_without_loss_scaling_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"compute_dtype=float16 needs loss scaling.*bfloat16"):
        PrecisionPolicy(compute_dtype="float16")
    with pytest.raises(ValueError, match=r"param_dtype=float16 needs loss scaling.*bfloat16"):
        PrecisionPolicy(param_dtype="float16", compute_dtype="bfloat16")
    assert PrecisionPolicy(output_dtype="float16").output_dtype == jnp.float16


def test_float_targets_reach_the_loss_at_their_own_precision():
    model = nnx.Linear(1, 1, rngs=nnx.Rngs(0))
    seen = {}

    def loss_fn(m, batch):
        seen["y"] = batch["y"]
        return ((m(batch["x"]).astype(jnp.float32) - batch["y"]) ** 2).mean()

    step = TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(0.0), wrt=nnx.Param),
        loss_fn,
        precision=PrecisionPolicy(compute_dtype="bfloat16"),
    )
    step({"x": np.zeros((2, 1), np.float32), "y": np.full((2, 1), 1000.7, np.float32)})
    assert seen["y"].dtype == jnp.float32  # bfloat16 would have made it 1000
