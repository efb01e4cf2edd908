"""Two jax processes on 127.0.0.1, 4 emulated CPU devices each, one 8-device data mesh.

Each process loads only its rows: a TrainStep over a model holding ``nnx.Rngs`` (dropout)
trains on the global mesh, and an ``EvalStep`` over it takes its batch sharding, so the
metric is the global batch's on both processes.
"""

import textwrap

import numpy as np
import pytest

from substrax.runtime import JaxRuntime
from substrax.testing import run_distributed


WORKER = textwrap.dedent(
    """
    import json
    import numpy as np

    from substrax.runtime import initialize_distributed
    initialize_distributed(initialization_timeout=90, heartbeat_timeout=60)
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from substrax.mesh import create_device_mesh
    from substrax.spmd import (
        BatchPlacementError, EvalStep, TrainStep, create_data_parallel_sharding,
        place_batch_on_shards,
    )

    mesh = create_device_mesh({"data": 8})
    sharding = create_data_parallel_sharding(mesh)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 6)).astype(np.float32)
    y = rng.normal(size=(16, 2)).astype(np.float32)
    starts = sorted({i[0].start for i in sharding.addressable_devices_indices_map((16, 6)).values()})
    rows = np.concatenate([np.arange(s, s + 2) for s in starts])
    local = {"x": x[rows], "y": y[rows]}

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(6, 8, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)  # its nnx.Rngs: typed keys made here
            self.out = nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, x):
            return self.out(self.drop(jax.nn.relu(self.up(x))))

    def mse(model, batch):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

    def per_row(model, batch):
        return {"mse": (model(batch["x"]) - batch["y"]) ** 2}

    model = Net(nnx.Rngs(0))
    step = TrainStep(model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param), mse,
                     batch_sharding=sharding)
    losses = [float(step(local)) for _ in range(2)]
    inherited = EvalStep(step, per_row).evaluate([local])["mse"]
    explicit = EvalStep(step, per_row, batch_sharding=sharding).evaluate([local])["mse"]
    try:  # 3 rows a process, on 4 devices each: a spec review found jax's error naming no leaf
        place_batch_on_shards({"rows": {"x": x[:3]}}, sharding)
        uneven = None
    except BatchPlacementError as error:
        uneven = [error.path, str(error)]
    print(json.dumps({"losses": losses, "inherited": inherited, "explicit": explicit,
                      "uneven": uneven}))
    """
)


def test_a_model_with_rngs_trains_and_its_eval_step_reads_the_global_batch(child_processes):
    """Hostile findings: a model holding nnx.Rngs was refused on a multi-process mesh (its keys
    live on one process's device), and ``EvalStep(step)`` took each process's rows as the
    whole batch, so the two processes reported different metrics."""
    del child_processes
    runs = run_distributed(WORKER, num_processes=2, runtime=JaxRuntime(cpu_devices=4), timeout=240)
    first, second = (run.check().last_json() for run in runs)
    assert first["losses"] == second["losses"]
    assert all(np.isfinite(first["losses"]))
    for out in (first, second):
        assert out["inherited"] == pytest.approx(out["explicit"], rel=1e-6)
    assert first["inherited"] == pytest.approx(second["inherited"], rel=1e-6)
    for out in (first, second):
        path, message = out["uneven"]
        assert path == "['rows']['x']"
        assert "batch leaf ['rows']['x'] has shape (3, 6) on this process" in message
        assert "for the rows: drop or pad the last ones" in message
