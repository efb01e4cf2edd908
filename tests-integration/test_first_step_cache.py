"""A second identical run of the LM example's sharded TrainStep loads its programs from the cache.

The run is ``benchmarks/_first_step.py`` (what ``benchmarks/compile_cache.py`` times), in fresh
interpreters on 8 emulated CPU devices: FSDP, bf16 compute and gradient accumulation all go into
the compiled step, and its cache key must come out the same in a new process.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PHASES = ["interpreter", "imports", "runtime and mesh", "sharded model", "TrainStep", "first step"]


def first_step(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env |= {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"}
    result = subprocess.run(
        # every compilation written, however fast this machine compiles it
        [sys.executable, "benchmarks/_first_step.py", str(cache), repr(time.time()), "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_second_run_finds_the_init_and_the_step_in_the_cache(tmp_path):
    cache = tmp_path / "jax-cache"
    cold = first_step(cache)
    assert cold["cache_hits"] == 0
    written = sorted(path.name for path in cache.iterdir())
    assert any(name.startswith("jit_init") for name in written)  # the sharded model's init
    assert len(written) >= 2  # and the train step
    warm = first_step(cache)
    assert warm["cache_hits"] >= 2
    assert sorted(path.name for path in cache.iterdir()) == written  # nothing new to compile
    for run in (cold, warm):  # the phases are reported in order
        assert list(run["marks"]) == PHASES
        times = [run["marks"][phase] for phase in PHASES]
        assert times == sorted(times)
