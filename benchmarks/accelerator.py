"""The training loop's accelerator goals, measured on whatever device is present, each met or MISSED.

Run: ``uv run python benchmarks/accelerator.py [--quick] [--json PATH] [--only NAME ...]``.
One process, on jax's default device (the first GPU or TPU; the CPU where there is none), one
device per step. Each measurement below is the same code on every backend; the sizes are an
accelerator's (meant to take under 5 minutes on one H200, compilations included; not measured
there yet) or, on the CPU, small versions that run in a minute or two (``--quick``; a few
minutes without): the decoder of 1, 2 and 7 at embed 128, 4 heads, 2 layers, MLP 512, 8
sequences of 128; the example's CPU model (embed 64, 8 sequences of 64) in place of the ~13M
decoder. A goal about an accelerator's speed is then shown with its CPU figure and the verdict
"needs an accelerator".

1. ``precision``: a step of a 100M decoder (the ``examples/transformer_lm.py`` model: embed 1024,
   16 heads, 8 layers, MLP 4096; 16 sequences of 1024 bytes; adamw) built three ways: float32;
   float32 parameters under ``PrecisionPolicy(param_dtype="float32",
   compute_dtype="bfloat16")``; and flax's per-layer ``dtype=jnp.bfloat16``. Goals: the
   policy's step at most 1.05x flax's per-layer bf16, and at least 1.4x faster than float32.
   The bf16 steps use cuDNN's fused attention on an NVIDIA GPU (its kernel takes 16-bit inputs
   only), the float32 step XLA's.
2. ``flops``: ``TrainStep.cost(batch).flops`` of the policy's step against the analytic count
   (:func:`analytic_flops`, written out below: 6·N·T for the matmul parameters plus 12·L·T·S·d
   for attention). Goal: within 10%. The count is read from the step's jaxpr on every backend,
   so it is judged on the CPU too; the cuDNN attention's count is checked on an NVIDIA GPU only.
3. ``logging``: a ``FileLogger`` given the step's ``jax.Array`` loss every step, against the
   same loop without it, on a ~13M decoder (embed 512, 8 heads, 4 layers, MLP 2048; 16
   sequences of 1024: 5.1 ms a step on an H200 in bf16). Neither loop reads the loss: the
   logged one must not wait for the device either. Each run ends when its last loss is computed
   and the logger has flushed (``flush()``: every line written and fsynced, a few ms that the
   figures also show apart); the runs are interleaved in rounds (each round in another order,
   as ``loop_overhead.py`` does), and the cost is the median over rounds of logged over bare.
   A run is 600 steps on an accelerator, about 3 s: a durable flush that often is more than a
   loop needs (``CheckpointCallback(flush=...)`` flushes at each save); the first H200 run used 200
   steps and measured +1.08%. Goal: at most 1% of the step.
4. ``mfu``: the example's ``--preset gpu`` (about GPT-2 small, 32 sequences of 1024, bf16
   policy, cuDNN attention) for 30 steps after its warm-up, through ``ThroughputMeter`` with
   ``flops_per_step=step.flops_per_step(batch)``, each step given a new batch from the host as
   in the example's loop (and again with one batch kept on the device, the figure beside it).
   Goal: MFU at least 35%. The CPU runs the
   example's CPU preset instead (no MFU: no known peak).
5. ``trainstep``: ``TrainStep`` against a hand-written ``jax.jit`` step (``nnx.split`` state,
   donated) on the ~13M decoder, interleaved rounds. Goal: at most 1.1x (as ``train_step.py``).
6. ``checkpoint``: the ~13M decoder's loop with ``OrbaxCheckpointStore`` saving every N steps
   (100 on an accelerator, 10 on the CPU) against plain orbax's async ``CheckpointManager``
   and the bare loop (``loop_overhead.py``'s save variants). Every loop reads its loss at the
   steps it could save, so the three pay the same syncs. Goals: the loop waits in the store's
   ``save`` no longer than in orbax's, and the store's overhead on the loop (the wait for
   pending saves at a run's end included) is no more than orbax's: the store writes through
   orbax's public ``CheckpointManager`` (its manifest besides), so it matches orbax rather
   than beating it by half as it did writing steps itself from orbax's private modules.
7. ``store``: the checkpoint store on the 100M decoder's float32 ``TrainStep`` (goal 1's, its
   81-85 ms step on an H200) and its adamw state, 1.17 GB of float32 (on the CPU the small
   decoder of 1 and 2, 5 MB). Goals, each judged on an accelerator only: (a) an async
   ``OrbaxCheckpointStore.save`` blocks the caller at most 2x as long as a bare
   ``jax.device_get`` of the same state (the median of a few saves, each once the one before
   was written, and of as many ``device_get`` of a fresh device copy, since jax keeps an
   array's host copy once fetched; interleaved; a first save before, untimed); (b) the loop
   saving every 25 steps (10 on the CPU) adds at most 5% to the bare loop's time in steady
   state: without the one wait for the last save at a run's end, which is shown apart with
   the figure that includes it (interleaved rounds of 100 steps on an accelerator; both loops
   read the loss at the steps where one saves, as in 6); (c) a restore
   onto the device (the state's abstract arrays with their shardings as templates, checksums
   checked, the store opened in the timing) at least 1.3x faster than plain orbax's (a
   ``CheckpointManager`` with its defaults, ``StandardSave`` then ``StandardRestore`` onto the
   same abstract tree), each from a step written once by itself, its files read once (untimed)
   just before so both read from the page cache; the median of 3 rounds, with the store's
   restore of a step written without checksums (``use_checksums=False``) beside them.

Under the table: the figures behind each verdict. ``--json PATH`` writes every result (and the
device, versions and sizes) to PATH, rewritten after each goal, so that a run cut short still
leaves what it measured. An error in one goal is reported as such and the others still run; the
exit status is then 1.
"""

