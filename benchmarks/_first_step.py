"""One fresh run of the transformer LM example's train step, up to its first result (a helper).

    python benchmarks/_first_step.py CACHE_DIR SPAWNED_AT [MIN_COMPILE_SECONDS]

Run by ``benchmarks/compile_cache.py`` in a fresh interpreter with ``JAX_PLATFORMS=cpu`` and
``JAX_NUM_CPU_DEVICES=8`` in its environment. It imports what a training script imports, then,
from ``JaxRuntime`` setup on, builds the example's model sharded over 8 devices, its
``TrainStep`` (FSDP, bf16 compute, 2 microbatches) and runs one step. The setup is
``apply_runtime`` with the compilation cache in ``CACHE_DIR`` (through ``jax.config``, as jax is
imported by then) and ``MIN_COMPILE_SECONDS`` as its ``persistent_cache_min_compile_time_secs``
(jax's default when not given). It prints one JSON line: wall-clock seconds since ``SPAWNED_AT``
(the parent's ``time.time()`` just before it started this process) at the end of each phase,
and jax's persistent-cache hits.
"""

import json
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    cache, spawned = Path(sys.argv[1]), float(sys.argv[2])
    marks: dict[str, float] = {"interpreter": time.time() - spawned}
    # what a training script imports, timed from here
    sys.path.insert(0, str(ROOT / "examples"))
    import jax
    import numpy as np
    import optax
    import transformer_lm as lm
    from flax import nnx

    from substrax.mesh import DeviceMeshManager, create_sharded_model
    from substrax.runtime import JaxRuntime, apply_runtime
    from substrax.spmd import PrecisionPolicy, TrainStep, create_data_parallel_sharding

    marks["imports"] = time.time() - spawned
    hits: list[str] = []
    jax.monitoring.register_event_listener(
        lambda event, **_: (
            hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
        )
    )

    threshold = float(sys.argv[3]) if len(sys.argv) > 3 else None
    apply_runtime(
        JaxRuntime(
            platforms=("cpu",),
            cpu_devices=8,
            compilation_cache_dir=cache,
            persistent_cache_min_compile_time_secs=threshold,
        )
    )
    mesh = DeviceMeshManager.create_device_mesh({"fsdp": len(jax.devices())})
    batch_sharding = create_data_parallel_sharding(mesh, "fsdp")
    marks["runtime and mesh"] = time.time() - spawned

    def make() -> tuple[lm.TransformerLM, nnx.Optimizer[lm.TransformerLM]]:
        model = lm.TransformerLM(rngs=nnx.Rngs(lm.SEED))
        return model, nnx.Optimizer(model, optax.adamw(lm.LEARNING_RATE), wrt=nnx.Param)

    model, optimizer = create_sharded_model(make, mesh, lm.RULES)
    marks["sharded model"] = time.time() - spawned
    precision = PrecisionPolicy(param_dtype="float32", compute_dtype="bfloat16")
    step = TrainStep(
        model,
        optimizer,
        lm.next_byte_loss,
        mesh=mesh,
        batch_sharding=batch_sharding,
        accumulate_steps=lm.ACCUMULATE_STEPS,
        precision=precision,
    )
    marks["TrainStep"] = time.time() - spawned
    tokens = np.random.default_rng(0).integers(0, 256, size=(lm.BATCH_SIZE, lm.SEQ_LEN + 1))
    loss = step({"tokens": tokens.astype(np.int32)})
    float(loss)  # the first step's result, on the host
    marks["first step"] = time.time() - spawned
    print(json.dumps({"marks": marks, "cache_hits": len(hits)}))


if __name__ == "__main__":
    main()
