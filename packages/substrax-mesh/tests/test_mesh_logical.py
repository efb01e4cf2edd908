import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from substrax.mesh import (
    LogicalAxisRules,
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
    def __init__(self, rngs, width=64):
        self.up = nnx.Linear(
            16,
            width,
            rngs=rngs,
            kernel_init=partitioned(("embed", "mlp")),
            bias_init=nnx.with_partitioning(nnx.initializers.zeros, ("mlp",)),
        )
        self.down = nnx.Linear(width, 16, rngs=rngs, kernel_init=partitioned(("mlp", "embed")))

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


def make_mlp():
    with nnx.use_eager_sharding(False):
        return MLP(nnx.Rngs(0))


TP_RULES = LogicalAxisRules({"embed": None, "mlp": "model", "batch": "data"})


def test_logical_to_mesh_spec():
    mesh = create_device_mesh({"data": 2, "model": 4})
    assert logical_to_mesh_spec(("batch", "mlp"), TP_RULES, mesh) == P("data", "model")
    assert logical_to_mesh_spec(("embed", "mlp"), fsdp_rules(), mesh) == P("model", None)
    assert logical_to_mesh_spec(("data", None), {}, mesh) == P(
        "data", None
    )  # mesh axes pass through
    assert logical_to_mesh_spec((("batch", "mlp"),), TP_RULES, mesh) == P(("data", "model"))


def test_logical_to_mesh_spec_refusals_name_the_path():
    mesh = create_device_mesh({"data": 2, "model": 4})
    with pytest.raises(ShardingAnnotationError, match="up/kernel: logical axis 'vocab'") as info:
        logical_to_mesh_spec(("vocab",), TP_RULES, mesh, path="up/kernel")
    assert info.value.path == "up/kernel"
    with pytest.raises(ShardingAnnotationError, match="maps to 'tensor', which is not an axis"):
        logical_to_mesh_spec(("mlp",), {"mlp": "tensor"}, mesh)
    with pytest.raises(ShardingAnnotationError, match="not divisible by 4"):
        logical_to_mesh_spec(("mlp",), TP_RULES, mesh, shape=(6,))


def test_unconstrained_passes_through_a_spec_but_not_into_a_variables_placement():
    """Hostile finding: (P.UNCONSTRAINED, "embed") gave "'UnconstrainedSingleton' object is
    not iterable"."""
    mesh = create_device_mesh({"data": 2, "model": 4})
    spec = logical_to_mesh_spec((P.UNCONSTRAINED, "embed"), fsdp_rules(), mesh, shape=(3, 8))
    assert spec == P(P.UNCONSTRAINED, "model")
    with nnx.use_eager_sharding(False):
        layer = nnx.Linear(
            8, 8, rngs=nnx.Rngs(0), kernel_init=partitioned((P.UNCONSTRAINED, "mlp"))
        )
    with pytest.raises(ShardingAnnotationError, match=r"^kernel: .* UNCONSTRAINED.*None"):
        state_shardings(layer, mesh, fsdp_rules())


def test_state_shardings_follow_flax_annotations():
    mesh = create_device_mesh({"data": 2, "model": 4})
    shardings = state_shardings(make_mlp(), mesh, TP_RULES)
    assert shardings["up"]["kernel"].get_value() == NamedSharding(mesh, P(None, "model"))
    assert shardings["up"]["bias"].get_value().spec == P("model")
    assert shardings["down"]["kernel"].get_value().spec == P("model", None)
    assert shardings["down"]["bias"].get_value().spec == P()  # unannotated: replicated


def test_param_out_sharding_metadata_is_read_too():
    mesh = create_device_mesh({"model": 8})
    with nnx.use_eager_sharding(False):
        param = nnx.Param(jnp.ones((8, 2)), out_sharding=("rows", None))
    holder = nnx.Dict(w=param)
    assert state_shardings(holder, mesh, {"rows": "model"})["w"].get_value().spec == P(
        "model", None
    )


def test_fsdp_model_holds_one_eighth_of_each_large_parameter():
    mesh = create_device_mesh({"data": 1, "model": 8})
    model = shard_model(make_mlp(), mesh, fsdp_rules())
    for kernel in (model.up.kernel.get_value(), model.down.kernel.get_value()):
        shards = kernel.addressable_shards
        assert len(shards) == 8
        assert {s.data.size for s in shards} == {kernel.size // 8}
        assert sorted(s.index[0].start for s in shards) == list(
            range(0, kernel.shape[0], kernel.shape[0] // 8)
        )


def test_sharded_optimizer_state_follows_the_parameters():
    mesh = create_device_mesh({"data": 1, "model": 8})
    model = make_mlp()
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    shard_model((model, optimizer), mesh, fsdp_rules())
    mu = optimizer.opt_state[0].mu["up"]["kernel"].get_value()
    assert mu.sharding.spec == P("model", None)
    assert mu.addressable_shards[0].data.shape == (2, 64)


def test_tensor_parallel_mlp_matches_unsharded():
    mesh = create_device_mesh({"data": 2, "model": 4})
    reference = make_mlp()
    x = jax.random.normal(jax.random.key(1), (8, 16))
    expected = reference(x)
    sharded = shard_model(make_mlp(), mesh, TP_RULES)
    assert sharded.up.kernel.get_value().addressable_shards[0].data.shape == (16, 16)
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh):
        got = jax.jit(lambda m, v: m(v))(sharded, xs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_create_sharded_model_builds_in_place():
    mesh = create_device_mesh({"data": 2, "model": 4})
    model = create_sharded_model(lambda: MLP(nnx.Rngs(0)), mesh, TP_RULES)
    assert model.up.kernel.get_value().sharding.spec == P(None, "model")
    np.testing.assert_allclose(
        np.asarray(model.up.kernel.get_value()), np.asarray(make_mlp().up.kernel.get_value())
    )


def test_unknown_annotation_is_refused_with_path():
    mesh = create_device_mesh({"model": 8})
    with pytest.raises(ShardingAnnotationError, match=r"(up|down)/kernel: logical axis 'embed'"):
        state_shardings(make_mlp(), mesh, {"mlp": "model"})


@pytest.mark.parametrize("kind", ["ref", "hijax"])
def test_variables_holding_refs_or_hijax_values_are_refused_by_name(kind):
    mesh = create_device_mesh({"data": 2, "model": 4})

    def build():
        with nnx.var_defaults(**{kind: True}):
            return make_mlp()

    for who, call in [
        ("state_shardings", lambda: state_shardings(build(), mesh, TP_RULES)),
        ("shard_model", lambda: shard_model(build(), mesh, TP_RULES)),
    ] + (
        [("create_sharded_model", lambda: create_sharded_model(build, mesh, TP_RULES))]
        if kind == "ref"
        else []
    ):
        with pytest.raises(TypeError, match=rf"^{who} takes .*; down/bias holds a .*with_vars"):
            call()
