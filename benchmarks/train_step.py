"""Microseconds per training step of a small MLP: nnx.jit against pure jax.jit paths.

Four ways to run the same Adam step, side by side in one process:

- ``nnx.jit``: ``@nnx.jit`` around ``substrax.spmd.spmd_train_step`` (the documented path);
- ``nnx.cached_partial``: the same ``nnx.jit`` step with the graph cached by flax;
- ``jax.jit (hand)``: a hand-written functional step, ``jax.jit`` over ``nnx.split`` state
  with ``donate_argnums``;
- ``TrainStep``: ``substrax.spmd.TrainStep``, the fast path.

Run: ``uv run python benchmarks/train_step.py`` (one device here, then 8 emulated devices
in a child process with ``JAX_NUM_CPU_DEVICES=8`` and the batch split over a data mesh).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from jax.sharding import Mesh


def measure(devices: int, steps: int, repeats: int) -> dict[str, float]:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["JAX_NUM_CPU_DEVICES"] = str(devices)
    import jax
    import numpy as np
    import optax
    from flax import nnx

    from substrax.mesh import create_device_mesh
    from substrax.spmd import (
        TrainStep,
        create_data_parallel_sharding,
        place_batch_on_shards,
        place_nnx_state_on_shards,
        spmd_train_step,
    )

    assert jax.device_count() == devices

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.l1 = nnx.Linear(32, 128, rngs=rngs)
            self.l2 = nnx.Linear(128, 128, rngs=rngs)
            self.l3 = nnx.Linear(128, 1, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.l3(jax.nn.relu(self.l2(jax.nn.relu(self.l1(x)))))

    def loss_fn(model: MLP, batch: dict[str, jax.Array]) -> jax.Array:
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    mesh = create_device_mesh({"data": devices})
    sharding = create_data_parallel_sharding(mesh)
    rng = np.random.default_rng(0)
    host = {
        "x": rng.normal(size=(64, 32)).astype(np.float32),
        "y": rng.normal(size=(64, 1)).astype(np.float32),
    }
    batch = place_batch_on_shards(host, sharding)

    def fresh() -> tuple[MLP, nnx.Optimizer[MLP]]:
        model = MLP(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
        nnx.update(model, place_nnx_state_on_shards(nnx.state(model), mesh))
        nnx.update(optimizer, place_nnx_state_on_shards(nnx.state(optimizer), mesh))
        return model, optimizer

    # name -> (one step, the mesh to run it under, or None when the step enters it itself)
    runners: dict[str, tuple[Callable[[], jax.Array], Mesh | None]] = {}

    # 1. nnx.jit around spmd_train_step
    model, optimizer = fresh()

    @nnx.jit
    def nnx_step(
        model: MLP, optimizer: nnx.Optimizer[MLP], batch: dict[str, jax.Array]
    ) -> jax.Array:
        return spmd_train_step(model, optimizer, loss_fn, batch)

    nnx_pair = (model, optimizer)  # bound now: the names are reused below
    runners["nnx.jit + spmd_train_step"] = (lambda: nnx_step(*nnx_pair, batch), mesh)

    # 2. nnx.cached_partial
    model, optimizer = fresh()
    cached = nnx.cached_partial(nnx_step, model, optimizer)
    runners["nnx.cached_partial"] = (lambda: cached(batch), mesh)

    # 3. hand-written jax.jit over split state, donated
    model, optimizer = fresh()
    graphdef, state = nnx.split((model, optimizer))

    def pure(state, batch):  # noqa: ANN001, ANN202
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    hand = jax.jit(pure, donate_argnums=0)
    box = [state]

    def hand_step() -> jax.Array:
        box[0], loss = hand(box[0], batch)
        return loss

    runners["jax.jit (hand-written)"] = (hand_step, mesh)

    # 4. substrax TrainStep
    model, optimizer = fresh()
    fast = TrainStep(model, optimizer, loss_fn, mesh=mesh, batch_sharding=sharding)
    runners["substrax TrainStep"] = (lambda: fast(batch), None)  # enters the mesh itself

    # Round-robin: every repeat times each path once, so all see the same machine load.
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, (run_step, context) in runners.items():
            with jax.set_mesh(context) if context is not None else contextlib.nullcontext():
                jax.block_until_ready(run_step())
                start = time.perf_counter()
                for _ in range(steps):
                    out = run_step()
                jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / steps * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def table(devices: int, results: dict[str, float]) -> str:
    hand = results["jax.jit (hand-written)"]
    fast = results["substrax TrainStep"]
    lines = [
        f"\n{devices} device(s), small MLP (32-128-128-1, batch 64, adam)",
        f"{'path':32} {'us/step':>9} {'vs hand':>8} {'vs TrainStep':>13}",
    ]
    for name, us in results.items():
        lines.append(f"{name:32} {us:9.0f} {us / hand:7.2f}x {us / fast:12.2f}x")
    nnx_jit = results["nnx.jit + spmd_train_step"]
    lines.append(
        f"goal: TrainStep <= 1.1x hand-written: {fast / hand:.2f}x ({'met' if fast <= 1.1 * hand else 'MISSED'}); "
        f"nnx.jit / TrainStep >= 5x: {nnx_jit / fast:.1f}x ({'met' if nnx_jit >= 5 * fast else 'MISSED'})"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--devices", type=int, default=None, help="measure in this process on N devices, print JSON"
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.devices is not None:
        print(json.dumps(measure(args.devices, args.steps, args.repeats)))
        return
    for devices in (1, 8):
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--devices",
                str(devices),
                "--steps",
                str(args.steps),
                "--repeats",
                str(args.repeats),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
        print(table(devices, json.loads(child.stdout.strip().splitlines()[-1])), flush=True)


if __name__ == "__main__":
    main()
