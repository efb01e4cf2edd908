"""TrainStep's parts work together and refuse mistakes (issue 12), on 8 emulated devices."""

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
    BatchSplitError,
    EvalStep,
    OptimizerMismatchError,
    TrainStep,
    UnknownAxisError,
    create_data_parallel_sharding,
    place_batch_on_shards,
    reduce_mean_collective,
    spmd_train_step,
)
from substrax.testing import expect_compiles


def mse(model, batch):
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


def host_batch(rows: int = 16):
    rng = np.random.default_rng(rows)
    return {
        "x": rng.normal(size=(rows, 4)).astype(np.float32),
        "y": rng.normal(size=(rows, 1)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def mesh():
    return create_device_mesh({"data": 8})


def data_parallel_step(mesh, loss_fn=mse, **kwargs):
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    kwargs.setdefault("batch_sharding", create_data_parallel_sharding(mesh))
    return TrainStep(model, optimizer, loss_fn, mesh=mesh, **kwargs)


# --- batches are placed on batch_sharding, whatever they arrive as --------------------------


def test_a_batch_of_replicated_jax_arrays_still_runs_data_parallel(mesh):
    seen = []

    def loss_fn(model, batch):
        jax.debug.inspect_array_sharding(batch["x"], callback=seen.append)
        return mse(model, batch)

    step = data_parallel_step(mesh, loss_fn)
    replicated = jax.device_put(host_batch(), NamedSharding(mesh, P()))
    on_one_device = jax.device_put(host_batch(), jax.devices()[3])
    placed = place_batch_on_shards(host_batch(), create_data_parallel_sharding(mesh))
    batches = (replicated, on_one_device, placed, host_batch())
    for batch in batches:  # compiles the step, and jax's resharding of the first two
        step(batch)
    with expect_compiles(0):
        for batch in batches:
            step(batch)
    assert len(seen) == 1  # one trace, and in it the batch is split over the data axis
    assert seen[0].is_equivalent_to(NamedSharding(mesh, P("data")), 2)


@pytest.mark.parametrize("as_jax", [True, False], ids=["jax-array", "numpy"])
def test_a_batch_the_data_axis_does_not_divide_is_refused_naming_the_leaf(mesh, as_jax):
    step = data_parallel_step(mesh)
    batch = host_batch(12)
    if as_jax:
        batch = jax.device_put(batch)
    with pytest.raises(BatchPlacementError) as info:
        step(batch)
    assert info.value.path in ("['x']", "['y']")
    assert info.value.shape[0] == 12
    assert "(12) 8 ways over mesh axis 'data' (8)" in str(info.value)
    assert "multiple" in str(info.value)


@pytest.mark.parametrize(
    ("options", "rows", "error", "start"),
    [
        ({}, np.ones((12, 4), np.float32), BatchPlacementError, "the batch has shape (12, 4)"),
        (
            {"accumulate_steps": 3},
            np.ones((16, 4), np.float32),
            BatchSplitError,
            "the batch of shape (16, 4) is 16 rows",
        ),
        (
            {"steps_per_call": 2, "batch_sharding": None},
            np.ones((16, 4), np.float32),
            BatchSplitError,
            "the batch of shape (16, 4) does not hold",
        ),
    ],
    ids=["placement", "accumulate", "steps_per_call"],
)
def test_a_bare_array_batch_is_named_the_batch(mesh, options, rows, error, start):
    step = data_parallel_step(mesh, lambda m, x: (m(x) ** 2).mean(), **options)
    with pytest.raises(error) as info:
        step(rows)
    assert str(info.value).startswith(start)
    assert info.value.path == ""  # the key path of a batch that is one array


def test_a_text_leaf_in_a_batch_is_refused_naming_it(mesh):
    """Hostile finding: jax's error named a private closure (TrainStep.__init__.<locals>.pure)."""
    step = data_parallel_step(mesh)
    evaluate = EvalStep(step, lambda m, b: {"mse": mse(m, b)})
    for call in (step, evaluate, data_parallel_step(mesh, batch_sharding=None)):
        with pytest.raises(TypeError, match=r"batch leaf \['split'\] is the str 'train'; a comp"):
            call({**host_batch(), "split": "train"})
    step(host_batch())  # the step is still usable


def test_place_batch_on_shards_keeps_placed_arrays_and_reshards_others(mesh):
    sharding = create_data_parallel_sharding(mesh)
    placed = place_batch_on_shards(host_batch(), sharding)
    again = place_batch_on_shards(placed, sharding)
    assert again["x"] is placed["x"]
    moved = place_batch_on_shards(jax.device_put(host_batch(), NamedSharding(mesh, P())), sharding)
    assert moved["x"].sharding.is_equivalent_to(sharding, 2)
    np.testing.assert_array_equal(np.asarray(moved["x"]), host_batch()["x"])


# --- a PartitionSpec where a sharding is expected -------------------------------------------


def test_a_partition_spec_batch_sharding_is_taken_on_the_steps_mesh(mesh):
    seen = []

    def loss_fn(model, batch):
        jax.debug.inspect_array_sharding(batch["x"], callback=seen.append)
        return mse(model, batch)

    step = data_parallel_step(mesh, loss_fn, batch_sharding=P("data"))
    step(jax.device_put(host_batch()))
    assert seen[0].is_equivalent_to(NamedSharding(mesh, P("data")), 2)


def test_a_partition_spec_without_a_mesh_is_refused_with_the_fix():
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    with pytest.raises(TypeError, match=r"NamedSharding\(mesh, P\('data',\)\)"):
        TrainStep(model, optimizer, mse, batch_sharding=P("data"))
    with pytest.raises(TypeError, match=r"is a PartitionSpec, not a sharding: wrap it"):
        place_batch_on_shards(host_batch(), P("data"))
    with pytest.raises(TypeError, match=r"is a PartitionSpec, not a sharding: wrap it"):
        place_batch_on_shards(host_batch(), {"x": P("data"), "y": P()})


# --- the model and its optimizer must belong together ---------------------------------------


def test_an_optimizer_built_for_another_model_is_refused_naming_the_leaf():
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    other = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(other, optax.adam(1e-2), wrt=nnx.Param)
    with pytest.raises(OptimizerMismatchError) as info:
        TrainStep(model, optimizer, mse)
    assert info.value.path == "[0].mu['bias']"
    assert (info.value.model_shape, info.value.optimizer_shape) == ((1,), (3,))
    assert "nnx.Optimizer(model" in str(info.value)
    assert model.kernel.get_value().shape == (4, 1)


def test_spmd_train_step_refuses_an_optimizer_built_for_another_model_too():
    # it raised jax's raw "add got incompatible shapes" from inside the update
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.adam(1e-2), wrt=nnx.Param)
    batch = {"x": jnp.ones((8, 4)), "y": jnp.zeros((8, 1))}
    step = nnx.jit(lambda m, o, b: spmd_train_step(m, o, mse, b))
    for run in (step, lambda m, o, b: spmd_train_step(m, o, mse, b)):  # traced, and eager
        with pytest.raises(OptimizerMismatchError, match=r"\[0\]\.mu\['bias'\]"):
            run(model, optimizer, batch)
    own = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    assert float(step(model, own, batch)) > float(step(model, own, batch))


def test_an_optimizer_for_a_model_with_other_parameters_is_refused():
    class Two(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(4, 1, rngs=rngs)
            self.b = nnx.Linear(1, 1, rngs=rngs)

        def __call__(self, x):
            return self.b(self.a(x))

    model = Two(nnx.Rngs(0))
    optimizer = nnx.Optimizer(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), optax.adam(1e-2), wrt=nnx.Param)
    with pytest.raises(OptimizerMismatchError, match=r"\['bias'\].*the model needs.*\['a'\]"):
        TrainStep(model, optimizer, mse)


# --- loss_fn output against has_aux ---------------------------------------------------------


def test_has_aux_with_a_scalar_loss_says_to_return_a_pair(mesh):
    step = data_parallel_step(mesh, has_aux=True)
    with pytest.raises(TypeError, match=r"must return a pair \(loss, aux\).*shape \(\)"):
        step(host_batch())


def test_a_pair_without_has_aux_says_to_pass_it(mesh):
    step = data_parallel_step(mesh, lambda m, b: (mse(m, b), {"n": 1.0}))
    with pytest.raises(TypeError, match=r"pass has_aux=True"):
        step(host_batch())


# --- collectives on a mesh without their default axis name ----------------------------------


def test_reduce_mean_collective_names_the_axes_it_could_use(mesh):
    def per_shard(x):
        return reduce_mean_collective({"x": x})["x"]

    mapped = jax.shard_map(per_shard, mesh=mesh, in_specs=P("data"), out_specs=P())
    with pytest.raises(UnknownAxisError) as info:
        mapped(jnp.arange(8.0))
    assert (info.value.axis_name, info.value.available) == ("batch", ("data",))
    assert "('data',)" in str(info.value)
    fixed = jax.shard_map(
        lambda x: reduce_mean_collective({"x": x}, axis_name="data")["x"],
        mesh=mesh,
        in_specs=P("data"),
        out_specs=P(),
    )
    assert float(fixed(jnp.arange(8.0))[0]) == 3.5


# --- changes made to the synced objects reach the compiled step -----------------------------


def linear_loss(model, batch):
    return model(batch["x"]).sum()  # its gradient does not depend on the parameters


def test_a_hyperparameter_set_between_steps_reaches_the_step_without_a_recompile(mesh):
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
    step = TrainStep(
        model,
        nnx.Optimizer(model, tx, wrt=nnx.Param),
        linear_loss,
        mesh=mesh,
        batch_sharding=create_data_parallel_sharding(mesh),
    )
    batch = {"x": np.ones((8, 4), np.float32)}
    with expect_compiles(1):
        before = np.asarray(step.model.kernel.get_value())
        step(batch)
        after_one = np.asarray(model.kernel.get_value())  # kept live once synced
        step.optimizer.opt_state.hyperparams["learning_rate"].set_value(jnp.float32(0.025))
        step(batch)
        after_two = np.asarray(model.kernel.get_value())
    np.testing.assert_allclose(before - after_one, 0.8, rtol=1e-6)
    np.testing.assert_allclose(after_one - after_two, 0.2, rtol=1e-6)
    lr = step.optimizer.opt_state.hyperparams["learning_rate"].get_value()
    assert lr.sharding == NamedSharding(mesh, P())


def test_a_parameter_set_to_another_shape_is_refused(mesh):
    step = data_parallel_step(mesh)
    step.model.kernel.set_value(jnp.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"model\['kernel'\] was set to shape \(4, 3\).*\(4, 1\)"):
        step(host_batch())


@pytest.mark.parametrize("kind", ["ref", "hijax"])
def test_variables_holding_refs_or_hijax_values_are_refused_by_name(kind, mesh):
    with nnx.var_defaults(**{kind: True}):  # flax's switches; jax.jit cannot return a Ref
        model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    wanted = r"TrainStep takes Variables that hold arrays; bias holds a .*nnx\.with_vars"
    with pytest.raises(TypeError, match=wanted):
        TrainStep(model, optimizer, mse)
    evaluate = (
        EvalStep(model, lambda m, b: {"loss": mse(m, b)}, mesh=mesh) if kind == "hijax" else None
    )
    if kind == "ref":  # jax.jit takes a Ref without a mesh, not placed on one
        with pytest.raises(TypeError, match=r"^EvalStep with a mesh takes Variables that hold"):
            EvalStep(model, lambda m, b: {"loss": mse(m, b)}, mesh=mesh)
    converted = nnx.with_vars(model, ref=False, hijax=False)
    expected = EvalStep(converted, lambda m, b: {"loss": mse(m, b)})(host_batch())["loss"]
    assert EvalStep(model, lambda m, b: {"loss": mse(m, b)})(host_batch())["loss"] == expected
    if evaluate is not None:
        np.testing.assert_allclose(evaluate(host_batch())["loss"], expected, rtol=1e-6)
    step = TrainStep(converted, nnx.Optimizer(converted, optax.sgd(0.1), wrt=nnx.Param), mse)
    assert np.isfinite(float(step(host_batch())))
