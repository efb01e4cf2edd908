"""An image classifier on real data: a small CNN on scikit-learn's bundled digits, data parallel.

    uv run python examples/digits_classifier.py

The 1,797 8x8 handwritten digits ship with scikit-learn (nothing is downloaded). They are split
once, with a fixed seed, into train, validation and test sets (70/15/15). A two-layer CNN trains,
on images shifted at random by up to a pixel, with a ``TrainStep`` whose batches are sharded over
every device (8 emulated CPU devices unless JAX_NUM_CPU_DEVICES says otherwise). After each
epoch an ``EvalStep`` scores it on the validation set, sharded like the training batches, its
loss and accuracy reduced across the devices inside the compiled step; early stopping watches
the validation loss, and the checkpoint store keeps the best few epochs by validation accuracy.
At the end the best checkpoint is restored and scored on the test set by the same ``EvalStep``.

Everything it writes goes under $AVITAI_OUTPUT_DIR/digits_classifier, or a per-run temporary
directory. That is the checkpoints, the metrics log with a plot of it, and ``summary.json`` (a
run replaces an earlier run's). The last line it prints is the same summary as JSON.
"""

import json
import os
import shutil
import time

from substrax.runtime import JaxRuntime, apply_runtime


if "JAX_NUM_CPU_DEVICES" not in os.environ:  # read when jax starts: set it before importing jax
    apply_runtime(JaxRuntime(cpu_devices=8))

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits

from substrax.artifacts import resolve_output_dir
from substrax.callbacks import EarlyStoppingCallback, EarlyStoppingConfig
from substrax.checkpoint import OrbaxCheckpointStore, quiet_orbax_notices
from substrax.devices import detect_devices
from substrax.mesh import DeviceMeshManager
from substrax.spmd import EvalStep, TrainStep, create_data_parallel_sharding, place_batch_on_shards
from substrax.tracking import create_logger, plot_log_dir


QUICK = os.environ.get("SUBSTRAX_EXAMPLES_QUICK") == "1"  # every code path, in seconds (tests)
SEED = 0
BATCH_SIZE = 64  # divisible by the 8-way data axis
MAX_EPOCHS = 5 if QUICK else 40
LEARNING_RATE = 3e-3
PATIENCE = 5  # epochs without a lower validation loss before stopping
KEEP_BEST = 3  # checkpoints kept by validation accuracy

type Split = dict[str, np.ndarray]


