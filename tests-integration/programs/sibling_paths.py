"""The code paths of calibrax 0.1.14 and datarax 0.1.17 that run through substrax.

Usage: ``python sibling_paths.py CHECK WORK_DIR``, in an environment holding this checkout's
built wheels and the two sibling releases (tests-integration/test_siblings.py builds it). Each
check exercises one path the way the sibling's users call it and prints one JSON line of what it
saw; the test asserts on it. Run with 8 emulated CPU devices (the test sets ``XLA_FLAGS``).

The paths (found by grepping the released sources for ``substrax``):

- calibrax.statistics.bootstrap_interval: its key through ``substrax.rng.key_from``;
- calibrax.profiling.hardware / roofline: ``substrax.devices.detect_devices``;
- calibrax.core records (``Run``, ``BenchmarkResult``...): ``substrax.records.read_record``;
- datarax.checkpoint.IteratorCheckpoint: ``substrax.checkpoint.OrbaxCheckpointStore``;
- datarax.config.registry's seeded streams: ``substrax.rng.rngs_from_seed``;
- datarax.sharding: slices per process, batches placed with ``substrax.mesh``/``substrax.spmd``.
"""

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _keys_equal(first: jax.Array, second: jax.Array) -> bool:
    return bool(np.array_equal(jax.random.key_data(first), jax.random.key_data(second)))


def calibrax_bootstrap(_work: Path) -> dict[str, Any]:
    from calibrax.statistics.bootstrap import bootstrap_interval

    from substrax.rng import MissingRngStreamError

    data = jnp.asarray(np.random.default_rng(0).normal(3.0, 1.0, size=200), jnp.float32)
    typed = bootstrap_interval(jnp.mean, data, key=jax.random.key(7), num_resamples=500)
    again = bootstrap_interval(jnp.mean, data, key=jax.random.key(7), num_resamples=500)
    raw = bootstrap_interval(jnp.mean, data, key=jax.random.PRNGKey(7), num_resamples=500)
    # An nnx.Rngs hands over its `sample` stream, else `default`.
    streams = bootstrap_interval(jnp.mean, data, key=nnx.Rngs(sample=7), num_resamples=500)
    fallback = bootstrap_interval(jnp.mean, data, key=nnx.Rngs(7), num_resamples=500)
    refusals: dict[str, list[str]] = {}
    for name, key in (("int seed", 7), ("no stream", nnx.Rngs(dropout=7))):
        try:
            bootstrap_interval(jnp.mean, data, key=key)  # pyright: ignore[reportArgumentType]
        except Exception as error:  # the test asserts on the type and message
            refusals[name] = [
                type(error).__name__,
                str(error),
                str(isinstance(error, MissingRngStreamError)),
            ]
    return {
        "value": float(typed.value),
        "lower": float(typed.lower),
        "upper": float(typed.upper),
        "samples_shape": list(typed.samples.shape),
        "repeatable": bool(np.array_equal(typed.samples, again.samples)),
        "raw_key_same_as_typed": bool(np.array_equal(typed.samples, raw.samples)),
        "sample_stream_differs_from_key": not np.array_equal(typed.samples, streams.samples),
        "default_stream_used": bool(np.all(np.isfinite(fallback.samples))),
        "refusals": refusals,
    }


def calibrax_hardware(_work: Path) -> dict[str, Any]:
    from calibrax.profiling.hardware import detect_hardware_specs, spec_for_device_kind
    from calibrax.profiling.roofline import RooflineAnalyzer, UnknownHardwareError

    from substrax.devices import detect_devices

    info = detect_devices()
    analyzer = RooflineAnalyzer()  # detects the spec through substrax.devices
    try:
        analyzer.analyze_operation(jnp.sin, jnp.ones(8))
        refused = ""
    except UnknownHardwareError as error:
        refused = str(error)
    v5p = spec_for_device_kind("TPU v5p")
    return {
        "platform": str(info.platform),
        "count": info.count,
        "device_kinds": list(info.device_kinds),
        "detected_spec": None if detect_hardware_specs() is None else "found",
        "analyzer_spec": None if analyzer.hardware_specs is None else "found",
        "refused": refused,
        "tpu_v5p": None if v5p is None else v5p.name,
    }


