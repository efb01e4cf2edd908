"""One of two ``jax.distributed`` processes of a training run that a preemption may stop.

Usage: ``python resumable_training_multiprocess.py OUT_DIR STEPS STEP_SECONDS PROCESS_ID PORT``.

The two-process twin of ``resumable_training.py``: both processes join on ``127.0.0.1:PORT``,
the model, its Adam state and the RNG stream are replicated over the 8 global devices, each
process loads only the rows of the batch its devices hold, and an early-stopping tracker
follows the loss. A SIGTERM to either process (or both, at different moments) stops both at
the same step, which they save together; a pair that finds a checkpoint resumes from it. At the
end each process writes the final state to ``OUT_DIR/final-<PROCESS_ID>.npz``.
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
from substrax.mesh import create_device_mesh
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


def main(out: Path, steps: int, step_seconds: float, process_id: int, port: int) -> None:
    initialize_distributed(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=60,
    )
    assert (jax.process_count(), jax.device_count()) == (2, 8)

    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(0.05), wrt=nnx.Param)
    rngs = nnx.Rngs(noise=1)
    stopper = EarlyStopping(patience=1000, min_delta=1e-3)
    mesh = create_device_mesh({"data": jax.device_count()})
    sharding = create_data_parallel_sharding(mesh)
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(16, 4)
    # the rows this process's devices hold, in order: what its data loader would yield
    starts = sorted(
        {i[0].start for i in sharding.addressable_devices_indices_map(x.shape).values()}
    )
    rows = np.concatenate([np.arange(start, start + 2) for start in starts])
    for owner in (model, optimizer):  # replicated on the global mesh
        nnx.update(owner, place_nnx_state_on_shards(nnx.state(owner), mesh))
    # the RNG stream stays on this process's first device (equal on both processes): the store
    # saves such host-local leaves as process 0's value and restores them where they were

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
        out / f"final-{process_id}.npz",
        *[np.asarray(leaf) for leaf in leaves],
        stopper=np.asarray([stopper.best, stopper.num_bad_epochs]),
        rng_count=np.asarray(rngs.noise.count.get_value()),
    )


if __name__ == "__main__":
    out_dir, steps, step_seconds, process_id, port = sys.argv[1:6]
    main(Path(out_dir), int(steps), float(step_seconds), int(process_id), int(port))
