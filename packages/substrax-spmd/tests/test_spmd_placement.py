import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from substrax.mesh import create_device_mesh
from substrax.spmd import (
    BatchPlacementError,
    TrainStep,
    create_data_parallel_sharding,
    place_batch_on_shards,
    place_nnx_state_on_shards,
)


@pytest.fixture(scope="module")
def mesh():
    return create_device_mesh({"data": 8})


def test_create_data_parallel_sharding(mesh):
    sharding = create_data_parallel_sharding(mesh)
    assert sharding == NamedSharding(mesh, P("data"))
    hybrid = create_device_mesh({"batch": 2, "model": 4})
    assert create_data_parallel_sharding(hybrid, "batch").spec == P("batch")
    with pytest.raises(ValueError, match="data_axis 'data' is not an axis of the mesh"):
        create_data_parallel_sharding(hybrid)


def test_every_array_kind_is_placed_and_other_leaves_pass(mesh):
    sharding = create_data_parallel_sharding(mesh)
    batch = {
        "x": np.arange(16.0).reshape(8, 2),
        "y": jnp.arange(8),
        "tag": "train",
        "n": 3,
        "nested": [np.ones((16,), np.int32)],
    }
    placed = place_batch_on_shards(batch, sharding)
    assert placed["tag"] == "train"
    assert placed["n"] == 3
    for leaf in (placed["x"], placed["y"], placed["nested"][0]):
        assert isinstance(leaf, jax.Array)
        assert leaf.sharding == sharding
    assert placed["x"].addressable_shards[0].data.shape == (1, 2)
    np.testing.assert_array_equal(np.asarray(placed["x"]), batch["x"])


def test_pytree_prefix_of_shardings(mesh):
    sharding = create_data_parallel_sharding(mesh)
    replicated = NamedSharding(mesh, P())
    batch = {
        "rows": {"x": np.ones((8, 3)), "y": np.zeros(8)},
        "batch_state": {"lam": np.float32(0.5)},
    }
    placed = place_batch_on_shards(batch, {"rows": sharding, "batch_state": replicated})
    assert placed["rows"]["x"].sharding == sharding
    assert placed["rows"]["y"].sharding == sharding
    lam = placed["batch_state"]["lam"]
    assert lam.sharding == replicated
    assert lam.shape == ()
    assert float(lam) == 0.5


def test_a_scalar_under_the_data_sharding_is_refused_with_its_path(mesh):
    sharding = create_data_parallel_sharding(mesh)
    with pytest.raises(BatchPlacementError) as info:
        place_batch_on_shards({"rows": {"x": np.ones((8, 3))}, "lam": np.float32(0.5)}, sharding)
    assert info.value.path == "['lam']"
    assert info.value.shape == ()
    assert (
        "batch leaf ['lam'] has shape () but its sharding P('data',) names 1 dimension(s)"
        in str(info.value)
    )
    assert isinstance(info.value, ValueError)


def test_a_leaf_with_fewer_dimensions_than_the_spec_names_is_refused_with_its_path(mesh):
    # a migrant's finding: P("data", None) on a rank-1 leaf got jax's error, which names no leaf
    sharding = NamedSharding(mesh, P("data", None))
    with pytest.raises(BatchPlacementError) as info:
        place_batch_on_shards({"a": {"b": np.ones(8)}, "c": np.ones((8, 3))}, sharding)
    assert info.value.path == "['a']['b']"
    assert "has shape (8,) but its sharding P('data', None) names 2 dimension(s)" in str(info.value)


def test_refusal_through_a_prefix_names_the_full_path(mesh):
    two_d = NamedSharding(create_device_mesh({"data": 2, "model": 4}), P(None, "model"))
    with pytest.raises(BatchPlacementError, match=r"\['rows'\]\['y'\] has shape \(8,\)"):
        place_batch_on_shards({"rows": {"x": np.ones((8, 4)), "y": np.ones(8)}}, {"rows": two_d})


