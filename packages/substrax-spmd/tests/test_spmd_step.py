import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from substrax.mesh import create_device_mesh, fsdp_rules, shard_model
from substrax.spmd import (
    EvalStep,
    TrainStep,
    create_data_parallel_sharding,
    make_train_step,
    place_batch_on_shards,
    place_nnx_state_on_shards,
    spmd_train_step,
)
from substrax.testing import TraceCounter, expect_compiles


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, width: int = 32):
        kernel = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))
        self.up = nnx.Linear(8, width, rngs=rngs, kernel_init=kernel)
        self.down = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


def momentum():
    """The optimizer of the steps compared with each other: SGD with momentum.

    Its update follows the gradient's scale (Adam's normalised one would hide a gradient off by
    a constant factor) and it keeps a state like the parameters; it compiles faster than Adam.
    """
    return optax.sgd(1e-2, momentum=0.9)


def mse(model, batch):
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


def make_mlp(seed: int = 0) -> MLP:
    with nnx.use_eager_sharding(False):
        return MLP(nnx.Rngs(seed))


def params_of(model):
    return {
        "/".join(map(str, k)): np.asarray(v.get_value())
        for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }


def assert_same(a, b, tol=1e-5):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=tol, atol=tol, err_msg=name)


def run_nnx_jit(host_batches, mesh=None):
    model = make_mlp()
    optimizer = nnx.Optimizer(model, momentum(), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, batch):
        return spmd_train_step(model, optimizer, mse, batch)

    losses = []
    if mesh is None:
        losses = [float(step(model, optimizer, b)) for b in host_batches]
        return losses, params_of(model)
    sharding = create_data_parallel_sharding(mesh)
    nnx.update(model, place_nnx_state_on_shards(nnx.state(model), mesh))
    nnx.update(optimizer, place_nnx_state_on_shards(nnx.state(optimizer), mesh))
    with jax.set_mesh(mesh):
        for b in host_batches:
            losses.append(float(step(model, optimizer, place_batch_on_shards(b, sharding))))
    assert model.up.kernel.get_value().sharding.spec == P()
    return losses, params_of(model)


@pytest.fixture(scope="module")
def single_device(host_batches):
    return run_nnx_jit(host_batches)


def test_data_parallel_step_equals_single_device_step(host_batches, single_device):
    losses, params = run_nnx_jit(host_batches, create_device_mesh({"data": 8}))
    np.testing.assert_allclose(losses, single_device[0], rtol=1e-5)
    assert_same(params, single_device[1])


def test_fast_step_on_one_device_matches_nnx_jit(host_batches, single_device):
    model = make_mlp()
    step = TrainStep(model, nnx.Optimizer(model, momentum(), wrt=nnx.Param), mse)
    with expect_compiles(1):
        losses = [float(step(b)) for b in host_batches]
    np.testing.assert_allclose(losses, single_device[0], rtol=1e-5)
    assert step.model is model
    assert_same(params_of(step.model), single_device[1])
    assert int(step.optimizer.step.get_value()) == 3


def test_fast_data_parallel_step_matches_and_compiles_once(host_batches, single_device):
    mesh = create_device_mesh({"data": 8})
    sharding = create_data_parallel_sharding(mesh)
    counter = TraceCounter()
    model = make_mlp()
    step = make_train_step(
        model,
        nnx.Optimizer(model, momentum(), wrt=nnx.Param),
        counter.wrap(mse),
        mesh=mesh,
        batch_sharding=sharding,
    )
    placed = [place_batch_on_shards(b, sharding) for b in host_batches]
    with counter.expect(new_traces=1), expect_compiles(1):
        losses = [step(b) for b in placed]
    np.testing.assert_allclose([float(x) for x in losses], single_device[0], rtol=1e-5)
    assert_same(params_of(step.model), single_device[1])
    assert step.model.up.kernel.get_value().sharding == NamedSharding(mesh, P())
    # a host (numpy) batch is placed on the batch sharding first, without a new compile
    with expect_compiles(0):
        step(host_batches[0])


