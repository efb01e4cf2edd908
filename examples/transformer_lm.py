"""A small decoder-only transformer language model on real text: the Python standard library.

    uv run python examples/transformer_lm.py                      # the CPU default, 8 CPU devices
    uv run python examples/transformer_lm.py --preset gpu [--batch-size 32] [--steps 300]

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

``--preset gpu`` is the same script sized for one accelerator: about GPT-2 small (12 layers, 12
heads, embed 768, MLP 3072; about 86M parameters with the byte vocabulary), sequences of 1024
bytes, 32 of them a step (``--batch-size``), no microbatches, and cuDNN's fused attention
(``jax.nn.dot_product_attention(..., implementation="cudnn")``) on an NVIDIA GPU (XLA's
elsewhere). It also prints the step's counted FLOPs against the analytic count (6·N·T for the N
matmul parameters and T tokens, plus 12·L·T·S·d for attention: ``analytic_flops``) and records
both, with the MFU, in ``summary.json``. Its goal is an MFU of at least 35% on one H200.

Everything it writes goes under $AVITAI_OUTPUT_DIR/transformer_lm, or a per-run temporary
directory: the metrics log with a plot of it, the profile, and ``summary.json`` (a run replaces
an earlier run's). The last line it prints is the same summary as JSON.
"""

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shutil
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
from jax.sharding import Mesh

from substrax.artifacts import resolve_output_dir
from substrax.callbacks import CallbackList, ProfilerWindow, ThroughputMeter
from substrax.devices import detect_devices
from substrax.mesh import DeviceMeshManager, LogicalAxisRules, create_sharded_model
from substrax.spmd import EvalStep, PrecisionPolicy, TrainStep, create_data_parallel_sharding
from substrax.support import MissingExtraError
from substrax.tracking import create_logger, plot_log_dir


QUICK = os.environ.get("SUBSTRAX_EXAMPLES_QUICK") == "1"  # every code path, in seconds (tests)
SEED = 0
MAX_FILES = 120  # the first files of the sorted list: about 3 MB of text
SEQ_LEN = 64
BATCH_SIZE = 32  # sequences per step: 4 per device on 8 devices
ACCUMULATE_STEPS = 2  # microbatches per step
STEPS = 8 if QUICK else 400
EVAL_BATCHES = 8
LEARNING_RATE = 3e-3
EMBED, HEADS, LAYERS, MLP = 64, 4, 2, 256
PROFILE_STEPS = (2, 1) if QUICK else (20, 3)  # first traced step, how many
EVAL_EVERY = 4 if QUICK else 80  # steps between validation losses
VOCAB = 256  # bytes

# Pure FSDP: one mesh axis carries the batch and each weight's "embed" dimension.
RULES = LogicalAxisRules({"batch": "fsdp", "embed": "fsdp", "mlp": None, "vocab": None})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Preset:
    """The model's shape and the run's settings; ``CPU`` is the constants above."""

    name: str
    embed: int = EMBED
    heads: int = HEADS
    layers: int = LAYERS
    mlp: int = MLP
    seq_len: int = SEQ_LEN
    batch_size: int = BATCH_SIZE
    accumulate_steps: int = ACCUMULATE_STEPS
    steps: int = STEPS
    learning_rate: float = LEARNING_RATE
    warmup_steps: int = 20
    max_files: int | None = MAX_FILES  # None: every file
    eval_batches: int = EVAL_BATCHES
    eval_every: int = EVAL_EVERY
    profile_steps: tuple[int, int] | None = PROFILE_STEPS  # None: no trace


CPU = Preset(name="cpu")
# About GPT-2 small for one accelerator; 32 sequences of 1024 bytes fill an 80-141 GB GPU.
GPU = Preset(
    name="gpu",
    embed=768,
    heads=12,
    layers=12,
    mlp=3072,
    seq_len=1024,
    batch_size=32,
    accumulate_steps=1,
    steps=300,
    learning_rate=6e-4,
    warmup_steps=30,
    max_files=None,
    eval_batches=4,
    eval_every=100,
)
PRESETS = {preset.name: preset for preset in (CPU, GPU)}


@functools.cache
def attention_implementation() -> str | None:
    """cuDNN's fused attention on an NVIDIA GPU (Ampere or newer); jax's default elsewhere.

    cuDNN's kernel is tried once on a tiny causal batch, forward and backward: where this jax's
    cuDNN cannot run it, the model keeps XLA's attention (with a note) rather than fail.
    """
    device = jax.devices()[0]
    nvidia = (
        "nvidia" in device.device_kind.lower()
        or "cuda" in str(getattr(device.client, "platform_version", "")).lower()
    )
    capability = float(getattr(device, "compute_capability", 0) or 0)
    if device.platform != "gpu" or not nvidia or capability < 8.0:
        return None
    q = jnp.ones((1, 128, 1, 64), jnp.bfloat16)

    def attend(q: jax.Array) -> jax.Array:
        out = jax.nn.dot_product_attention(q, q, q, is_causal=True, implementation="cudnn")
        return out.astype(jnp.float32).sum()

    try:
        jax.block_until_ready(jax.grad(attend)(q))
    except Exception as error:  # any failure means: not on this machine
        print(f"cuDNN attention unavailable, using XLA's: {type(error).__name__}: {error}")
        return None
    return "cudnn"


