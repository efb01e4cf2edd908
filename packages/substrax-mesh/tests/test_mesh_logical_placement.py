"""Optimizer state, over-long annotations and NamedSharding annotations under shard_model."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from substrax.mesh import (
    ShardingAnnotationError,
    create_device_mesh,
    create_sharded_model,
    fsdp_rules,
    logical_to_mesh_spec,
    shard_model,
    state_shardings,
)


def partitioned(names):
    return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.Linear(16, 32, kernel_init=partitioned(("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(32, 16, kernel_init=partitioned(("mlp", "embed")), rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


def two_dims(params):
    return jax.tree.map(lambda x: x.ndim == 2, params)


OPTIMIZERS = {
    "masked": lambda: optax.masked(optax.adam(1e-2), two_dims),
    "multi_transform": lambda: optax.multi_transform(
        {"adam": optax.adam(1e-2), "sgd": optax.sgd(1e-2)},
        lambda p: jax.tree.map(lambda x: "adam" if x.ndim == 2 else "sgd", p),
    ),
    "adafactor": lambda: optax.adafactor(1e-2, min_dim_size_to_factor=8),
}


def loss_fn(model, x):
    return jnp.mean((model(x) - x) ** 2)


@nnx.jit
def train_step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x)
    optimizer.update(model, grads)
    return loss


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_masked_multi_transform_and_adafactor_train_sharded_like_unsharded(name):
    mesh = create_device_mesh({"data": 2, "model": 4})

    def make():
        model = MLP(nnx.Rngs(0))
        return model, nnx.Optimizer(model, OPTIMIZERS[name](), wrt=nnx.Param)

    model, optimizer = create_sharded_model(make, mesh, fsdp_rules())
    assert model.up.kernel.get_value().sharding.spec == P("model", None)
    with nnx.use_eager_sharding(False):
        ref_model, ref_optimizer = make()
    # one step: it trains from the state create_sharded_model placed; later steps would start
    # from the state the jitted step placed (and compile it again for those shardings)
    xs = np.random.default_rng(0).normal(size=(1, 8, 16)).astype(np.float32)
    with jax.set_mesh(mesh):
        for x in xs:
            train_step(model, optimizer, jax.device_put(x, NamedSharding(mesh, P("data"))))
    for x in xs:
        train_step(ref_model, ref_optimizer, jnp.asarray(x))
    got, want = nnx.state((model, optimizer)), nnx.state((ref_model, ref_optimizer))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


def test_shard_model_places_masked_optimizer_state():
    mesh = create_device_mesh({"data": 2, "model": 4})
    with nnx.use_eager_sharding(False):
        model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, OPTIMIZERS["masked"](), wrt=nnx.Param)
    shard_model((model, optimizer), mesh, fsdp_rules())
    mu = optimizer.opt_state.inner_state[0].mu
    assert mu["up"]["kernel"].get_value().sharding.spec == P("model", None)
    assert not jax.tree.leaves(mu["up"]["bias"])  # the masked-out bias holds no array
    shardings = state_shardings(optimizer, mesh, fsdp_rules())
    assert len(jax.tree.leaves(shardings)) == len(jax.tree.leaves(nnx.state(optimizer)))


def test_optimizer_state_of_another_shape_is_replicated():
    mesh = create_device_mesh({"data": 2, "model": 4})
    with nnx.use_eager_sharding(False):
        model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, OPTIMIZERS["adafactor"](), wrt=nnx.Param)
    state = state_shardings(optimizer, mesh, fsdp_rules())["opt_state"][0]
    kernel = model.up.kernel.get_value()
    assert state["v_row"]["up"]["kernel"].get_value().spec == P()  # shape (16,) of a (16, 32)
    assert state["v_col"]["up"]["kernel"].get_value().spec == P()  # shape (32,)
    assert state["v"]["up"]["kernel"].get_value().spec == P()  # a shape-(1,) placeholder
    assert kernel.shape == (16, 32)
    adam = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    mu = state_shardings(adam, mesh, fsdp_rules())["opt_state"][0]["mu"]
    assert mu["up"]["kernel"].get_value().spec == P("model", None)  # same shape: follows


def test_annotation_longer_than_the_rank_is_refused():
    mesh = create_device_mesh({"data": 2, "model": 4})
    with pytest.raises(ShardingAnnotationError, match=r"names 3 dimensions .* shape \(8,\)"):
        logical_to_mesh_spec(("embed", None, None), {"embed": "model"}, mesh, shape=(8,))
    for names in [("mlp", None), (None, "mlp")]:
        with nnx.use_eager_sharding(False):
            layer = nnx.Linear(
                4,
                8,
                rngs=nnx.Rngs(0),
                bias_init=nnx.with_partitioning(nnx.initializers.zeros, names),
            )
        with pytest.raises(
            ShardingAnnotationError, match=r"^bias: annotation .* \(rank 1\)"
        ) as info:
            shard_model(layer, mesh, {"mlp": "model"})
        assert info.value.path == "bias"


def named_linear(sharding, in_features=8):
    with nnx.use_eager_sharding(False):
        return nnx.Linear(
            in_features,
            8,
            rngs=nnx.Rngs(0),
            kernel_init=nnx.with_partitioning(nnx.initializers.ones, sharding),
        )


def test_a_named_sharding_annotation_is_kept_on_its_own_mesh_and_checked_there():
    # an explicit placement (a stage pinned to some devices) is kept, whatever mesh is passed
    mesh_a = create_device_mesh({"model": 4}, devices=jax.devices()[4:])
    mesh_b = create_device_mesh({"data": 8})
    layer = shard_model(named_linear(NamedSharding(mesh_a, P(None, "model"))), mesh_b)
    kernel = layer.kernel.get_value()
    assert kernel.sharding == NamedSharding(mesh_a, P(None, "model"))
    assert kernel.addressable_shards[0].data.shape == (8, 2)
    assert layer.bias.get_value().sharding.device_set == set(jax.devices())
    mesh_a = create_device_mesh({"model": 8})
    with pytest.raises(ShardingAnnotationError, match="not divisible by 8"):
        shard_model(named_linear(NamedSharding(mesh_a, P("model")), 4), mesh_a)
    layer = shard_model(named_linear(NamedSharding(mesh_a, P(None, "model"))), mesh_a)
    assert layer.kernel.get_value().sharding == NamedSharding(mesh_a, P(None, "model"))


def test_a_named_sharding_annotation_naming_an_axis_only_its_own_mesh_has_is_kept():
    """Hostile finding: the docstring promised an error for an axis ``mesh`` lacks."""
    stage = create_device_mesh({"stage": 4}, devices=jax.devices()[:4])
    mesh = create_device_mesh({"data": 2, "model": 4})
    kept = NamedSharding(stage, P(None, "stage"))
    assert state_shardings(named_linear(kept), mesh)["kernel"].get_value() == kept


@pytest.mark.parametrize("devices", ["a stage", "another order"])
def test_create_sharded_model_refuses_a_variable_pinned_off_the_meshes_devices_by_name(devices):
    """Hostile finding: jax's "incompatible devices" at the build, naming no variable."""
    if devices == "a stage":
        pinned = create_device_mesh({"stage": 4}, devices=jax.devices()[:4])
    else:
        pinned = create_device_mesh({"stage": 8}, devices=jax.devices()[::-1])
    mesh = create_device_mesh({"data": 2, "model": 4})

    def make():
        return named_linear(NamedSharding(pinned, P(None, "stage")))

    ids = str([d.id for d in pinned.devices.flat]).replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(ShardingAnnotationError, match=rf"^kernel: .* devices {ids}.*shard_model"):
        create_sharded_model(make, mesh, fsdp_rules())
    layer = shard_model(make(), mesh, fsdp_rules())  # what the error points to: it places it
    assert layer.kernel.get_value().sharding == NamedSharding(pinned, P(None, "stage"))