# ruff: noqa: ANN401  (steps, batches and states of any model are typed Any)

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from substrax.runtime import JaxRuntime, apply_runtime


# One CPU device when jax runs on the CPU (the example would ask for 8 when imported): every step
# here runs on one device. JaxRuntime's compilation cache is on, as in the example: a later run of
# the example's GPU preset (benchmarks/device_run.sh) finds its step compiled.
if "JAX_NUM_CPU_DEVICES" not in os.environ:
    apply_runtime(JaxRuntime(cpu_devices=1))
# loop_overhead.py, whose save variants goal 6 reuses, puts jax on the CPU unless JAX_PLATFORMS
# says otherwise: an empty value leaves jax its own choice, the accelerator where there is one.
os.environ.setdefault("JAX_PLATFORMS", "")
# loop_overhead.py beside this file, and the example model
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import jax
import jax.numpy as jnp
import loop_overhead
import numpy as np
import optax
import orbax.checkpoint as ocp
import transformer_lm as lm
from flax import nnx
from jax.sharding import Mesh

from substrax.callbacks import ThroughputMeter
from substrax.mesh import create_sharded_model
from substrax.spmd import PrecisionPolicy, TrainStep, create_data_parallel_sharding
from substrax.support import format_table


NEEDS = "needs an accelerator"
GOALS = ("precision", "flops", "logging", "mfu", "trainstep", "checkpoint", "store")
VERSIONS = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    """What each goal runs: the models, and the steps and rounds of each timing."""

    decoder: lm.Preset  # goals 1, 2 and 7
    small: lm.Preset  # goals 3, 5 and 6
    mfu: lm.Preset  # goal 4
    precision: tuple[int, int]  # rounds, steps per run
    logging: tuple[int, int]
    trainstep: tuple[int, int]
    checkpoint: tuple[int, int]
    save_stride: int  # steps between the save variants' calls (a save every EVERY calls)
    mfu_steps: int
    store: tuple[int, int]  # goal 7b: rounds, steps per run
    store_every: int  # 7b: steps between saves
    store_saves: int  # 7a: saves timed, and as many device_get
    store_restores: int  # 7c: rounds of restores


def sizes(*, accelerator: bool, quick: bool) -> Sizes:
    """An accelerator's sizes, or small ones on the CPU; ``quick`` runs fewer rounds."""
    if accelerator:
        decoder = dataclasses.replace(
            lm.GPU,
            name="100M decoder",
            embed=1024,
            heads=16,
            layers=8,
            mlp=4096,
            seq_len=1024,
            batch_size=16,
        )
        small = dataclasses.replace(
            lm.GPU,
            name="13M decoder",
            embed=512,
            heads=8,
            layers=4,
            mlp=2048,
            seq_len=1024,
            batch_size=16,
        )
        if quick:
            return Sizes(
                decoder=decoder,
                small=small,
                mfu=lm.GPU,
                precision=(3, 5),
                logging=(5, 300),
                trainstep=(3, 30),
                checkpoint=(2, 200),
                save_stride=10,
                mfu_steps=20,
                store=(2, 50),
                store_every=25,
                store_saves=3,
                store_restores=3,
            )
        return Sizes(
            decoder=decoder,
            small=small,
            mfu=lm.GPU,
            precision=(5, 10),
            logging=(7, 600),
            trainstep=(5, 50),
            checkpoint=(3, 300),
            save_stride=10,
            mfu_steps=30,
            store=(2, 100),
            store_every=25,
            store_saves=5,
            store_restores=3,
        )
    decoder = dataclasses.replace(
        lm.CPU,
        name="small decoder",
        embed=128,
        heads=4,
        layers=2,
        mlp=512,
        seq_len=128,
        batch_size=8,
        accumulate_steps=1,
    )
    small = dataclasses.replace(
        lm.CPU, name="the example's CPU model", batch_size=8, accumulate_steps=1
    )
    return Sizes(
        decoder=decoder,
        small=small,
        mfu=lm.CPU,
        precision=(3, 3) if quick else (5, 5),
        logging=(5, 50) if quick else (7, 200),
        trainstep=(3, 20) if quick else (5, 50),
        checkpoint=(3, 30) if quick else (5, 50),
        save_stride=1,
        mfu_steps=4 if quick else 10,
        store=(2, 20) if quick else (3, 30),
        store_every=10,
        store_saves=3 if quick else 5,
        store_restores=3,
    )


def analytic_flops(preset: lm.Preset, batch: int) -> tuple[float, float]:
    """The analytic matrix FLOPs of one optimizer step of the decoder: (6·N·T, 12·L·T·S·d).

    N counts the matmul parameters: each of the L blocks' kernels, qkv (d x 3d), proj (d x d),
    up (d x m) and down (m x d), and the output layer (the byte embedding, V x d, tied); the
    embedding lookup, the positions, biases and norms multiply nothing. T is the step's tokens
    (batch x S). A token costs 2N forward and 4N backward (the gradients of the inputs and of
    the weights): 6·N·T. Attention adds, per layer and token, QK^T and PV over the whole score
    matrix (causal or not, as the counter counts it): 2·S·d each forward, twice both backward,
    12·S·d in all: 12·L·T·S·d.
    """
    d, layers, seq, m = preset.embed, preset.layers, preset.seq_len, preset.mlp
    n = layers * (3 * d * d + d * d + d * m + m * d) + lm.VOCAB * d
    t = batch * seq
    return 6 * n * t, 12 * layers * t * seq * d


@dataclasses.dataclass(kw_only=True)
class Result:
    """One goal's verdict, the figure it rests on, and the numbers behind it."""

    goal: str
    what: str
    measured: str
    target: str
    verdict: str
    values: dict[str, Any] = dataclasses.field(default_factory=dict)


