"""A small decoder-only transformer language model on real text: the Python standard library.

    uv run python examples/transformer_lm.py

The text is the standard library's own ``.py`` sources (``sysconfig.get_paths()["stdlib"]``),
which every Python install carries, so nothing is downloaded. A fixed, sorted list of files is
read as bytes (vocabulary 256, no tokenizer) and split by file: every tenth file is validation.

The model trains with fully sharded data parallelism over every device (8 emulated CPU devices
unless JAX_NUM_CPU_DEVICES says otherwise): its weights carry logical axis names and
``LogicalAxisRules`` put both the batch and the weights' ``embed`` dimension on one ``fsdp``
mesh axis. The ``TrainStep`` computes in bfloat16 while parameters and optimizer state stay
float32 (``PrecisionPolicy``), and accumulates gradients over microbatches. ``EvalStep`` gives the
validation loss, printed beside the unigram baseline: the entropy of the training bytes'
unigram distribution, in nats like the loss. ``ThroughputMeter`` logs tokens/s, FLOP/s and MFU
(None on CPU) to the metrics log, with the FLOPs of one optimizer step (all its microbatches)
from ``TrainStep.flops_per_step`` and the evaluations paused out of its clock, and
``ProfilerWindow`` traces a few steps.

Everything it writes goes under $AVITAI_OUTPUT_DIR/transformer_lm, or a per-run temporary
directory: the metrics log with a plot of it, the profile, and ``summary.json``. The last line it
prints is the same summary as JSON.
"""

import json
import os
import sysconfig
import time
from pathlib import Path

from substrax.runtime import JaxRuntime, apply_runtime


if "JAX_NUM_CPU_DEVICES" not in os.environ:  # read when jax starts: set it before importing jax
    apply_runtime(JaxRuntime(cpu_devices=8))

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from substrax.artifacts import resolve_output_dir
from substrax.callbacks import CallbackList, ProfilerWindow, ThroughputMeter
from substrax.devices import detect_devices
from substrax.mesh import DeviceMeshManager, LogicalAxisRules, create_sharded_model
from substrax.spmd import EvalStep, PrecisionPolicy, TrainStep, create_data_parallel_sharding
from substrax.tracking import create_logger, plot_log_dir


SEED = 0
MAX_FILES = 120  # the first files of the sorted list: about 3 MB of text
SEQ_LEN = 64
BATCH_SIZE = 32  # sequences per step: 4 per device on 8 devices
ACCUMULATE_STEPS = 2  # microbatches per step
STEPS = 400
EVAL_BATCHES = 8
LEARNING_RATE = 3e-3
EMBED, HEADS, LAYERS, MLP = 64, 4, 2, 256
PROFILE_STEPS = (20, 3)  # first traced step, how many
EVAL_EVERY = 80  # steps between validation losses

# Pure FSDP: one mesh axis carries the batch and each weight's "embed" dimension.
RULES = LogicalAxisRules({"batch": "fsdp", "embed": "fsdp", "mlp": None, "vocab": None})


def annotated(names: tuple[str, ...]) -> nnx.Initializer:
    return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)


class Block(nnx.Module):
    """Pre-norm causal self-attention and an MLP, each with a residual connection."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.norm1 = nnx.LayerNorm(EMBED, rngs=rngs)
        self.qkv = nnx.Linear(EMBED, 3 * EMBED, kernel_init=annotated(("embed", "mlp")), rngs=rngs)
        self.proj = nnx.Linear(EMBED, EMBED, kernel_init=annotated(("mlp", "embed")), rngs=rngs)
        self.norm2 = nnx.LayerNorm(EMBED, rngs=rngs)
        self.up = nnx.Linear(EMBED, MLP, kernel_init=annotated(("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(MLP, EMBED, kernel_init=annotated(("mlp", "embed")), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, length, _ = x.shape
        q, k, v = jnp.split(self.qkv(self.norm1(x)), 3, axis=-1)
        q, k, v = (t.reshape(batch, length, HEADS, EMBED // HEADS) for t in (q, k, v))
        attended = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.reshape(batch, length, EMBED))
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class TransformerLM(nnx.Module):
    """Byte embeddings plus learned positions, ``LAYERS`` blocks, and a tied output layer."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        init = nnx.with_partitioning(nnx.initializers.normal(0.02), ("vocab", "embed"))
        self.embed = nnx.Embed(256, EMBED, embedding_init=init, rngs=rngs)
        self.position = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (SEQ_LEN, EMBED)),
            sharding_names=(None, "embed"),
        )
        self.blocks = nnx.List([Block(rngs=rngs) for _ in range(LAYERS)])
        self.norm = nnx.LayerNorm(EMBED, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens) + self.position[...].astype(self.embed.embedding.dtype)
        for block in self.blocks:
            x = block(x)
        return self.embed.attend(self.norm(x))