def test_a_named_batch_sharding_gives_the_mesh_when_none_is_passed(host_batches, single_device):
    # the state stayed on one device and every call failed with jax's "incompatible devices"
    mesh = create_device_mesh({"data": 8})
    model = make_mlp()
    step = TrainStep(
        model,
        nnx.Optimizer(model, momentum(), wrt=nnx.Param),
        mse,
        batch_sharding=create_data_parallel_sharding(mesh),
    )
    assert step.mesh is mesh
    losses = [float(step(b)) for b in host_batches]
    np.testing.assert_allclose(losses, single_device[0], rtol=1e-5)
    assert step.model.up.kernel.get_value().sharding == NamedSharding(mesh, P())
    assert step.cost(host_batches[0]).flops > 0


def test_a_batch_sharding_naming_two_meshes_is_refused_at_construction():
    # it was taken, and the first call failed with jax's "incompatible devices"
    devices = np.asarray(jax.devices())
    first = jax.sharding.Mesh(devices[:4], ("data",))
    second = jax.sharding.Mesh(devices[4:], ("data",))
    model = make_mlp()
    with pytest.raises(ValueError, match=r"batch_sharding names 2 meshes .*same mesh"):
        TrainStep(
            model,
            nnx.Optimizer(model, momentum(), wrt=nnx.Param),
            mse,
            batch_sharding={
                "x": NamedSharding(first, P("data")),
                "y": NamedSharding(second, P("data")),
            },
        )


def test_donation_invalidates_old_buffers_until_sync(host_batches):
    model = make_mlp()
    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), mse)
    before = model.up.kernel.get_value()
    step(host_batches[0])
    assert before.is_deleted()
    assert model.up.kernel.get_value().is_deleted()  # stale until synced
    step.sync()
    assert not model.up.kernel.get_value().is_deleted()
    assert model.up.kernel.get_value() is step.state[0]["up"]["kernel"].get_value()


def test_a_checkpoint_restored_after_the_step_is_built_is_what_it_trains_on(host_batches):
    trained = make_mlp(seed=1)
    trained_opt = nnx.Optimizer(trained, momentum(), wrt=nnx.Param)
    warm = TrainStep(trained, trained_opt, mse)
    for batch in host_batches[:2]:
        warm(batch)
    saved = jax.tree.map(np.asarray, nnx.state((warm.model, warm.optimizer)))

    # the reference: the saved state trained on, in the step that saved it
    expected = [float(warm(b)) for b in host_batches[2:]]

    # the finding: build the step, then restore into the objects it was built on
    model = make_mlp()
    optimizer = nnx.Optimizer(model, momentum(), wrt=nnx.Param)
    step = TrainStep(model, optimizer, mse)
    nnx.update((model, optimizer), jax.tree.map(jax.numpy.asarray, saved))
    losses = [float(step(b)) for b in host_batches[2:]]
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    # the next access writes the trained state, not the state the step was built with
    assert_same(params_of(step.model), params_of(warm.model))
    assert int(step.optimizer.step.get_value()) == 2 + len(host_batches[2:])


@pytest.mark.parametrize("donate", [True, False])
def test_a_restore_into_the_objects_between_steps_is_what_the_next_step_trains_on(
    host_batches, donate
):
    """Hostile finding: after the first step, a restore written into the objects passed in
    (not synced) was ignored by the next step, and a later ``step.model`` overwrote it."""
    saved = jax.tree.map(np.asarray, nnx.state(make_mlp(seed=7)))
    # a step returns the loss before its update: the restored model's loss on the batch
    expected = float(mse(make_mlp(seed=7), host_batches[1]))

    model = make_mlp()
    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), mse, donate=donate)
    step(host_batches[0])
    nnx.update(model, jax.tree.map(jax.numpy.asarray, saved))  # the object passed in
    assert_same(params_of(step.model), params_of(make_mlp(seed=7)))  # an access keeps it
    np.testing.assert_allclose(float(step(host_batches[1])), expected, rtol=1e-6)


def test_an_eval_step_over_a_train_step_sees_a_restore_before_the_next_train_step(host_batches):
    """Hostile finding: ``EvalStep(step)`` evaluated the step's stale state after a restore
    into ``step.model``, until the next train step read it back."""
    model = make_mlp()
    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), mse)
    step(host_batches[0])
    evaluate = EvalStep(step, lambda m, b: {"loss": mse(m, b)})
    restored = make_mlp(seed=7)
    nnx.update(step.model, jax.tree.map(jax.numpy.copy, nnx.state(restored)))
    expected = float(mse(restored, host_batches[1]))
    np.testing.assert_allclose(float(evaluate(host_batches[1])["loss"]), expected, rtol=1e-6)