def verdict(met: bool, *, accelerator_goal: bool, on_accelerator: bool) -> str:
    """met or MISSED; a goal about an accelerator's speed measured on the CPU needs one."""
    if accelerator_goal and not on_accelerator:
        return NEEDS
    return loop_overhead._verdict(met)  # the house verdict's words


def interleaved(
    runs: dict[str, Callable[[int], Any]], rounds: int, steps: int
) -> dict[str, list[float]]:
    """Seconds per step of each run, one figure per round.

    A run takes ``steps`` steps and returns what to wait for; it counts as done when that is
    computed. Every round runs each once, in a new order, so a drift in the machine's load
    hits them all alike.
    """
    order = random.Random(0)  # noqa: S311  (an order of runs, not a secret)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        names = list(runs)
        order.shuffle(names)
        for name in names:
            start = time.perf_counter()
            jax.block_until_ready(runs[name](steps))
            times[name].append((time.perf_counter() - start) / steps)
    return times


def ratio(times: dict[str, list[float]], top: str, bottom: str) -> float:
    """The median over rounds of ``top``'s time over ``bottom``'s in the same round."""
    return statistics.median(a / b for a, b in zip(times[top], times[bottom], strict=True))


def ms(seconds: list[float]) -> float:
    """The median of per-step seconds, in ms."""
    return statistics.median(seconds) * 1e3