def test_placement_is_one_device_put_call(mesh, monkeypatch):
    calls = []
    real = jax.device_put

    def spy(data, *args, **kwargs):
        calls.append(len(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(jax, "device_put", spy)
    place_batch_on_shards(
        {"a": np.ones(8), "b": np.ones((8, 2)), "c": "s"}, create_data_parallel_sharding(mesh)
    )
    assert calls == [
        2
    ]  # both arrays in one call; several processes use make_array_from_process_local_data


def test_a_64_bit_leaf_jax_would_narrow_out_of_range_is_refused_naming_it(mesh):
    """Hostile finding: with x64 off, int64 ids of 2**40 were placed as int32 0..7, silently."""
    from substrax.devices import BatchDtypeError

    sharding = create_data_parallel_sharding(mesh)
    ids = np.arange(8, dtype=np.int64)
    with pytest.raises(BatchDtypeError, match=r"batch leaf \['ids'\] is int64 with values"):
        place_batch_on_shards({"x": np.ones((8, 2), np.float32), "ids": ids + 2**40}, sharding)
    placed = place_batch_on_shards({"ids": ids}, sharding)  # values that fit: placed as before
    assert np.asarray(placed["ids"]).tolist() == list(range(8))


def test_a_batch_without_arrays_comes_back_as_is(mesh):
    batch = {"tag": "x"}
    assert place_batch_on_shards(batch, create_data_parallel_sharding(mesh)) is batch


def test_place_nnx_state_replicates_by_default(mesh):
    state = nnx.state(nnx.Linear(4, 8, rngs=nnx.Rngs(0)))
    placed = place_nnx_state_on_shards(state, mesh)
    kernel = placed["kernel"].get_value()
    assert kernel.sharding == NamedSharding(mesh, P())
    np.testing.assert_array_equal(np.asarray(kernel), np.asarray(state["kernel"].get_value()))


def test_place_nnx_state_by_filter_and_state_sharding():
    mesh = create_device_mesh({"model": 4})
    state = nnx.state(nnx.Linear(4, 8, rngs=nnx.Rngs(0)))
    by_map = place_nnx_state_on_shards(state, mesh, {nnx.PathContains("kernel"): P(None, "model")})
    assert by_map["kernel"].get_value().addressable_shards[0].data.shape == (4, 2)
    assert by_map["bias"].get_value().sharding.spec == P()
    by_state_sharding = place_nnx_state_on_shards(
        state, mesh, nnx.StateSharding({nnx.PathContains("bias"): NamedSharding(mesh, P("model"))})
    )
    assert by_state_sharding["bias"].get_value().addressable_shards[0].data.shape == (2,)
    assert by_state_sharding["kernel"].get_value().sharding.spec == P()


def test_a_prefix_with_a_none_or_a_missing_key_is_refused_naming_the_path(mesh):
    """Hostile finding: both gave jax's raw pytree structure error, naming no leaf."""
    sharding = create_data_parallel_sharding(mesh)
    batch = {"x": np.ones((8, 4), np.float32), "y": np.zeros((8, 2), np.float32)}
    with pytest.raises(TypeError, match=r"batch_sharding\['y'\] is None; .*PartitionSpec\(\)"):
        place_batch_on_shards(batch, {"x": sharding, "y": None})
    with pytest.raises(ValueError, match=r"batch leaf \['y'\] has no sharding in batch_sharding"):
        place_batch_on_shards(batch, {"x": sharding})
    extra = {"x": sharding, "y": sharding, "z": sharding}
    with pytest.raises(ValueError, match=r"batch_sharding\['z'\] names a part the batch does not"):
        place_batch_on_shards(batch, extra)


def test_a_train_step_refuses_a_none_in_its_batch_sharding_when_built(mesh):
    model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    sharding = create_data_parallel_sharding(mesh)
    with pytest.raises(TypeError, match=r"batch_sharding\['y'\] is None"):
        TrainStep(
            model,
            optimizer,
            lambda m, b: m(b["x"]).sum(),
            batch_sharding={"x": sharding, "y": None},
        )


@pytest.mark.parametrize(
    ("picked", "match"),
    [
        (nnx.RngCount, r"rngs/count has shape \(\) but its sharding P\('data',\) names 1 dim"),
        (nnx.PathContains("kernel"), r"0/kernel has shape \(8, 6\) .* 8 does not divide 6"),
    ],
    ids=["scalar", "indivisible"],
)
def test_place_nnx_state_refuses_a_spec_the_variable_cannot_take_naming_it(mesh, picked, match):
    """Hostile finding: a spec on a 0-d value gave a raw jax error, naming no variable."""
    model = nnx.Sequential(nnx.Linear(8, 6, rngs=nnx.Rngs(0)), nnx.Dropout(0.1, rngs=nnx.Rngs(1)))
    spec = P("data") if picked is nnx.RngCount else P(None, "data")
    rules = {picked: spec}
    with pytest.raises(ValueError, match=match):
        place_nnx_state_on_shards(nnx.state(model), mesh, rules)


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        (P("nope", None), ValueError, r"kernel matches filter .*names axes \['nope'\] that the"),
        ("model", TypeError, r"kernel matches filter .*the str 'model'.*PartitionSpec\('model'\)"),
        (("model", None), TypeError, r"kernel matches filter .*the tuple"),
    ],
    ids=["missing axis", "bare string", "tuple"],
)
def test_place_nnx_state_refuses_a_filter_spec_naming_the_variable(spec, error, match):
    """Hostile finding: jax's "Resource axis ... not found" and an AttributeError on a str,
    naming no variable."""
    mesh = create_device_mesh({"data": 2, "model": 4})
    state = nnx.state(nnx.Linear(16, 64, rngs=nnx.Rngs(0)))
    with pytest.raises(error, match=match):
        place_nnx_state_on_shards(state, mesh, {nnx.PathContains("kernel"): spec})