def next_byte_loss(model: TransformerLM, batch: dict[str, jax.Array]) -> jax.Array:
    """Mean cross entropy (nats) of each next byte; logits in float32 whatever the compute dtype."""
    logits = model(batch["tokens"][:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["tokens"][:, 1:]).mean()


def load_text() -> tuple[np.ndarray, np.ndarray]:
    """The training and validation bytes: sorted stdlib sources, every tenth file validation."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:MAX_FILES]
    train = [f.read_bytes() for i, f in enumerate(files) if i % 10 != 9]
    val = [f.read_bytes() for i, f in enumerate(files) if i % 10 == 9]
    return np.frombuffer(b"".join(train), np.uint8), np.frombuffer(b"".join(val), np.uint8)


def unigram_entropy(data: np.ndarray) -> float:
    """The entropy, in nats, of the bytes' unigram distribution: the best loss without context."""
    counts = np.bincount(data, minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def windows(data: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
    """Rows of ``SEQ_LEN + 1`` bytes (inputs and their next bytes) starting at ``starts``."""
    rows = data[starts[:, None] + np.arange(SEQ_LEN + 1)[None, :]]
    return {"tokens": rows.astype(np.int32)}


def main() -> dict[str, object]:
    start = time.perf_counter()
    outputs = resolve_output_dir("transformer_lm").path
    info = detect_devices()
    mesh = DeviceMeshManager.create_device_mesh({"fsdp": info.count})
    batch_sharding = create_data_parallel_sharding(mesh, "fsdp")

    train, val = load_text()
    baseline = unigram_entropy(train)
    rng = np.random.default_rng(SEED)
    val_starts = np.random.default_rng(SEED + 1).integers(
        0, len(val) - SEQ_LEN - 1, size=(EVAL_BATCHES, BATCH_SIZE)
    )

    def make() -> tuple[TransformerLM, nnx.Optimizer[TransformerLM]]:
        model = TransformerLM(rngs=nnx.Rngs(SEED))
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, LEARNING_RATE, 20, STEPS, 0.1 * LEARNING_RATE
        )
        return model, nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.01), wrt=nnx.Param)

    model, optimizer = create_sharded_model(make, mesh, RULES)
    precision = PrecisionPolicy(param_dtype="float32", compute_dtype="bfloat16")
    step = TrainStep(
        model,
        optimizer,
        next_byte_loss,
        mesh=mesh,
        batch_sharding=batch_sharding,
        accumulate_steps=ACCUMULATE_STEPS,
        precision=precision,
    )
    evaluate = EvalStep(step, next_byte_loss, batch_sharding=batch_sharding, precision=precision)

    logger = create_logger("transformer_lm", log_dir=outputs / "logs", console=False)
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    logger.log_hyperparams(
        {
            "parameters": params,
            "seq_len": SEQ_LEN,
            "batch_size": BATCH_SIZE,
            "accumulate_steps": ACCUMULATE_STEPS,
            "steps": STEPS,
            "learning_rate": LEARNING_RATE,
            "devices": info.count,
            "train_bytes": len(train),
            "val_bytes": len(val),
            "compute_dtype": "bfloat16",
        }
    )
    first = windows(train, rng.integers(0, len(train) - SEQ_LEN - 1, size=BATCH_SIZE))
    flops = step.flops_per_step(first)  # per device and optimizer step: both microbatches
    meter = ThroughputMeter(
        logger,
        window=EVAL_EVERY // 4,
        examples_per_step=BATCH_SIZE,
        tokens_per_example=SEQ_LEN,
        flops_per_step=flops,
    )
    profile_dir = outputs / "profile"
    profiler = ProfilerWindow(
        start_step=PROFILE_STEPS[0], num_steps=PROFILE_STEPS[1], log_dir=profile_dir
    )
    callbacks = CallbackList([meter, profiler])

    with profiler:
        callbacks.on_train_begin(None)
        losses = []
        batch = first
        for i in range(STEPS):
            callbacks.on_batch_begin(None, i)
            loss = step(batch)
            callbacks.on_batch_end(None, i, {"loss": loss})
            losses.append(loss)
            batch = windows(train, rng.integers(0, len(train) - SEQ_LEN - 1, size=BATCH_SIZE))
            if (i + 1) % EVAL_EVERY == 0:
                with meter.pause():  # evaluating is not training: left out of tokens/s
                    recent = [float(x) for x in jax.device_get(losses[-EVAL_EVERY:])]
                    for offset, value in enumerate(recent):
                        logger.log_scalar("train_loss", value, step=i + 1 - len(recent) + offset)
                    val_loss = float(evaluate.evaluate(windows(val, s) for s in val_starts))
                    logger.log_metrics({"val_loss": val_loss}, step=i + 1)
                print(
                    f"step {i + 1:4d}  train_loss {np.mean(recent):.3f}  val_loss {val_loss:.3f}  "
                    f"(unigram baseline {baseline:.3f})  "
                    f"tokens/s {meter.latest['tokens_per_sec']:,.0f}"
                )
        callbacks.on_train_end(None)
    logger.close()
    plot = plot_log_dir(outputs / "logs")

    summary_path = outputs / "summary.json"
    summary: dict[str, object] = {
        "devices": info.count,
        "platform": info.platform,
        "parameters": params,
        "steps": STEPS,
        "train_bytes": len(train),
        "val_bytes": len(val),
        "val_loss": val_loss,
        "unigram_baseline": baseline,
        "tokens_per_second": meter.latest["tokens_per_sec"],
        "mfu": meter.latest["mfu"],
        "flops_per_step_per_device": flops,
        # the FSDP layout the step keeps: each device holds 1/8 of this table
        "embedding_spec": list(step.model.embed.embedding.get_value().sharding.spec),
        "seconds": round(time.perf_counter() - start, 1),
        "outputs": {
            "metrics": str(outputs / "logs"),
            "plot": str(plot),
            "profile": str(profile_dir),
            "summary": str(summary_path),
        },
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"validation loss {val_loss:.3f} nats against the unigram baseline {baseline:.3f} "
        f"({baseline - val_loss:.3f} below); {summary['tokens_per_second']:,.0f} tokens/s; "
        f"{summary['seconds']} s; outputs in {outputs}"
    )
    return summary


if __name__ == "__main__":
    print(json.dumps(main()))