def tokens(preset: lm.Preset, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of random bytes of ``preset``'s shape (the speed does not depend on the text)."""
    rows = np.random.default_rng(seed).integers(
        0, lm.VOCAB, (preset.batch_size, preset.seq_len + 1)
    )
    return {"tokens": rows.astype(np.int32)}


def one_device() -> Mesh:
    """A mesh of the first device: the example's model names its weights' axes, so it needs one."""
    return Mesh(np.array(jax.devices()[:1]), ("fsdp",))


def decoder(
    preset: lm.Preset, mesh: Mesh, *, dtype: Any = None
) -> tuple[lm.TransformerLM, nnx.Optimizer[Any]]:
    """The example's model at ``preset``'s size with adamw on ``mesh``, ``dtype`` per layer."""

    def make() -> tuple[lm.TransformerLM, nnx.Optimizer[Any]]:
        model = lm.TransformerLM(
            preset, rngs=nnx.Rngs(0), dtype=dtype, attention=lm.attention_implementation()
        )
        return model, nnx.Optimizer(model, optax.adamw(1e-4, weight_decay=0.01), wrt=nnx.Param)

    return create_sharded_model(make, mesh, lm.RULES)


def train_step(
    preset: lm.Preset, mesh: Mesh, *, policy: bool = False, dtype: Any = None
) -> TrainStep[Any]:
    """A ``TrainStep`` of the decoder on ``mesh``, under the bf16 policy or not."""
    model, optimizer = decoder(preset, mesh, dtype=dtype)
    precision = PrecisionPolicy(param_dtype="float32", compute_dtype="bfloat16") if policy else None
    sharding = create_data_parallel_sharding(mesh, "fsdp")
    return TrainStep(
        model, optimizer, lm.next_byte_loss, mesh=mesh, batch_sharding=sharding, precision=precision
    )


def on_device(preset: lm.Preset, mesh: Mesh) -> dict[str, jax.Array]:
    """``tokens(preset)`` placed on ``mesh`` as the steps take it."""
    return jax.device_put(tokens(preset), create_data_parallel_sharding(mesh, "fsdp"))


def steps_of(step: Callable[[Any], Any], batch: Any) -> Callable[[int], Any]:
    """A run of ``n`` calls of ``step`` on ``batch`` that returns the last loss."""

    def run(n: int) -> Any:
        loss = None
        for _ in range(n):
            loss = step(batch)
        return loss

    return run


class Bench:
    """The goals, sharing the models they build (the 13M decoder's step serves 3, 5 and 6, the
    100M decoder's float32 step 1 and 7)."""

    def __init__(self, sizes: Sizes, *, accelerator: bool, base: Path) -> None:
        self.sizes = sizes
        self.accelerator = accelerator
        self.base = base
        self.mesh = one_device()
        self.policy_step: TrainStep[Any] | None = None
        self._small: tuple[TrainStep[Any], dict[str, jax.Array]] | None = None
        self._float32: tuple[TrainStep[Any], dict[str, jax.Array]] | None = None
        # the small decoder computes in bf16 per layer on an accelerator, float32 on the CPU
        self.small_dtype = jnp.bfloat16 if accelerator else None

    def judge(self, met: bool, *, accelerator_goal: bool) -> str:
        return verdict(met, accelerator_goal=accelerator_goal, on_accelerator=self.accelerator)

    def small(self) -> tuple[TrainStep[Any], dict[str, jax.Array]]:
        """The ~13M decoder's step (compiled) and its batch on the device."""
        if self._small is None:
            step = train_step(self.sizes.small, self.mesh, dtype=self.small_dtype)
            batch = on_device(self.sizes.small, self.mesh)
            jax.block_until_ready(step(batch))
            self._small = step, batch
        return self._small

    def float32(self) -> tuple[TrainStep[Any], dict[str, jax.Array]]:
        """The 100M decoder's float32 step (compiled; goal 1's when it ran) and its batch."""
        if self._float32 is None:
            step = train_step(self.sizes.decoder, self.mesh)
            batch = on_device(self.sizes.decoder, self.mesh)
            jax.block_until_ready(step(batch))
            self._float32 = step, batch
        return self._float32

    # 1 -----------------------------------------------------------------------------------------
    def precision(self) -> Iterator[Result]:
        preset = self.sizes.decoder
        batch = on_device(preset, self.mesh)
        steps = {
            "float32": train_step(preset, self.mesh),
            "bf16 policy": train_step(preset, self.mesh, policy=True),
            "flax per-layer bf16": train_step(preset, self.mesh, dtype=jnp.bfloat16),
        }
        compile_s = {}
        for name, step in steps.items():
            start = time.perf_counter()
            jax.block_until_ready(step(batch))
            compile_s[name] = round(time.perf_counter() - start, 1)
            jax.block_until_ready(step(batch))
        times = interleaved(
            {name: steps_of(step, batch) for name, step in steps.items()}, *self.sizes.precision
        )
        self.policy_step = steps["bf16 policy"]
        self._float32 = steps["float32"], batch  # goal 7 saves and restores its state
        per_step = {name: ms(t) for name, t in times.items()}
        print(
            f"1. decoder {params(steps['float32']) / 1e6:.1f}M parameters, {preset.batch_size}x"
            f"{preset.seq_len} tokens, adamw; ms/step "
            + ", ".join(f"{name} {value:.2f}" for name, value in per_step.items())
            + f" (median of {self.sizes.precision[0]} rounds of {self.sizes.precision[1]} steps;"
            f" first step, compile included: {compile_s} s); attention"
            f" {lm.attention_implementation() or 'xla'} where the step computes in bf16"
        )
        policy = ratio(times, "bf16 policy", "flax per-layer bf16")
        speedup = ratio(times, "float32", "bf16 policy")
        values = {"ms_per_step": per_step, "first_step_s": compile_s}
        yield Result(
            goal="1a",
            what="bf16 policy's step vs flax per-layer dtype=bf16",
            measured=f"{policy:.3f}x",
            target="<= 1.05x",
            verdict=self.judge(policy <= 1.05, accelerator_goal=True),
            values={**values, "policy_over_flax_bf16": policy},
        )
        yield Result(
            goal="1b",
            what="float32 step over the bf16 policy's",
            measured=f"{speedup:.2f}x",
            target=">= 1.4x",
            verdict=self.judge(speedup >= 1.4, accelerator_goal=True),
            values={**values, "float32_over_policy": speedup},
        )

    # 2 -----------------------------------------------------------------------------------------
    def flops(self) -> Iterator[Result]:
        preset = self.sizes.decoder
        step = self.policy_step or train_step(preset, self.mesh, policy=True)
        self.policy_step = None  # the bf16 decoders go (goal 7 keeps the float32 one, 1.2 GB)
        cost = step.cost(tokens(preset))
        matmuls, attention = analytic_flops(preset, preset.batch_size)
        analytic = (matmuls + attention) / cost.devices
        n = matmuls / (6 * preset.batch_size * preset.seq_len)
        print(
            f"2. analytic: 6·N·T = 6 x {n:,.0f} x {preset.batch_size * preset.seq_len:,} ="
            f" {matmuls:.4e}; 12·L·T·S·d = 12 x {preset.layers} x"
            f" {preset.batch_size * preset.seq_len:,} x {preset.seq_len} x {preset.embed} ="
            f" {attention:.4e}; per device {analytic:.4e}. Counted (TrainStep.cost, per device):"
            + (f" {cost.flops:.4e}" if cost.flops is not None else f" none ({cost.flops_reason})")
            + f"; bytes accessed (XLA) {cost.bytes_accessed}"
        )
        values = {
            "counted_per_device": cost.flops,
            "analytic_per_device": analytic,
            "analytic_matmul": matmuls,
            "analytic_attention": attention,
            "matmul_parameters": n,
            "flops_reason": cost.flops_reason,
            "bytes_accessed": cost.bytes_accessed,
        }
        if cost.flops is None:
            yield Result(
                goal="2",
                what="counted FLOPs vs 6·N·T + 12·L·T·S·d",
                measured=f"none: {cost.flops_reason}",
                target="within 10%",
                verdict=loop_overhead._verdict(False),
                values=values,
            )
            return
        counted = cost.flops / analytic
        yield Result(
            goal="2",
            what="counted FLOPs vs 6·N·T + 12·L·T·S·d",
            measured=f"{counted:.3f}x ({cost.flops:.3e})",
            target="within 10%",
            verdict=self.judge(abs(counted - 1) <= 0.10, accelerator_goal=False),
            values={**values, "counted_over_analytic": counted},
        )

    # 3 -----------------------------------------------------------------------------------------
    def logging(self) -> Iterator[Result]:
        from substrax.tracking import FileLogger

        step, batch = self.small()
        logger = FileLogger("bench", self.base / "file-log")
        count = [0]
        in_calls: list[float] = []

        flushes: list[float] = []

        def logged(n: int) -> Any:
            loss, inside = None, 0.0
            for _ in range(n):
                loss = step(batch)
                called = time.perf_counter()
                logger.log_scalar("loss", loss, step=count[0])
                inside += time.perf_counter() - called
                count[0] += 1
            jax.block_until_ready(loss)  # the flush's own time, apart from waiting for the step
            called = time.perf_counter()
            logger.flush()  # what was logged is on disk (fsynced) before the run counts as done
            flushes.append(time.perf_counter() - called)
            in_calls.append(inside / n)
            return loss

        runs = {"bare": steps_of(step, batch), "file log every step": logged}
        try:
            for run in runs.values():  # warm up: the logger's first write, the allocator
                jax.block_until_ready(run(20))
            in_calls.clear()
            flushes.clear()
            times = interleaved(runs, *self.sizes.logging)
        finally:
            logger.close()
        cost = ratio(times, "file log every step", "bare") - 1
        bare = ms(times["bare"])
        call = statistics.median(in_calls) * 1e3
        flush = statistics.median(flushes) * 1e3
        print(
            f"3. decoder {params(step) / 1e6:.1f}M parameters, {self.sizes.small.batch_size}x"
            f"{self.sizes.small.seq_len} tokens: bare {bare:.2f} ms/step, logged"
            f" {ms(times['file log every step']):.2f} ms/step (median of"
            f" {self.sizes.logging[0]} rounds of {self.sizes.logging[1]} steps); the log_scalar"
            f" call itself {call:.3f} ms per step on the training thread, the durable flush"
            f" (fsync) ending each run {flush:.2f} ms; the loss is never read by the loop"
        )
        yield Result(
            goal="3",
            what=f"FileLogger given the jax.Array loss every step ({bare:.1f} ms step)",
            measured=f"{cost:+.2%}",
            target="<= 1% of the step",
            verdict=self.judge(cost <= 0.01, accelerator_goal=True),
            values={
                "overhead": cost,
                "bare_ms": bare,
                "logged_ms": ms(times["file log every step"]),
                "call_ms": call,
                "flush_ms": flush,
                "rounds": times,
            },
        )

    # 4 -----------------------------------------------------------------------------------------
    def mfu(self) -> Iterator[Result]:
        preset = self.sizes.mfu
        step, _ = lm.build(preset, self.mesh)
        batch = tokens(preset)
        start = time.perf_counter()
        flops = step.flops_per_step(batch)
        for _ in range(3):  # the first compiles
            loss = step(batch)
        jax.block_until_ready(loss)
        warm = time.perf_counter() - start

        def metered(next_batch: Callable[[int], Any]) -> tuple[ThroughputMeter, dict[str, Any]]:
            meter = ThroughputMeter(
                window=self.sizes.mfu_steps,
                examples_per_step=preset.batch_size,
                tokens_per_example=preset.seq_len,
                flops_per_step=flops,
            )
            loss = step(next_batch(0))
            meter.on_train_begin(None)
            meter.on_batch_end(None, 0, {"loss": loss})  # the clock starts once this is done
            for i in range(1, self.sizes.mfu_steps + 1):
                meter.on_batch_begin(None, i)
                loss = step(next_batch(i))
                meter.on_batch_end(None, i, {"loss": loss})
            meter.on_train_end(None)  # the window's end, computed
            return meter, meter.latest

        # as the example's loop: a new batch of bytes from the host every step
        meter, latest = metered(lambda i: tokens(preset, seed=i))
        # the same batch on the device every step: no host work beside the step's
        _, resident = metered(lambda _: batch)
        matmuls, attention = analytic_flops(preset, preset.batch_size)
        counted = None if flops is None else flops / (matmuls + attention)
        mfu = latest.get("mfu")
        print(
            f"4. the example's {preset.name} preset: {params(step) / 1e6:.1f}M parameters,"
            f" {preset.batch_size}x{preset.seq_len} tokens, attention"
            f" {lm.attention_implementation() or 'xla'}: {latest['tokens_per_sec']:,.0f} tokens/s,"
            f" {1e3 / latest['steps_per_sec']:.1f} ms/step over {self.sizes.mfu_steps} steps"
            f" with a new host batch each step, {1e3 / resident['steps_per_sec']:.1f} ms/step"
            f" with one batch kept on the device (warm-up with the compile {warm:.0f} s); FLOPs"
            " per step counted"
            + (" none" if flops is None else f" {flops:.3e}, {counted:.3f}x the analytic")
            + (
                "; peak unknown"
                if meter.peak_flops is None
                else f"; peak {meter.peak_flops / 1e12:.0f} TFLOP/s"
            )
        )
        values = {
            "preset": preset.name,
            "tokens_per_sec": latest["tokens_per_sec"],
            "ms_per_step": 1e3 / latest["steps_per_sec"],
            "ms_per_step_batch_on_device": 1e3 / resident["steps_per_sec"],
            "mfu_batch_on_device": resident.get("mfu"),
            "flops_per_step": flops,
            "counted_over_analytic": counted,
            "peak_flops": meter.peak_flops,
            "mfu": mfu,
        }
        if mfu is None:
            measured = "no MFU: " + ("no FLOP count" if flops is None else "no known peak")
            met = False
        else:
            measured, met = f"{mfu:.1%}", mfu >= 0.35
        yield Result(
            goal="4",
            what=f"MFU of the example's {preset.name} preset",
            measured=measured,
            target=">= 35%",
            verdict=self.judge(met, accelerator_goal=True),
            values=values,
        )

    # 5 -----------------------------------------------------------------------------------------
    def trainstep(self) -> Iterator[Result]:
        step, batch = self.small()
        mesh = self.mesh
        model, optimizer = decoder(self.sizes.small, mesh, dtype=self.small_dtype)
        graphdef, state = nnx.split((model, optimizer))

        def pure(state: Any, batch: Any) -> tuple[Any, jax.Array]:
            model, optimizer = nnx.merge(graphdef, state)
            loss, grads = nnx.value_and_grad(lm.next_byte_loss)(model, batch)
            optimizer.update(model, grads)
            return nnx.state((model, optimizer)), loss

        hand = jax.jit(pure, donate_argnums=0)
        box = [state]

        def hand_step(batch: Any) -> jax.Array:
            with jax.set_mesh(mesh):  # as TrainStep enters its mesh at each call
                box[0], loss = hand(box[0], batch)
            return loss

        jax.block_until_ready(hand_step(batch))
        runs = {
            "TrainStep": steps_of(step, batch),
            "jax.jit (hand-written)": steps_of(hand_step, batch),
        }
        times = interleaved(runs, *self.sizes.trainstep)
        over = ratio(times, "TrainStep", "jax.jit (hand-written)")
        print(
            f"5. decoder {params(step) / 1e6:.1f}M parameters: TrainStep"
            f" {ms(times['TrainStep']):.2f} ms/step, hand-written jax.jit"
            f" {ms(times['jax.jit (hand-written)']):.2f} ms/step (median of"
            f" {self.sizes.trainstep[0]} rounds of {self.sizes.trainstep[1]} steps)"
        )
        yield Result(
            goal="5",
            what="TrainStep vs a hand-written jax.jit step",
            measured=f"{over:.3f}x",
            target="<= 1.1x",
            verdict=self.judge(over <= 1.1, accelerator_goal=False),
            values={
                "trainstep_over_hand": over,
                "ms_per_step": {k: ms(v) for k, v in times.items()},
            },
        )

    # 6 -----------------------------------------------------------------------------------------
    def checkpoint(self) -> Iterator[Result]:
        step, batch = self.small()
        stride = self.sizes.save_stride
        every = stride * loop_overhead.EVERY  # its variants save at every EVERY-th call
        variants = {
            "bare": loop_overhead.Variant(),
            "store": loop_overhead._store(self.base, step),
            "plain orbax": loop_overhead._orbax(self.base, step),
        }

        def loop(variant: loop_overhead.Variant) -> Callable[[int], Any]:
            def run(n: int) -> Any:
                loss = None
                for i in range(n):
                    loss = step(batch)
                    if i % stride == stride - 1:  # every loop reads its loss here
                        variant.after(i, float(loss))
                variant.end()  # the wait for pending saves is the loop's
                return loss

            return run

        runs = {name: loop(variant) for name, variant in variants.items()}
        try:
            for run in runs.values():  # warm up: each writer's first saves
                jax.block_until_ready(run(2 * every))
            for variant in variants.values():
                variant.in_save.clear()
            times = interleaved(runs, *self.sizes.checkpoint)
        finally:
            for variant in variants.values():
                variant.close()
        state_mb = sum(x.nbytes for x in jax.tree.leaves(step.state)) / 2**20
        blocked = {
            n: statistics.median(variants[n].in_save) * 1e3 for n in ("store", "plain orbax")
        }
        overhead = {n: ratio(times, n, "bare") - 1 for n in ("store", "plain orbax")}
        print(
            f"6. decoder state {state_mb:.0f} MB (parameters and adamw), a save every {every}"
            f" steps: ms/step bare {ms(times['bare']):.2f}, store {ms(times['store']):.2f},"
            f" plain orbax {ms(times['plain orbax']):.2f} (median of {self.sizes.checkpoint[0]}"
            f" rounds of {self.sizes.checkpoint[1]} steps, pending saves awaited); the loop waits"
            f" in save() {blocked['store']:.1f} ms (store) and {blocked['plain orbax']:.1f} ms"
            f" (orbax) per save, max {max(variants['store'].in_save) * 1e3:.0f} and"
            f" {max(variants['plain orbax'].in_save) * 1e3:.0f} ms"
        )
        values = {
            "state_mb": state_mb,
            "save_every": every,
            "blocking_ms_per_save": blocked,
            "overhead": overhead,
            "ms_per_step": {k: ms(v) for k, v in times.items()},
        }
        block = blocked["store"] / blocked["plain orbax"]
        yield Result(
            goal="6a",
            what=f"loop's wait in the store's save vs orbax's (every {every} steps)",
            measured=f"{blocked['store']:.1f} vs {blocked['plain orbax']:.1f} ms, {block:.2f}x",
            target="<= 1x",
            verdict=self.judge(block <= 1.0, accelerator_goal=False),
            values=values,
        )
        store, orbax = overhead["store"], overhead["plain orbax"]
        yield Result(
            goal="6b",
            what="store's overhead on the loop vs plain orbax's",
            measured=f"{store:+.1%} vs {orbax:+.1%}",
            target="<= orbax's",
            verdict=self.judge(store <= orbax, accelerator_goal=False),
            values=values,
        )

    # 7 -----------------------------------------------------------------------------------------
    def store(self) -> Iterator[Result]:
        from substrax.checkpoint import OrbaxCheckpointStore

        step, batch = self.float32()
        jax.block_until_ready(step.state)
        gb = sum(x.nbytes for x in jax.tree.leaves(step.state)) / 2**30  # as goal 6's MB
        root = self.base / "goal-7-store"  # goal 6 writes under "store"
        store = OrbaxCheckpointStore(root, max_to_keep=2)
        numbers = itertools.count()  # the steps saved, increasing from 7a on through 7b
        try:
            yield self._store_blocking(store, numbers, step, gb)
            yield self._store_loop(store, numbers, step, batch, gb)
        finally:
            store.close()
            shutil.rmtree(root, ignore_errors=True)
        yield self._store_restore(step, gb)
        self._float32 = None  # the last goal to use it

    def _store_blocking(
        self, store: Any, numbers: Iterator[int], step: TrainStep[Any], gb: float
    ) -> Result:
        """7a: what an async save blocks the caller, against a bare ``jax.device_get``."""
        state = step.state
        store.save(next(numbers), {"model": state})  # a tree's first save: not what a run repeats
        store.wait()
        jax.device_get(state)  # and the first copy to the host
        blocked: list[float] = []  # seconds in save()
        written: list[float] = []  # seconds from the call until the step was written
        fetched: list[float] = []  # seconds in device_get
        for i in range(self.sizes.store_saves):
            for what in ("save", "device_get") if i % 2 == 0 else ("device_get", "save"):
                started = time.perf_counter()
                if what == "save":
                    store.save(next(numbers), {"model": state})
                    blocked.append(time.perf_counter() - started)
                    store.wait()  # each save once the one before is written
                    written.append(time.perf_counter() - started)
                else:
                    # a fresh copy on the device: jax keeps an array's host copy once fetched,
                    # so fetching ``state`` again would time a cache (the first H200 run's 5.6 ms)
                    fresh = jax.block_until_ready(jax.device_put(state, may_alias=False))
                    started = time.perf_counter()
                    host = jax.device_get(fresh)
                    fetched.append(time.perf_counter() - started)
                    del host, fresh
        block, fetch = statistics.median(blocked), statistics.median(fetched)
        over = block / fetch
        print(
            f"7a. decoder {params(step) / 1e6:.1f}M parameters, float32 state {volume(gb)}"
            f" (parameters and adamw): an async save blocks the caller {block * 1e3:.1f} ms"
            f" (median of {len(blocked)}, max {max(blocked) * 1e3:.1f}), the step written"
            f" {statistics.median(written) * 1e3:.0f} ms after the call; jax.device_get"
            f" {fetch * 1e3:.1f} ms ({rate(gb, fetch)}, median of {len(fetched)},"
            " interleaved)"
        )
        return Result(
            goal="7a",
            what=f"async store.save's block vs jax.device_get ({volume(gb)})",
            measured=f"{block * 1e3:.1f} vs {fetch * 1e3:.1f} ms, {over:.2f}x",
            target="<= 2x",
            verdict=self.judge(over <= 2.0, accelerator_goal=True),
            values={
                "state_gb": gb,
                "save_blocks_ms": block * 1e3,
                "device_get_ms": fetch * 1e3,
                "save_over_device_get": over,
                "written_ms": statistics.median(written) * 1e3,
                "save_blocks_s_each": blocked,
                "written_s_each": written,
                "device_get_s_each": fetched,
            },
        )

    def _store_loop(
        self,
        store: Any,
        numbers: Iterator[int],
        step: TrainStep[Any],
        batch: dict[str, jax.Array],
        gb: float,
    ) -> Result:
        """7b: the loop saving every ``store_every`` steps against the bare loop.

        The store has saved this state's tree in 7a, and the step is compiled: no warm-up.
        """
        every = self.sizes.store_every
        in_save: list[float] = []  # seconds the loop spent in save()
        ends: list[float] = []  # seconds a run waited for its pending save at its end

        def loop(*, save: bool) -> Callable[[int], Any]:
            def run(n: int) -> Any:
                loss = None
                for i in range(n):
                    loss = step(batch)
                    if i % every == every - 1:
                        value = float(loss)  # both loops read the loss here
                        if save:
                            started = time.perf_counter()
                            store.save(
                                next(numbers), {"model": step.state}, metrics={"loss": value}
                            )
                            in_save.append(time.perf_counter() - started)
                if save:
                    started = time.perf_counter()
                    store.wait()  # the wait for the pending save is the loop's
                    ends.append(time.perf_counter() - started)
                return loss

            return run

        saving = f"saving every {every} steps"
        times = interleaved({"bare": loop(save=False), saving: loop(save=True)}, *self.sizes.store)
        rounds, steps = self.sizes.store
        with_end = ratio(times, saving, "bare") - 1
        # a run of thousands of steps waits for its last save once: a round's saving run
        # without that wait is the loop's cost per save, in steady state
        times["steady"] = [t - end / steps for t, end in zip(times[saving], ends, strict=True)]
        cost = ratio(times, "steady", "bare") - 1
        bare, saved = ms(times["bare"]), ms(times[saving])
        print(
            f"7b. the float32 step, state {volume(gb)}, a save every {every} steps: bare"
            f" {bare:.2f} ms/step, saving {saved:.2f} ms/step (median of {rounds} rounds of"
            f" {steps} steps, {steps // every} saves a run); the loop waits in save()"
            f" {statistics.median(in_save) * 1e3:.1f} ms per save (max"
            f" {max(in_save) * 1e3:.1f}), {statistics.median(ends) * 1e3:.1f} ms for the pending"
            f" save at a run's end; {cost:+.2%} without that wait (steady state), {with_end:+.2%}"
            f" with it in a run of {steps} steps"
        )
        return Result(
            goal="7b",
            what=f"loop saving every {every} steps vs bare ({bare:.1f} ms step), steady state",
            measured=f"{cost:+.2%}",
            target="<= 5% of the loop",
            verdict=self.judge(cost <= 0.05, accelerator_goal=True),
            values={
                "overhead": cost,
                "overhead_with_end_wait": with_end,
                "save_every": every,
                "ms_per_step": {"bare": bare, "saving": saved},
                "in_save_ms": statistics.median(in_save) * 1e3,
                "end_wait_ms": statistics.median(ends) * 1e3,
                "rounds": times,
            },
        )

    def _store_restore(self, step: TrainStep[Any], gb: float) -> Result:
        """7c: a restore onto the device from the page cache, the store's against orbax's."""
        from substrax.checkpoint import OrbaxCheckpointStore

        state = step.state
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
        )
        checked, unchecked, orbax = "store", "store, no checksums", "plain orbax"
        roots = {
            name: self.base / f"goal-7-restore-{i}"
            for i, name in enumerate((checked, unchecked, orbax))
        }

        def store_restore(name: str, *, checks: bool) -> Callable[[], Any]:
            def restore() -> Any:
                with OrbaxCheckpointStore(roots[name], use_checksums=checks) as reader:
                    restored = reader.restore(0, templates={"model": abstract}).items["model"]
                    return jax.block_until_ready(restored)

            return restore

        def orbax_restore() -> Any:
            with ocp.CheckpointManager(roots[orbax]) as manager:
                restored = manager.restore(0, args=ocp.args.StandardRestore(abstract))
                return jax.block_until_ready(restored)

        readers = {
            checked: store_restore(checked, checks=True),
            unchecked: store_restore(unchecked, checks=False),
            orbax: orbax_restore,
        }
        times: dict[str, list[float]] = {name: [] for name in readers}
        order = random.Random(0)  # noqa: S311  (an order of runs, not a secret)
        try:
            for name, checks in ((checked, True), (unchecked, False)):  # each step written once
                with OrbaxCheckpointStore(roots[name], use_checksums=checks) as writer:
                    writer.save(0, {"model": state})
            with ocp.CheckpointManager(roots[orbax]) as manager:
                manager.save(0, args=ocp.args.StandardSave(state))
                manager.wait_until_finished()
            for _ in range(self.sizes.store_restores):
                names = list(readers)
                order.shuffle(names)
                for name in names:
                    read_files(roots[name])  # in the page cache for every reader alike
                    started = time.perf_counter()
                    restored = readers[name]()
                    times[name].append(time.perf_counter() - started)
                    same(restored, state, name)
                    del restored
        finally:
            for root in roots.values():
                shutil.rmtree(root, ignore_errors=True)
        median = {name: statistics.median(t) for name, t in times.items()}
        speedup = median[orbax] / median[checked]
        print(
            f"7c. restore of the {volume(gb)} state onto {jax.devices()[0].platform} (abstract"
            " templates with their shardings, files in the page cache, the store or manager"
            f" opened in the timing; median of {self.sizes.store_restores}): store"
            f" {median[checked] * 1e3:.0f} ms ({rate(gb, median[checked])}), without"
            f" checksums {median[unchecked] * 1e3:.0f} ms ({rate(gb, median[unchecked])}),"
            f" plain orbax {median[orbax] * 1e3:.0f} ms ({rate(gb, median[orbax])})"
        )
        return Result(
            goal="7c",
            what="store's restore (checksums checked) vs plain orbax's",
            measured=f"{speedup:.2f}x ({median[checked]:.2f} vs {median[orbax]:.2f} s)",
            target=">= 1.3x faster",
            verdict=self.judge(speedup >= 1.3, accelerator_goal=True),
            values={
                "state_gb": gb,
                "orbax_over_store": speedup,
                "orbax_over_store_unchecked": median[orbax] / median[unchecked],
                "restore_s": median,
                "restore_s_each": times,
            },
        )