def calibrax_records(work: Path) -> dict[str, Any]:
    import pydantic
    from calibrax.core import Metric, MetricDef, MetricDirection, Point, Run
    from calibrax.core.result import BenchmarkResult

    run = Run(
        points=(
            Point(
                name="matmul",
                scenario="cpu-8",
                tags={"dtype": "float32"},
                metrics={
                    "latency_ms": Metric(value=1.5, lower=1.25, upper=2.0, samples=(1.5, 2.0))
                },
            ),
        ),
        commit="abc123",
        environment={"devices": 8, "x64": False},
        metric_defs={
            "latency_ms": MetricDef(name="latency_ms", unit="ms", direction=MetricDirection.LOWER)
        },
    )
    read_back = Run.from_dict(json.loads(json.dumps(run.to_dict())))
    result = BenchmarkResult(
        name="matmul", domain="linalg", metrics={"flops": Metric(value=2.5e9)}, config={"n": 512}
    )
    path = work / "results" / "matmul.json"
    result.save(path)
    loaded = BenchmarkResult.load(path)
    refusals: dict[str, str] = {}
    bad_metric = {"value": "fast"}
    missing_id = {key: value for key, value in run.to_dict().items() if key != "id"}
    for name, read in (
        ("metric value not a number", lambda: Metric.from_dict(bad_metric)),
        ("run without its id", lambda: Run.from_dict(missing_id)),
    ):
        try:
            read()
            refusals[name] = ""
        except (pydantic.ValidationError, ValueError, KeyError) as error:
            refusals[name] = type(error).__name__
    return {
        "run_round_trip": read_back == run,
        "timestamp_aware": read_back.timestamp.tzinfo is not None,
        "metric_type": type(read_back.points[0].metrics["latency_ms"]).__name__,
        "samples": list(read_back.points[0].metrics["latency_ms"].samples or ()),
        "direction": type(read_back.metric_defs["latency_ms"].direction).__name__,
        "result_round_trip": loaded == result,
        "refusals": refusals,
    }


