"""Two jax processes on 127.0.0.1, 4 emulated CPU devices each, one 8-device data mesh.

Each process loads only its rows; ``place_batch_on_shards`` assembles the global batch, and
a data-parallel step (the documented ``nnx.jit`` path and the ``TrainStep`` fast path) gives
the loss and parameters of the same step run in one process; ``create_multihost_mesh`` lays
the DCN axis across the processes.
"""

import textwrap

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.runtime import JaxRuntime
from substrax.testing import run_distributed


WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np

    from substrax.runtime import initialize_distributed
    info = initialize_distributed(initialization_timeout=90, heartbeat_timeout=60)  # load is no dead peer
    import jax
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P
    from substrax.mesh import create_device_mesh, create_multihost_mesh
    from substrax.spmd import (TrainStep, create_data_parallel_sharding, place_batch_on_shards,
                               place_nnx_state_on_shards, spmd_train_step)

    assert (jax.process_count(), jax.local_device_count(), jax.device_count()) == (2, 4, 8)
    mesh = create_device_mesh({"data": 8})
    sharding = create_data_parallel_sharding(mesh)
    replicated = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    global_x = rng.normal(size=(16, 4)).astype(np.float32)
    global_y = rng.normal(size=(16, 1)).astype(np.float32)
    # the rows this process's devices hold, in order: what its data loader would yield
    starts = sorted({idx[0].start for idx in sharding.addressable_devices_indices_map((16, 4)).values()})
    rows = np.concatenate([np.arange(s, s + 2) for s in starts])
    local = {"x": global_x[rows], "y": global_y[rows], "lam": np.float32(0.5), "tag": "train"}
    batch = place_batch_on_shards(local, {"x": sharding, "y": sharding, "lam": replicated, "tag": replicated})
    gather = jax.jit(lambda a: a, out_shardings=replicated)
    assembled = np.asarray(gather(batch["x"]))
    tag = batch.pop("tag")  # a string passes through placement; jit takes arrays only

    def loss_fn(model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean() * batch["lam"] * 2

    def fresh():
        model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
        nnx.update(model, place_nnx_state_on_shards(nnx.state(model), mesh))
        nnx.update(optimizer, place_nnx_state_on_shards(nnx.state(optimizer), mesh))
        return model, optimizer

    model, optimizer = fresh()
    step = nnx.jit(lambda m, o, b: spmd_train_step(m, o, loss_fn, b))
    with jax.set_mesh(mesh):
        nnx_losses = [float(gather(step(model, optimizer, batch))) for _ in range(3)]
    nnx_kernel = np.asarray(gather(model.kernel.get_value())).tolist()

    model, optimizer = fresh()
    fast = TrainStep(model, optimizer, loss_fn, mesh=mesh)
    fast_losses = [float(gather(fast(batch))) for _ in range(3)]
    fast_kernel = np.asarray(gather(fast.model.kernel.get_value())).tolist()

    hybrid = create_multihost_mesh({"data": 2, "model": 2}, {"data": 2})
    # an nnx.Rngs state (typed PRNG keys, made on this process's device) placed on the global mesh
    rngs_state = place_nnx_state_on_shards(nnx.state(nnx.Rngs(3)), mesh)
    rng_key = rngs_state["default"]["key"].get_value()
    print(json.dumps({
        "rng_key_global": not rng_key.is_fully_addressable,
        "rng_key_data": np.asarray(jax.random.key_data(rng_key)).tolist(),
        "hybrid_shape": dict(hybrid.shape),
        "hybrid_processes": [[d.process_index for d in row] for row in hybrid.devices.tolist()],
        "process": info.process_id,
        "shape": list(batch["x"].shape),
        "assembled_equal": bool(np.array_equal(assembled, global_x)),
        "lam": float(gather(batch["lam"])),
        "tag": tag,
        "nnx_losses": nnx_losses, "nnx_kernel": nnx_kernel,
        "fast_losses": fast_losses, "fast_kernel": fast_kernel,
    }))
    """
)


def single_process_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        def loss(m):
            return ((m(x) - y) ** 2).mean()

        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    losses = [float(step(model, optimizer)) for _ in range(3)]
    return losses, np.asarray(model.kernel.get_value())


def test_two_processes_assemble_the_batch_and_match_one_process():
    runs = run_distributed(WORKER, num_processes=2, runtime=JaxRuntime(cpu_devices=4), timeout=240)
    outputs = [run.check().last_json() for run in runs]
    losses, kernel = single_process_reference()
    assert [o["process"] for o in outputs] == [0, 1]
    for o in outputs:
        assert o["shape"] == [16, 4]
        assert o["assembled_equal"], "the global batch is not the rows of both processes in order"
        assert o["lam"] == 0.5
        assert o["rng_key_global"], "the PRNG key was not placed on the global mesh"
        assert (
            o["rng_key_data"]
            == np.asarray(jax.random.key_data(nnx.Rngs(3).default.key.get_value())).tolist()
        )
        assert o["tag"] == "train"
        # the DCN axis (data) crosses processes; the ICI layout stays inside one process
        assert o["hybrid_shape"] == {"data": 4, "model": 2}
        assert o["hybrid_processes"] == [[0, 0], [0, 0], [1, 1], [1, 1]]
        np.testing.assert_allclose(o["nnx_losses"], losses, rtol=1e-5)
        np.testing.assert_allclose(o["fast_losses"], losses, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(o["nnx_kernel"]), kernel, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(o["fast_kernel"]), kernel, rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _needs_eight_devices():
    import jax

    assert jax.device_count() == 8