def volume(gb: float) -> str:
    """``gb`` (2**30 bytes) as GB, or as MB (2**20 bytes) below 1 GB."""
    return f"{gb:.2f} GB" if gb >= 1 else f"{gb * 1024:.1f} MB"


def rate(gb: float, seconds: float) -> str:
    """``gb`` (2**30 bytes) in ``seconds``, in GB/s, or in MB/s below 1 GB/s."""
    return volume(gb / seconds) + "/s"


def read_files(root: Path) -> int:
    """Read every file under ``root`` once, untimed: a restore then finds it in the page cache."""
    total = 0
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 24):
                    total += len(chunk)
    return total


def same(restored: Any, state: Any, reader: str) -> None:
    """Raise unless ``restored`` holds ``state``'s arrays, on their shardings."""
    pairs = zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True)
    for got, want in pairs:
        placed = got.sharding.is_equivalent_to(want.sharding, want.ndim)
        if not placed or not bool(jnp.array_equal(got, want)):
            raise AssertionError(f"{reader}'s restore differs from the saved state")


def params(step: TrainStep[Any]) -> int:
    """The parameters of a step's model, counted in its state.

    Not through ``step.model``: that syncs the step, whose every call would then write its state
    back into the objects, a cost the goals timed after the count would pay.
    """
    return sum(x.size for x in jax.tree.leaves(nnx.filter_state(step.state, nnx.Param)))


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    """Where the figures come from: the device, the host and the versions."""
    device = jax.devices()[0]
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "devices": jax.device_count(),
        "host": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores",
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in VERSIONS},
    }