def test_without_donation_old_buffers_survive(host_batches):
    model = make_mlp()
    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), mse, donate=False)
    before = model.up.kernel.get_value()
    step(host_batches[0])
    assert not before.is_deleted()


def test_has_aux(host_batches):
    def loss_with_aux(model, batch):
        pred = model(batch["x"])
        return ((pred - batch["y"]) ** 2).mean(), {"mean_pred": pred.mean()}

    model = make_mlp()
    step = TrainStep(
        model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), loss_with_aux, has_aux=True
    )
    loss, aux = step(host_batches[0])
    assert loss.shape == ()
    assert set(aux) == {"mean_pred"}


def test_fsdp_state_stays_sharded_and_compiles_once(host_batches, single_device):
    mesh = create_device_mesh({"data": 2, "model": 4})
    model = make_mlp()
    optimizer = nnx.Optimizer(model, momentum(), wrt=nnx.Param)
    shard_model((model, optimizer), mesh, fsdp_rules())
    sharding = create_data_parallel_sharding(mesh)
    step = TrainStep(model, optimizer, mse, batch_sharding=sharding)
    assert step.mesh == mesh
    placed = [place_batch_on_shards(b, sharding) for b in host_batches]
    with expect_compiles(1):
        losses = [float(step(b)) for b in placed]
    np.testing.assert_allclose(losses, single_device[0], rtol=1e-5)
    assert_same(params_of(step.model), single_device[1])
    kernel = step.model.up.kernel.get_value()
    assert kernel.sharding.spec == P("model", None)
    assert kernel.addressable_shards[0].data.shape == (2, 32)
    trace = step.optimizer.opt_state[0].trace["up"]["kernel"].get_value()
    assert trace.sharding.spec == P("model", None)


def test_batch_stats_and_rng_state_advance_and_compile_once(new_stateful, host_batches):
    model = new_stateful()
    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(1e-2), wrt=nnx.Param), mse)
    placed = [jax.device_put(b) for b in host_batches]
    mean_before = np.asarray(model.norm.mean.get_value()).copy()
    with expect_compiles(1):
        losses = [float(step(b)) for b in placed]
    assert len(set(losses)) == 3
    synced = step.model
    assert not np.allclose(
        np.asarray(synced.norm.mean.get_value()), mean_before
    )  # BatchStat updated
    assert int(synced.drop.rngs.count.get_value()) == 3  # one dropout key per step


@pytest.mark.parametrize("masked", ["masked", "multi_transform"])
def test_an_optimizer_with_masked_state_still_reads_a_restore_and_a_new_learning_rate(masked):
    def kernels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "kernel" in jax.tree_util.keystr(path), params
        )

    adam = optax.inject_hyperparams(optax.adam)(learning_rate=0.1)
    if masked == "masked":
        transform = optax.masked(adam, kernels)
    else:
        transform = optax.multi_transform(
            {"train": adam, "frozen": optax.set_to_zero()},
            lambda p: jax.tree.map(lambda k: "train" if k else "frozen", kernels(p)),
        )
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    step = TrainStep(
        model,
        nnx.Optimizer(model, transform, wrt=nnx.Param),
        lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
    )
    batch = {"x": np.ones((4, 3), np.float32), "y": np.zeros((4, 2), np.float32)}
    nnx.update(model, {"kernel": np.full((3, 2), 5.0, np.float32), "bias": np.zeros(2, np.float32)})
    assert float(step(batch)) == pytest.approx(225.0)  # the restore, not the initial kernel
    kernel = np.asarray(step.model.kernel.get_value())
    hyperparams = jax.tree.leaves(
        step.optimizer.opt_state, is_leaf=lambda x: hasattr(x, "hyperparams")
    )
    state = next(x for x in hyperparams if hasattr(x, "hyperparams"))
    state.hyperparams["learning_rate"].set_value(jax.numpy.asarray(0.0))
    step(batch)
    np.testing.assert_array_equal(np.asarray(step.model.kernel.get_value()), kernel)
