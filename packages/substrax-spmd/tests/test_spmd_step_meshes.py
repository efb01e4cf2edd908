"""A TrainStep's state and batches on meshes that disagree: warned of or refused by name."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from substrax.mesh import create_device_mesh, fsdp_rules, shard_model
from substrax.spmd import BatchPlacementError, TrainStep, create_data_parallel_sharding


def annotated(names):
    return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.up = nnx.Linear(16, 64, kernel_init=annotated(("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(64, 16, kernel_init=annotated(("mlp", "embed")), rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


def squares(model, batch):
    return jnp.mean(model(batch) ** 2)


def _built(shard_optimizer_too: bool):
    mesh = create_device_mesh({"data": 2, "model": 4})
    with nnx.use_eager_sharding(False):
        model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    shard_model((model, optimizer) if shard_optimizer_too else model, mesh, fsdp_rules())
    return mesh, model, optimizer


WARNING = "substrax.spmd._step_state"


def test_an_optimizer_state_not_split_as_its_parameter_is_warned_of_by_name(caplog):
    """Hostile finding: Adam's moments built before shard_model(model) were replicated
    silently, twice the parameters' memory on every device."""
    mesh, model, optimizer = _built(shard_optimizer_too=False)
    with caplog.at_level(logging.WARNING, logger=WARNING):
        TrainStep(model, optimizer, squares, batch_sharding=create_data_parallel_sharding(mesh))
    [record] = [r for r in caplog.records if r.name == WARNING]
    assert "optimizer.opt_state[0].mu.up.kernel" in record.getMessage()
    assert "model.up.kernel" not in record.getMessage()  # the parameter itself stays split


def test_state_sharded_alike_is_not_warned_of(caplog):
    mesh, model, optimizer = _built(shard_optimizer_too=True)
    with caplog.at_level(logging.WARNING, logger=WARNING):
        TrainStep(model, optimizer, squares, batch_sharding=create_data_parallel_sharding(mesh))
    assert not [r for r in caplog.records if r.name == WARNING]


def test_split_state_replicated_onto_a_smaller_mesh_is_warned_of(caplog):
    """Hostile finding: mesh= over 4 devices took an 8-device FSDP kernel to P(), silently."""
    _, model, optimizer = _built(shard_optimizer_too=True)
    small = create_device_mesh({"data": 4}, devices=jax.devices()[:4])
    with caplog.at_level(logging.WARNING, logger=WARNING):
        TrainStep(model, optimizer, squares, mesh=small)
    [record] = [r for r in caplog.records if r.name == WARNING]
    assert "model.up.kernel" in record.getMessage()


def test_a_batch_sharding_on_other_devices_is_refused_naming_both():
    """Hostile finding: jax's raw 'incompatible devices' at the first call."""
    _, model, optimizer = _built(shard_optimizer_too=True)
    small = create_device_mesh({"data": 4}, devices=jax.devices()[:4])
    with pytest.raises(
        ValueError, match=r"devices \[0, 1, 2, 3\] but .* devices \[0, 1, 2, 3, 4, 5, 6, 7\]"
    ):
        TrainStep(model, optimizer, squares, batch_sharding=create_data_parallel_sharding(small))


def test_a_batch_sharding_on_the_same_devices_in_another_shape_still_trains():
    _, model, optimizer = _built(shard_optimizer_too=True)
    flat = create_device_mesh({"data": 8})
    step = TrainStep(model, optimizer, squares, batch_sharding=create_data_parallel_sharding(flat))
    assert np.isfinite(float(step(np.ones((8, 16), np.float32))))


def _losses(model_mesh, batch_mesh, **options):
    with nnx.use_eager_sharding(False):
        model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    shard_model((model, optimizer), model_mesh, fsdp_rules())
    sharding = NamedSharding(batch_mesh, P("data"))
    step = TrainStep(model, optimizer, squares, batch_sharding=sharding, **options)
    batch = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    return [float(step(batch)) for _ in range(3)], step


def _reversed(shape):
    return Mesh(np.array(jax.devices()[::-1]).reshape(tuple(shape.values())), tuple(shape))


@pytest.mark.parametrize("where", ["batch", "model", "mesh="])
def test_the_same_devices_in_another_order_are_taken_onto_the_steps_mesh(where):
    """Hostile finding: a batch sharding, model or mesh= over the step's devices in another
    order crashed in jax ("incompatible devices") at the first call."""
    shape = {"data": 2, "model": 4}
    normal, other = create_device_mesh(shape), _reversed(shape)
    expected, _ = _losses(normal, normal)
    model_mesh, batch_mesh, options = {
        "batch": (normal, other, {"mesh": normal}),
        "model": (other, normal, {}),
        "mesh=": (normal, normal, {"mesh": other}),
    }[where]
    losses, step = _losses(model_mesh, batch_mesh, **options)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    kernel = step.model.up.kernel.get_value().sharding
    assert kernel.mesh is step.mesh
    assert kernel.spec == P("model", None)  # still split


def test_a_batch_sharding_in_another_order_naming_an_axis_the_mesh_lacks_is_refused():
    mesh = create_device_mesh({"data": 8})
    other = Mesh(np.array(jax.devices()[::-1]), ("rows",))
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    with pytest.raises(ValueError, match=r"\[7, 6, 5, 4, 3, 2, 1, 0\].*\[0, 1, 2, .*'rows'"):
        TrainStep(
            model, optimizer, squares, mesh=mesh, batch_sharding=NamedSharding(other, P("rows"))
        )


def _on_x(model, batch):
    return squares(model, batch["x"])


def test_a_batch_already_on_the_steps_devices_in_another_order_is_taken_onto_its_mesh():
    """Hostile finding: a batch device_put on a reversed mesh, with no batch_sharding, failed
    with jax's "incompatible devices"."""
    shape = {"data": 2, "model": 4}
    batch = {"x": np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)}
    losses = {}
    for name, given in [
        ("host", batch),
        ("reversed", jax.device_put(batch, NamedSharding(_reversed(shape), P("data")))),
    ]:
        _, model, optimizer = _built(shard_optimizer_too=True)
        step = TrainStep(model, optimizer, _on_x)
        losses[name] = [float(step(given)) for _ in range(3)]
    np.testing.assert_allclose(losses["reversed"], losses["host"], rtol=1e-5)


def test_a_batch_in_another_order_whose_spec_the_steps_mesh_cannot_take_is_refused():
    _, model, optimizer = _built(shard_optimizer_too=True)
    step = TrainStep(model, optimizer, _on_x)
    rows = Mesh(np.array(jax.devices()[::-1]), ("rows",))
    batch = jax.device_put({"x": np.ones((16, 16), np.float32)}, NamedSharding(rows, P("rows")))
    with pytest.raises(BatchPlacementError, match=r"batch leaf \['x'\] .*another order") as info:
        step(batch)
    assert info.value.path == "['x']"
    assert "[7, 6, 5, 4, 3, 2, 1, 0]" in str(info.value)