def table(results: list[Result]) -> str:
    rows = [[r.goal, r.what, r.measured, r.target, r.verdict] for r in results]
    return format_table(["goal", "what", "measured", "target", "verdict"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    parser.add_argument("--only", nargs="+", choices=GOALS, metavar="NAME", help=f"of {GOALS}")
    args = parser.parse_args()

    started = time.perf_counter()
    about = machine()
    accelerator = about["platform"] != "cpu"
    chosen = sizes(accelerator=accelerator, quick=args.quick)
    print(
        f"{about['device_kind']} ({about['platform']}, {about['devices']} device(s), one used);"
        f" {about['host']}; Python {about['python']}; "
        + ", ".join(f"{k} {v}" for k, v in about["versions"].items())
        + ("; --quick" if args.quick else "")
        + ("" if accelerator else "; no accelerator: small sizes, speed goals not judged"),
        flush=True,
    )
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": about,
        "quick": args.quick,
        "sizes": dataclasses.asdict(chosen),
        "results": [],
        "errors": {},
    }
    results: list[Result] = []
    base = Path(tempfile.mkdtemp(prefix="substrax-accelerator-bench-"))
    bench = Bench(chosen, accelerator=accelerator, base=base)
    try:
        for name in args.only or GOALS:
            goal_started = time.perf_counter()
            try:
                results.extend(getattr(bench, name)())
            except Exception as error:  # one goal's failure leaves the others to run
                traceback.print_exc()
                message = f"{type(error).__name__}: {error}".splitlines()[0][:200]
                results.append(
                    Result(goal=name, what=name, measured=message, target="", verdict="error")
                )
                report["errors"][name] = traceback.format_exc()
            report["results"] = [dataclasses.asdict(r) for r in results]
            report.setdefault("seconds", {})[name] = round(time.perf_counter() - goal_started, 1)
            print(f"   ({name}: {report['seconds'][name]} s)", flush=True)
            if args.json:
                args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print(table(results))
    judged = [r for r in results if r.verdict in ("met", "MISSED")]
    waiting = [r.goal for r in results if r.verdict == NEEDS]
    print(
        f"goals met: {sum(r.verdict == 'met' for r in judged)} of {len(judged)} judged"
        + (f"; {', '.join(waiting)} need an accelerator" if waiting else "")
        + f"; {time.perf_counter() - started:.0f} s in all"
    )
    return 1 if any(r.verdict == "error" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