class CNN(nnx.Module):
    """Two 3x3 convolutions, a 2x2 average pool and a two-layer classifier head."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.hidden = nnx.Linear(4 * 4 * 64, 128, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.conv1(x))
        x = nnx.relu(self.conv2(x))
        x = nnx.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = nnx.relu(self.hidden(x.reshape(x.shape[0], -1)))
        return self.out(x)


def load_splits(seed: int) -> tuple[Split, Split, Split]:
    """The digits as (N, 8, 8, 1) images in [0, 1], split 70/15/15 by a fixed permutation."""
    images, labels = load_digits(return_X_y=True)
    images = (images / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = n_val = round(0.15 * len(labels))
    parts = np.split(order, [n_test, n_test + n_val])
    test, val, train = ({"image": images[i], "label": labels[i].astype(np.int32)} for i in parts)
    return train, val, test


def padded(split: Split, multiple: int) -> Split:
    """``split`` padded to a multiple of ``multiple`` rows, with a mask that is 0 on the padding."""
    n = len(split["label"])
    extra = -n % multiple
    out = {
        k: np.concatenate([v, np.zeros((extra, *v.shape[1:]), v.dtype)]) for k, v in split.items()
    }
    out["mask"] = np.concatenate([np.ones(n, np.float32), np.zeros(extra, np.float32)])
    return out


def shifted(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each image moved by up to one pixel in each direction (zeros shifted in)."""
    n, h, w, _ = images.shape
    frame = np.pad(images, ((0, 0), (1, 1), (1, 1), (0, 0)))
    dy, dx = rng.integers(0, 3, size=(2, n))
    rows = dy[:, None] + np.arange(h)[None, :]
    cols = dx[:, None] + np.arange(w)[None, :]
    return frame[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def loss_fn(model: CNN, batch: dict[str, jax.Array]) -> jax.Array:
    logits = model(batch["image"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()


def scores(model: CNN, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Mean loss and accuracy over the unmasked rows of one batch (its rows sharded: the sums
    over them are reductions across the devices, which ``EvalStep`` compiles and replicates)."""
    logits = model(batch["image"])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    correct = (jnp.argmax(logits, axis=-1) == batch["label"]).astype(jnp.float32)
    count = batch["mask"].sum()
    return {
        "loss": (losses * batch["mask"]).sum() / count,
        "accuracy": (correct * batch["mask"]).sum() / count,
    }


def train_one_epoch(step: TrainStep[CNN], train: Split, rng: np.random.Generator) -> list[float]:
    """One pass over shuffled, shifted training batches; the loss of each step.

    The short last batch is dropped, so every batch splits evenly over the data axis. The losses
    are fetched once at the end, so the host never waits on a step inside the epoch.
    """
    order = rng.permutation(len(train["label"]))
    losses = []
    for i in range(len(order) // BATCH_SIZE):
        rows = order[i * BATCH_SIZE : (i + 1) * BATCH_SIZE]
        images = shifted(train["image"][rows], rng)
        losses.append(step({"image": images, "label": train["label"][rows]}))
    return [float(loss) for loss in jax.device_get(losses)]


def main() -> dict[str, object]:
    start = time.perf_counter()
    outputs = resolve_output_dir("digits_classifier").path
    for leftover in ("checkpoints", "logs"):  # a fresh run each time, never added to the last
        shutil.rmtree(outputs / leftover, ignore_errors=True)
    info = detect_devices()
    mesh = DeviceMeshManager.create_device_mesh({"data": info.count})
    sharding = create_data_parallel_sharding(mesh)

    train, val, test = load_splits(SEED)
    val_batch = place_batch_on_shards(padded(val, info.count), sharding)
    test_batch = place_batch_on_shards(padded(test, info.count), sharding)

    model = CNN(rngs=nnx.Rngs(SEED))
    optimizer = nnx.Optimizer(model, optax.adam(LEARNING_RATE), wrt=nnx.Param)
    step = TrainStep(model, optimizer, loss_fn, mesh=mesh, batch_sharding=sharding)
    # scores the model object, which the step keeps current once synced (step.model below) and
    # into which the best checkpoint is restored: one compiled program for validation and test
    evaluate = EvalStep(step.model, scores, mesh=mesh, batch_sharding=sharding)
    stopper = EarlyStoppingCallback(EarlyStoppingConfig(monitor="val_loss", patience=PATIENCE))
    logger = create_logger("digits_classifier", log_dir=outputs / "logs", console=False)
    logger.log_hyperparams(
        {
            "batch_size": BATCH_SIZE,
            "learning_rate": LEARNING_RATE,
            "max_epochs": MAX_EPOCHS,
            "patience": PATIENCE,
            "devices": info.count,
            "train_examples": len(train["label"]),
            "val_examples": len(val["label"]),
            "test_examples": len(test["label"]),
        }
    )

    shuffle = np.random.default_rng(SEED + 1)
    global_step = 0
    epoch = 0
    quiet_orbax_notices()  # orbax's notice at every save is about a setting the store chose
    store = OrbaxCheckpointStore(
        outputs / "checkpoints",
        max_to_keep=1,
        keep_best=KEEP_BEST,
        best_metric="val_accuracy",
        best_mode="max",
    )
    with store:
        for epoch in range(MAX_EPOCHS):
            losses = train_one_epoch(step, train, shuffle)
            for offset, loss in enumerate(losses):
                logger.log_scalar("train_loss", loss, step=global_step + offset)
            global_step += len(losses)

            val_scores = evaluate(val_batch)
            metrics = {
                "val_loss": float(val_scores["loss"]),
                "val_accuracy": float(val_scores["accuracy"]),
            }
            logger.log_metrics(metrics, step=global_step)
            items = {"model": nnx.state(step.model), "optimizer": nnx.state(step.optimizer)}
            store.save(global_step, items, epoch=epoch, metrics=metrics)
            print(
                f"epoch {epoch:2d}  train_loss {np.mean(losses):.4f}  "
                f"val_loss {metrics['val_loss']:.4f}  val_accuracy {metrics['val_accuracy']:.4f}"
            )
            stopper.on_epoch_end(None, epoch, metrics)
            if stopper.should_stop:
                break

        store.wait()  # the last save committed: retention has dropped what it does not keep
        best = store.best_step("val_accuracy", mode="max")
        assert best is not None
        restored = store.restore(best, templates={"model": nnx.state(model)}, items=("model",))
        nnx.update(model, restored.items["model"])
        best_metrics = restored.metadata.metrics
        checkpoint_steps = store.list_steps()

    test_scores = evaluate(test_batch)
    test_loss, test_accuracy = float(test_scores["loss"]), float(test_scores["accuracy"])
    logger.log_metrics({"test_loss": test_loss, "test_accuracy": test_accuracy}, step=best)
    logger.close()
    plot = plot_log_dir(outputs / "logs")

    summary_path = outputs / "summary.json"
    summary: dict[str, object] = {
        "devices": info.count,
        "platform": info.platform,
        "epochs": epoch + 1,
        "stopped_early": stopper.should_stop,
        "best_step": best,
        "val_loss": best_metrics["val_loss"],
        "val_accuracy": best_metrics["val_accuracy"],
        "test_loss": test_loss,
        "test_accuracy": test_accuracy,
        "checkpoint_steps": checkpoint_steps,
        "seconds": round(time.perf_counter() - start, 1),
        "outputs": {
            "metrics": str(outputs / "logs"),
            "plot": str(plot),
            "checkpoints": str(outputs / "checkpoints"),
            "summary": str(summary_path),
        },
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"test accuracy {test_accuracy:.4f} from the best checkpoint (step {best}, "
        f"val_accuracy {best_metrics['val_accuracy']:.4f}); {summary['seconds']} s; "
        f"outputs in {outputs}"
    )
    return summary


if __name__ == "__main__":
    print(json.dumps(main()))