class _Scale(nnx.Module):
    """A stage with a parameter, so the checkpoint carries module state besides positions."""

    def __init__(self) -> None:
        self.weight = nnx.Param(jnp.asarray(2.0))

    def __call__(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return {**batch, "x": batch["x"] * self.weight[...]}


def _pipeline(batch_size: int = 4) -> Any:
    from datarax import Pipeline
    from datarax.sources import MemorySource, MemorySourceConfig

    data = {
        "x": np.arange(40, dtype=np.float32).reshape(20, 2),
        "y": np.arange(20, dtype=np.int32),
    }
    # Shuffled, 5 batches an epoch: the batches after the checkpoint cross into a new epoch.
    source = MemorySource(MemorySourceConfig(shuffle=True), data, rngs=nnx.Rngs(shuffle=3))
    return Pipeline(
        source=source, stages=[_Scale()], batch_size=batch_size, rngs=nnx.Rngs(7), num_epochs=None
    )


def _take(iterator: Any, count: int) -> list[list[int]]:
    return [np.asarray(next(iterator)["y"]).tolist() for _ in range(count)]


def datarax_checkpoint_save(work: Path) -> dict[str, Any]:
    from datarax.checkpoint import IteratorCheckpoint

    pipeline = _pipeline()
    batches = iter(pipeline)
    served = _take(batches, 3)
    with IteratorCheckpoint(work / "pipeline", max_to_keep=2) as checkpoint:
        checkpoint.save(pipeline, 3, epoch=0, metadata={"note": "after three batches"})
        steps = checkpoint.all_steps()
    return {"served": served, "next": _take(batches, 6), "steps": steps}


def datarax_checkpoint_restore(work: Path) -> dict[str, Any]:
    from datarax.checkpoint import IteratorCheckpoint

    from substrax.checkpoint import OrbaxCheckpointStore

    pipeline = _pipeline()
    with IteratorCheckpoint(work / "pipeline", max_to_keep=2) as checkpoint:
        checkpoint.restore(pipeline)
        store = checkpoint.store
        record = store.restore(3).metadata
        latest = checkpoint.latest_step()
    return {
        "next": _take(iter(pipeline), 6),
        "latest": latest,
        "store": type(store).__name__,
        "is_orbax_store": isinstance(store, OrbaxCheckpointStore),
        "epoch": record.epoch,
        "extra": dict(record.extra),
    }


def datarax_prng(_work: Path) -> dict[str, Any]:
    from datarax.config.registry import create_component_from_config, register_component
    from datarax.core.prng import DEFAULT_RNG_STREAMS, per_record_keys

    from substrax.rng import rngs_from_seed

    @register_component("operator", "SiblingProbe")
    class Probe(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs, seed: int | None = None) -> None:
            self.rngs = rngs
            self.seed = seed

    def built(config: dict[str, Any]) -> nnx.Rngs:
        return create_component_from_config("operator", "SiblingProbe", config).rngs

    def same_streams(first: nnx.Rngs, second: nnx.Rngs) -> bool:
        return all(_keys_equal(first[name](), second[name]()) for name in DEFAULT_RNG_STREAMS)

    keys = per_record_keys(jax.random.key(0), jnp.arange(6), epoch=1)
    return {
        "seeded_matches_substrax": same_streams(
            built({"seed": 11}), rngs_from_seed(11, DEFAULT_RNG_STREAMS)
        ),
        "no_seed_is_seed_zero": same_streams(built({}), rngs_from_seed(0, DEFAULT_RNG_STREAMS)),
        "seeds_differ": not _keys_equal(
            built({"seed": 11})["augment"](), built({"seed": 12})["augment"]()
        ),
        "streams_differ": not _keys_equal(
            built({"seed": 11})["augment"](), built({"seed": 11})["dropout"]()
        ),
        "streams": sorted(DEFAULT_RNG_STREAMS),
        "record_keys_distinct": len({tuple(np.asarray(jax.random.key_data(k))) for k in keys}),
    }


def datarax_sharding(_work: Path) -> dict[str, Any]:
    from datarax import prefetch_to_device
    from datarax.sharding import JaxProcessSharderConfig, JaxProcessSharderModule

    from substrax.mesh import create_device_mesh
    from substrax.spmd import create_data_parallel_sharding, place_batch_on_shards

    sharder = JaxProcessSharderModule(JaxProcessSharderConfig(drop_remainder=True))
    rows = sharder.shard_data(np.arange(64, dtype=np.float32).reshape(32, 2))
    mesh = create_device_mesh({"data": jax.device_count()})
    sharding = create_data_parallel_sharding(mesh)
    placed = place_batch_on_shards({"x": rows}, sharding)
    batch = next(iter(_pipeline(batch_size=jax.device_count())))  # one row per device
    batch_placed = place_batch_on_shards({"x": batch["x"], "y": batch["y"]}, sharding)
    prefetched = prefetch_to_device(iter(_pipeline(batch_size=8)), size=2, device=sharding)
    first = next(prefetched)
    close: Callable[[], None] | None = getattr(prefetched, "close", None)
    if close is not None:
        close()
    return {
        "process_rows": int(rows.shape[0]),
        "process_count": int(sharder.process_count.get_value()),
        "devices": jax.device_count(),
        "placed_shards": len(placed["x"].addressable_shards),
        "placed_spec": str(placed["x"].sharding.spec),
        "placed_equal": bool(np.array_equal(np.asarray(placed["x"]), rows)),
        "batch_shards": [len(batch_placed[k].addressable_shards) for k in ("x", "y")],
        "batch_rows_per_device": {
            int(s.data.shape[0]) for s in batch_placed["x"].addressable_shards
        }
        == {1},
        "prefetched_spec": str(first["x"].sharding.spec)
        if hasattr(first["x"].sharding, "spec")
        else repr(first["x"].sharding),
        "prefetched_shards": len(first["x"].addressable_shards),
    }


CHECKS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "calibrax-bootstrap": calibrax_bootstrap,
    "calibrax-hardware": calibrax_hardware,
    "calibrax-records": calibrax_records,
    "datarax-checkpoint-save": datarax_checkpoint_save,
    "datarax-checkpoint-restore": datarax_checkpoint_restore,
    "datarax-prng": datarax_prng,
    "datarax-sharding": datarax_sharding,
}

if __name__ == "__main__":
    check, work = sys.argv[1], Path(sys.argv[2])
    print(json.dumps({"check": check, **CHECKS[check](work)}))
