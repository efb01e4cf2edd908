"""Quick start: a data-parallel training run over every visible device, with early stopping,
a checkpoint store, a metrics log and a plot of it.

    uv run python examples/quick_start.py

On a machine without an accelerator it emulates 8 CPU devices (unless JAX_NUM_CPU_DEVICES says
otherwise), so the batch really is sharded 8 ways and XLA inserts the gradient all-reduce; with
GPUs or TPUs it runs on them. Everything it
writes goes under $AVITAI_OUTPUT_DIR/quick_start, or a per-run temporary directory: never the
working tree; a run replaces an earlier run's. The last line it prints is a JSON summary with the paths of what it produced, also
written to ``summary.json`` there.
"""

import json
import os
import shutil

from substrax.runtime import JaxRuntime, apply_runtime


if "JAX_NUM_CPU_DEVICES" not in os.environ:  # read when jax starts: set it before importing jax
    apply_runtime(JaxRuntime(cpu_devices=8))

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from substrax.artifacts import resolve_output_dir
from substrax.callbacks import EarlyStopping
from substrax.checkpoint import OrbaxCheckpointStore
from substrax.devices import detect_devices
from substrax.mesh import DeviceMeshManager
from substrax.spmd import create_data_parallel_sharding, place_batch_on_shards, spmd_train_step
from substrax.tracking import create_logger, plot_log_dir


QUICK = os.environ.get("SUBSTRAX_EXAMPLES_QUICK") == "1"  # every code path, in seconds (tests)
STEPS = 5 if QUICK else 20


def loss_fn(model: nnx.Linear, batch: dict[str, jax.Array]) -> jax.Array:
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)


@nnx.jit
def train_step(
    model: nnx.Linear, optimizer: nnx.Optimizer[nnx.Linear], batch: dict[str, jax.Array]
) -> jax.Array:
    return spmd_train_step(model, optimizer, loss_fn, batch)


def main() -> dict[str, object]:
    outputs = resolve_output_dir("quick_start").path
    for leftover in ("checkpoints", "logs"):  # a fresh run each time, never added to the last
        shutil.rmtree(outputs / leftover, ignore_errors=True)
    info = detect_devices()

    model = nnx.Linear(8, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-1), wrt=nnx.Param)

    mesh = DeviceMeshManager.create_device_mesh({"data": info.count})
    sharding = create_data_parallel_sharding(mesh)
    x = jax.random.normal(jax.random.key(1), (32, 8))
    batch = place_batch_on_shards({"x": x, "y": x.sum(axis=1, keepdims=True)}, sharding)

    stopper = EarlyStopping(patience=3, min_delta=1e-4)
    logger = create_logger("quick_start", log_dir=outputs / "logs")
    logger.log_hyperparams({"learning_rate": 1e-1, "batch_size": 32, "devices": info.count})
    with OrbaxCheckpointStore(outputs / "checkpoints", max_to_keep=2) as store:
        for step in range(STEPS):
            with jax.set_mesh(mesh):
                loss = float(train_step(model, optimizer, batch))
            logger.log_scalar("loss", loss, step=step)
            store.save(step, {"model": nnx.state(model)}, metrics={"loss": loss})
            stopper.update(loss)
            if stopper.should_stop:
                break

        latest = store.latest_step()
        assert latest is not None
        checkpoint = store.restore(latest, templates={"model": nnx.state(model)})
        nnx.update(model, checkpoint.items["model"])
        assert checkpoint.metadata.metrics["loss"] == loss
        steps = store.list_steps()
    logger.close()
    plot = plot_log_dir(outputs / "logs")

    summary: dict[str, object] = {
        "devices": info.count,
        "platform": info.platform,
        "final_loss": loss,
        "checkpoint_steps": steps,
        "outputs": {
            "metrics": str(outputs / "logs"),
            "plot": str(plot),
            "checkpoints": str(outputs / "checkpoints"),
        },
    }
    # What `substrax-compute run` reads for its results table.
    (outputs / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    print(json.dumps(main()))