def test_place_nnx_state_keeps_a_sharding_on_another_mesh_there():
    mesh = create_device_mesh({"data": 2, "model": 4})
    other = NamedSharding(create_device_mesh({"x": 4}), P(None, "x"))
    state = nnx.state(nnx.Linear(16, 64, rngs=nnx.Rngs(0)))
    placed = place_nnx_state_on_shards(state, mesh, {nnx.PathContains("kernel"): other})
    assert placed["kernel"].get_value().sharding == other  # as documented
    assert placed["bias"].get_value().sharding == NamedSharding(mesh, P())


def test_inside_jit_a_leaf_is_checked_and_returned_as_it_is_not_placed(mesh):
    """The spec: "inside a traced function the result is not placed on sharding"."""
    sharding = create_data_parallel_sharding(mesh)

    @jax.jit
    def double(x):
        batch = {"x": x, "name": "b0"}
        placed = place_batch_on_shards(batch, sharding)
        assert placed["x"] is x  # the tracer itself
        assert placed["name"] == "b0"
        return placed["x"] * 2

    np.testing.assert_array_equal(double(jnp.ones((8, 2))), np.full((8, 2), 2.0))
    with pytest.raises(BatchPlacementError, match=r"batch leaf \['x'\] has shape \(\)"):
        jax.jit(lambda b: place_batch_on_shards(b, sharding))({"x": jnp.float32(1.0)})


def test_inside_shard_map_a_shard_s_rows_are_not_refused_as_indivisible(mesh):
    sharding = create_data_parallel_sharding(mesh)

    def per_device(x):  # a (1, 2) shard on each of the 8 devices
        return place_batch_on_shards({"x": x}, sharding)["x"] + 1

    mapped = jax.shard_map(per_device, mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    np.testing.assert_array_equal(jax.jit(mapped)(jnp.zeros((8, 2))), np.ones((8, 2)))
