"""place_batch_on_shards against a bare jax.device_put of the same batch and sharding.

Run: ``uv run python benchmarks/placement.py`` (8 emulated CPU devices, set before jax loads).
Goal: ``place_batch_on_shards`` within 1.1x of ``jax.device_put``. An int64 batch (x64 off) is
measured too, without a goal: its leaves' ranges are read (a min and a max each) before jax
narrows them to int32, which ``device_put`` does silently, wrapping ids past 2**31.
"""

from __future__ import annotations

import os
import statistics
import time


os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")


def main() -> None:
    import jax
    import numpy as np

    from substrax.mesh import create_device_mesh
    from substrax.spmd import create_data_parallel_sharding, place_batch_on_shards

    mesh = create_device_mesh({"data": jax.device_count()})
    sharding = create_data_parallel_sharding(mesh)
    rng = np.random.default_rng(0)
    batches = {
        "small (2 leaves, 64x32)": {
            "x": rng.normal(size=(64, 32)).astype(np.float32),
            "y": np.zeros((64, 1), np.float32),
        },
        "wide (8 leaves, 256x128)": {
            f"f{i}": rng.normal(size=(256, 128)).astype(np.float32) for i in range(8)
        },
        "images (1 leaf, 128x32x32x3)": {
            "image": rng.normal(size=(128, 32, 32, 3)).astype(np.float32)
        },
        # int64 from a host pipeline: with x64 off, each leaf's range is checked before jax
        # narrows it to int32 (device_put narrows out-of-range ids without a word)
        "tokens (int64, 256x1024)": {
            "ids": rng.integers(0, 50_000, size=(256, 1024), dtype=np.int64),
            "mask": np.ones((256, 1024), np.int64),
        },
    }

    def once(fn, batch, number: int) -> float:  # noqa: ANN001
        jax.block_until_ready(fn(batch, sharding))
        start = time.perf_counter()
        for _ in range(number):
            out = fn(batch, sharding)
        jax.block_until_ready(out)
        return (time.perf_counter() - start) / number * 1e6

    def timed(batch, repeats: int = 10, number: int = 100) -> tuple[float, float]:  # noqa: ANN001
        # interleaved, alternating which goes first, so both see the same machine load
        bare, ours = [], []
        for r in range(repeats):
            if r % 2:
                ours.append(once(place_batch_on_shards, batch, number))
                bare.append(once(jax.device_put, batch, number))
            else:
                bare.append(once(jax.device_put, batch, number))
                ours.append(once(place_batch_on_shards, batch, number))
        return statistics.median(bare), statistics.median(ours)

    print(f"{jax.device_count()} devices, sharding {sharding.spec}")
    print(f"{'batch':30} {'device_put us':>14} {'place_batch us':>15} {'ratio':>7}")
    for name, batch in batches.items():
        bare, ours = timed(batch)
        if name.startswith("tokens"):  # what refusing corrupted ids costs: no goal
            verdict = "each leaf's min and max read; no goal"
        else:
            verdict = f"{'met' if ours <= 1.1 * bare else 'MISSED'} <= 1.1x"
        print(f"{name:30} {bare:14.1f} {ours:15.1f} {ours / bare:6.2f}x  ({verdict})")


if __name__ == "__main__":
    main()
