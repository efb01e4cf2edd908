"""A training run that a preemption may stop and a later run resumes, on one process or several.

Usage: ``python resumable_training.py OUT_DIR STEPS [STEP_SECONDS]``; as one process of a
``jax.distributed`` job when the launcher variables ``initialize_distributed`` reads are set
(``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``).

Data parallel over every global device: the model and its Adam state are replicated on the
mesh, each process loads only the rows of the batch its devices hold, an RNG stream draws each
step's noise and an early-stopping tracker follows the loss. A SIGTERM (to any process, at any
moment) stops every process at the same step, which they save together (``PreemptionHandler``);
a run that finds a checkpoint resumes from it. At the end each process writes the final state to
``OUT_DIR/final-<process index>.npz`` for comparison.
"""

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from substrax.callbacks import EarlyStopping
from substrax.checkpoint import OrbaxCheckpointStore, PreemptionHandler
from substrax.mesh import DeviceMeshManager
from substrax.runtime import initialize_distributed
from substrax.spmd import (
    create_data_parallel_sharding,
    place_batch_on_shards,
    place_nnx_state_on_shards,
    spmd_train_step,
)


def loss_fn(model: nnx.Linear, batch: dict[str, jax.Array]) -> jax.Array:
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)


@nnx.jit
def train_step(model: nnx.Linear, optimizer: nnx.Optimizer[nnx.Linear], batch: dict) -> jax.Array:
    return spmd_train_step(model, optimizer, loss_fn, batch)


def main(out: Path, steps: int, step_seconds: float) -> None:
    initialize_distributed(initialization_timeout=60)  # before any device is used; else a no-op
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(0.05), wrt=nnx.Param)
    rngs = nnx.Rngs(noise=1)
    stopper = EarlyStopping(patience=1000, min_delta=1e-3)
    mesh = DeviceMeshManager.create_device_mesh({"data": jax.device_count()})
    sharding = create_data_parallel_sharding(mesh)
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(16, 4)
    # the rows this process's devices hold, in order: what its data loader would yield
    starts = {i[0].start or 0 for i in sharding.addressable_devices_indices_map(x.shape).values()}
    rows = np.concatenate([np.arange(start, start + 16 // mesh.size) for start in sorted(starts)])
    for owner in (model, optimizer):  # replicated on the mesh: restores land there too
        nnx.update(owner, place_nnx_state_on_shards(nnx.state(owner), mesh))
    # The RNG stream stays on this process's device (equal on every process): it draws on the
    # host side, and the store saves such host-local leaves as process 0's value.

    def items() -> dict[str, object]:
        return {
            "model": nnx.state(model),
            "optimizer": nnx.state(optimizer),
            "rng": nnx.state(rngs),
            "extensions": {"early_stopping": stopper.get_state()},
        }

    with OrbaxCheckpointStore(out / "checkpoints", max_to_keep=2) as store:
        start = 0
        latest = store.latest_step()
        if latest is not None:
            restored = store.restore(latest, templates=items()).items
            nnx.update(model, restored["model"])
            nnx.update(optimizer, restored["optimizer"])
            nnx.update(rngs, restored["rng"])
            stopper.set_state(restored["extensions"]["early_stopping"])
            start = latest + 1
            print(json.dumps({"resumed_from": latest}), flush=True)
        with PreemptionHandler(store) as preemption:
            for step in range(start, steps):
                noise = np.asarray(0.1 * jax.random.normal(rngs.noise(), (16, 1)))
                y = x.sum(axis=1, keepdims=True) + noise
                batch = place_batch_on_shards({"x": x[rows], "y": y[rows]}, sharding)
                with jax.set_mesh(mesh):
                    loss = float(train_step(model, optimizer, batch))
                stopper.update(loss)
                print(json.dumps({"step": step, "loss": loss}), flush=True)
                time.sleep(step_seconds)
                try:
                    preemption.check(step, items, metrics={"loss": loss})
                except SystemExit:  # saved: say where, and whether this process was signalled
                    print(json.dumps({"stopped": step, "signalled": preemption.requested}))
                    raise
        store.save(steps - 1, items(), overwrite=True)

    leaves = jax.tree.leaves(
        (nnx.state(model), nnx.state(optimizer), jax.random.key_data(rngs.noise.key.get_value()))
    )
    np.savez(
        out / f"final-{jax.process_index()}.npz",
        *[np.asarray(leaf) for leaf in leaves],
        stopper=np.asarray([stopper.best, stopper.num_bad_epochs]),
        rng_count=np.asarray(rngs.noise.count.get_value()),
    )


if __name__ == "__main__":
    # OUT STEPS [STEP_SECONDS [STRAIGHT]]; with STRAIGHT, a run from step 0 there follows, never
    # interrupted: the tests' reference, made by the process that resumed (one interpreter less)
    main(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
    if len(sys.argv) > 4:
        main(Path(sys.argv[4]), int(sys.argv[2]), 0.0)