def annotated(names: tuple[str, ...]) -> nnx.Initializer:
    return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)


class Block(nnx.Module):
    """Pre-norm causal self-attention and an MLP, each with a residual connection.

    ``dtype`` is flax's per-layer computation dtype (None: as the inputs; the precision policy
    sets it inside the step); ``attention`` is ``jax.nn.dot_product_attention``'s implementation.
    """

    def __init__(
        self,
        preset: Preset = CPU,
        *,
        rngs: nnx.Rngs,
        dtype: jnp.dtype | None = None,
        attention: str | None = None,
    ) -> None:
        embed, mlp = preset.embed, preset.mlp
        self.heads = preset.heads
        self.attention = attention
        self.norm1 = nnx.LayerNorm(embed, dtype=dtype, rngs=rngs)
        self.qkv = nnx.Linear(
            embed, 3 * embed, kernel_init=annotated(("embed", "mlp")), dtype=dtype, rngs=rngs
        )
        self.proj = nnx.Linear(
            embed, embed, kernel_init=annotated(("mlp", "embed")), dtype=dtype, rngs=rngs
        )
        self.norm2 = nnx.LayerNorm(embed, dtype=dtype, rngs=rngs)
        self.up = nnx.Linear(
            embed, mlp, kernel_init=annotated(("embed", "mlp")), dtype=dtype, rngs=rngs
        )
        self.down = nnx.Linear(
            mlp, embed, kernel_init=annotated(("mlp", "embed")), dtype=dtype, rngs=rngs
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, length, embed = x.shape
        q, k, v = jnp.split(self.qkv(self.norm1(x)), 3, axis=-1)
        q, k, v = (t.reshape(batch, length, self.heads, embed // self.heads) for t in (q, k, v))
        # cuDNN's kernel takes 16-bit inputs only: a float32 step falls back to XLA's
        fused = self.attention if q.dtype in (jnp.bfloat16, jnp.float16) else None
        attended = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=fused)
        x = x + self.proj(attended.reshape(batch, length, embed))
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class TransformerLM(nnx.Module):
    """Byte embeddings plus learned positions, ``preset.layers`` blocks, and a tied output layer."""

    def __init__(
        self,
        preset: Preset = CPU,
        *,
        rngs: nnx.Rngs,
        dtype: jnp.dtype | None = None,
        attention: str | None = None,
    ) -> None:
        init = nnx.with_partitioning(nnx.initializers.normal(0.02), ("vocab", "embed"))
        self.embed = nnx.Embed(VOCAB, preset.embed, embedding_init=init, dtype=dtype, rngs=rngs)
        self.position = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (preset.seq_len, preset.embed)),
            sharding_names=(None, "embed"),
        )
        self.blocks = nnx.List(
            [
                Block(preset, rngs=rngs, dtype=dtype, attention=attention)
                for _ in range(preset.layers)
            ]
        )
        self.norm = nnx.LayerNorm(preset.embed, dtype=dtype, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        x = x + self.position[...].astype(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.embed.attend(self.norm(x))


def analytic_flops(preset: Preset, batch_size: int) -> float:
    """The matrix FLOPs of one optimizer step on ``batch_size`` sequences, forward and backward.

    6·N·T for the N matmul parameters (each block's qkv, proj, up and down kernels, and the
    tied output layer) and the T tokens of the step, plus 12·L·T·S·d for attention (L layers,
    sequences of S, width d): QK^T and PV over the whole score matrix, 4·S·d per token and
    layer forward and twice that backward.
    """
    d, layers, seq = preset.embed, preset.layers, preset.seq_len
    matmul_params = layers * (4 * d * d + 2 * d * preset.mlp) + VOCAB * d
    tokens = batch_size * seq
    return 6 * matmul_params * tokens + 12 * layers * tokens * seq * d


def next_byte_loss(model: TransformerLM, batch: dict[str, jax.Array]) -> jax.Array:
    """Mean cross entropy (nats) of each next byte; logits in float32 whatever the compute dtype."""
    logits = model(batch["tokens"][:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["tokens"][:, 1:]).mean()


def load_text(max_files: int | None = MAX_FILES) -> tuple[np.ndarray, np.ndarray]:
    """The training and validation bytes: sorted stdlib sources, every tenth file validation."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:max_files]
    train = [f.read_bytes() for i, f in enumerate(files) if i % 10 != 9]
    val = [f.read_bytes() for i, f in enumerate(files) if i % 10 == 9]
    return np.frombuffer(b"".join(train), np.uint8), np.frombuffer(b"".join(val), np.uint8)


def unigram_entropy(data: np.ndarray) -> float:
    """The entropy, in nats, of the bytes' unigram distribution: the best loss without context."""
    counts = np.bincount(data, minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def windows(data: np.ndarray, starts: np.ndarray, seq_len: int = SEQ_LEN) -> dict[str, np.ndarray]:
    """Rows of ``seq_len + 1`` bytes (inputs and their next bytes) starting at ``starts``."""
    rows = data[starts[:, None] + np.arange(seq_len + 1)[None, :]]
    return {"tokens": rows.astype(np.int32)}


def build(preset: Preset, mesh: Mesh) -> tuple[TrainStep[TransformerLM], EvalStep[TransformerLM]]:
    """The sharded model and adamw, the bf16 ``TrainStep`` over ``mesh`` and its ``EvalStep``."""
    batch_sharding = create_data_parallel_sharding(mesh, "fsdp")
    attention = attention_implementation()

    def make() -> tuple[TransformerLM, nnx.Optimizer[TransformerLM]]:
        model = TransformerLM(preset, rngs=nnx.Rngs(SEED), attention=attention)
        rate, warmup = preset.learning_rate, min(preset.warmup_steps, preset.steps // 2)
        schedule = optax.warmup_cosine_decay_schedule(0.0, rate, warmup, preset.steps, 0.1 * rate)
        return model, nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.01), wrt=nnx.Param)

    model, optimizer = create_sharded_model(make, mesh, RULES)
    precision = PrecisionPolicy(param_dtype="float32", compute_dtype="bfloat16")
    step = TrainStep(
        model,
        optimizer,
        next_byte_loss,
        mesh=mesh,
        batch_sharding=batch_sharding,
        accumulate_steps=preset.accumulate_steps,
        precision=precision,
    )
    evaluate = EvalStep(step, next_byte_loss, batch_sharding=batch_sharding, precision=precision)
    return step, evaluate


def flop_check(preset: Preset, flops: float | None, params: int, devices: int) -> dict[str, object]:
    """Print the step's counted FLOPs against ``analytic_flops``; the figures for the summary."""
    analytic = analytic_flops(preset, preset.batch_size) / devices
    attention = attention_implementation() or "xla"
    ratio = None if flops is None else flops / analytic
    print(
        f"{params:,} parameters; FLOPs per step and device: counted "
        + ("none" if flops is None else f"{flops:.3e}")
        + f", analytic (6·N·T + 12·L·T·S·d) {analytic:.3e}"
        + ("" if ratio is None else f": {ratio:.3f}x")
        + f"; attention {attention}"
    )
    return {
        "preset": preset.name,
        "attention": attention,
        "batch_size": preset.batch_size,
        "seq_len": preset.seq_len,
        "analytic_flops_per_step_per_device": analytic,
        "flops_counted_over_analytic": ratio,
    }


def plot_if_possible(log_dir: Path) -> Path | None:
    """The metrics plot, or None where matplotlib (the ``plots`` extra) is not installed."""
    try:
        return plot_log_dir(log_dir)
    except MissingExtraError as error:  # an accelerator's image may come without matplotlib
        print(f"no plot: {error}")
        return None


def main(preset: Preset = CPU) -> dict[str, object]:
    start = time.perf_counter()
    outputs = resolve_output_dir("transformer_lm").path
    for leftover in ("logs", "profile"):  # a fresh run each time, never added to the last
        shutil.rmtree(outputs / leftover, ignore_errors=True)
    info = detect_devices()
    mesh = DeviceMeshManager.create_device_mesh({"fsdp": info.count})
    seq_len, batch_size, steps = preset.seq_len, preset.batch_size, preset.steps
    eval_every = min(preset.eval_every, steps)  # a short run still ends with a validation loss

    train, val = load_text(preset.max_files)
    baseline = unigram_entropy(train)
    rng = np.random.default_rng(SEED)
    val_starts = np.random.default_rng(SEED + 1).integers(
        0, len(val) - seq_len - 1, size=(preset.eval_batches, batch_size)
    )

    step, evaluate = build(preset, mesh)
    logger = create_logger("transformer_lm", log_dir=outputs / "logs", console=False)
    params = sum(x.size for x in jax.tree.leaves(nnx.state(step.model, nnx.Param)))
    logger.log_hyperparams(
        {
            "parameters": params,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "accumulate_steps": preset.accumulate_steps,
            "steps": steps,
            "learning_rate": preset.learning_rate,
            "devices": info.count,
            "train_bytes": len(train),
            "val_bytes": len(val),
            "compute_dtype": "bfloat16",
        }
    )
    first = windows(train, rng.integers(0, len(train) - seq_len - 1, size=batch_size), seq_len)
    flops = step.flops_per_step(first)  # per device and optimizer step: every microbatch
    meter = ThroughputMeter(
        logger,
        window=max(1, eval_every // 4),
        examples_per_step=batch_size,
        tokens_per_example=seq_len,
        flops_per_step=flops,
    )
    # an accelerator's preset checks the count against 6·N·T (the CPU run's figures stay as they are)
    checked = {} if preset.name == CPU.name else flop_check(preset, flops, params, info.count)
    profile_dir = outputs / "profile"
    profiler = (
        contextlib.nullcontext()
        if preset.profile_steps is None
        else ProfilerWindow(
            start_step=preset.profile_steps[0],
            num_steps=preset.profile_steps[1],
            log_dir=profile_dir,
        )
    )
    callbacks = CallbackList([meter, profiler] if isinstance(profiler, ProfilerWindow) else [meter])

    with profiler:
        callbacks.on_train_begin(None)
        losses = []
        batch = first
        for i in range(steps):
            callbacks.on_batch_begin(None, i)
            loss = step(batch)
            callbacks.on_batch_end(None, i, {"loss": loss})
            losses.append(loss)
            batch = windows(
                train, rng.integers(0, len(train) - seq_len - 1, size=batch_size), seq_len
            )
            if (i + 1) % eval_every == 0:
                with meter.pause():  # evaluating is not training: left out of tokens/s
                    recent = [float(x) for x in jax.device_get(losses[-eval_every:])]
                    for offset, value in enumerate(recent):
                        logger.log_scalar("train_loss", value, step=i + 1 - len(recent) + offset)
                    val_loss = float(
                        evaluate.evaluate(windows(val, s, seq_len) for s in val_starts)
                    )
                    logger.log_metrics({"val_loss": val_loss}, step=i + 1)
                mfu = meter.latest.get("mfu")
                print(
                    f"step {i + 1:4d}  train_loss {np.mean(recent):.3f}  val_loss {val_loss:.3f}  "
                    f"(unigram baseline {baseline:.3f})  "
                    f"tokens/s {meter.latest['tokens_per_sec']:,.0f}"
                    + ("" if mfu is None else f"  MFU {mfu:.1%}")
                )
        callbacks.on_train_end(None)
    logger.close()
    plot = plot_if_possible(outputs / "logs")

    summary_path = outputs / "summary.json"
    summary: dict[str, object] = {
        "devices": info.count,
        "platform": info.platform,
        "parameters": params,
        "steps": steps,
        "train_bytes": len(train),
        "val_bytes": len(val),
        "val_loss": val_loss,
        "unigram_baseline": baseline,
        "tokens_per_second": meter.latest["tokens_per_sec"],
        "mfu": meter.latest["mfu"],
        "flops_per_step_per_device": flops,
        **checked,
        # the FSDP layout the step keeps: each device holds 1/8 of this table
        "embedding_spec": list(step.model.embed.embedding.get_value().sharding.spec),
        "seconds": round(time.perf_counter() - start, 1),
        "outputs": {
            "metrics": str(outputs / "logs"),
            **({} if plot is None else {"plot": str(plot)}),
            **({} if preset.profile_steps is None else {"profile": str(profile_dir)}),
            "summary": str(summary_path),
        },
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    mfu = meter.latest.get("mfu")
    print(
        f"validation loss {val_loss:.3f} nats against the unigram baseline {baseline:.3f} "
        f"({baseline - val_loss:.3f} below); {summary['tokens_per_second']:,.0f} tokens/s; "
        + ("" if mfu is None else f"MFU {mfu:.1%}; ")
        + f"{summary['seconds']} s; outputs in {outputs}"
    )
    return summary


def parse_preset(argv: list[str] | None = None) -> Preset:
    """The preset the command line names, with its batch size and steps if given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=CPU.name)
    parser.add_argument("--batch-size", type=int, help="sequences per step (the preset's)")
    parser.add_argument("--steps", type=int, help="optimizer steps (the preset's)")
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="trace no steps (the preset traces 3 from step 20)",
    )
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    return dataclasses.replace(
        preset,
        batch_size=args.batch_size or preset.batch_size,
        steps=args.steps or preset.steps,
        profile_steps=None if args.no_profile else preset.profile_steps,
    )


if __name__ == "__main__":
    print(json.dumps(main(parse_preset())))
