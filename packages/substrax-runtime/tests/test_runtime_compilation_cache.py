"""The persistent compilation cache JaxRuntime keeps by default, seen from fresh interpreters."""

import logging
from pathlib import Path

from substrax.runtime import JaxRuntime, default_compilation_cache_dir, runtime_environment


_logger = logging.getLogger(__name__)

# One step of a small MLP's training, compiled from scratch in each fresh interpreter; it reports
# the time to its first finished step and the persistent-cache hits jax counted.
PROGRAM = """
import json, time
start = time.perf_counter()
import jax, jax.numpy as jnp
hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)

@jax.jit
def step(params, x):
    def loss(params):
        h = x
        for w in params:
            h = jnp.tanh(h @ w)
        return jnp.mean(h ** 2)
    value, grads = jax.value_and_grad(loss)(params)
    return [w - 0.1 * g for w, g in zip(params, grads)], value

params = [jnp.full((64, 64), 0.01) for _ in range(6)]
called = time.perf_counter()
params, value = step(params, jnp.ones((32, 64)))
value.block_until_ready()
done = time.perf_counter()
print(json.dumps({"first_step_s": done - start, "step_s": done - called, "hits": len(hits)}))
"""


def _run_twice(child, runtime: JaxRuntime) -> tuple[dict, dict]:
    env = runtime_environment(runtime, {})
    return child(PROGRAM, env=env), child(PROGRAM, env=env)


def _cache_files(directory: Path) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file()] if directory.exists() else []


def test_a_second_identical_run_loads_its_steps_from_the_default_cache(
    child, monkeypatch, tmp_path
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    cache = default_compilation_cache_dir()
    assert cache == tmp_path / "user-cache" / "substrax" / "jax"
    runtime = JaxRuntime(platforms=("cpu",), persistent_cache_min_compile_time_secs=0)
    first, second = _run_twice(child, runtime)
    assert first["hits"] == 0
    assert _cache_files(cache)
    assert all(path.stat().st_size > 0 for path in _cache_files(cache))
    assert second["hits"] >= 1
    # the measured times, for the record (timings are reported, never asserted)
    _logger.info(
        "time to the first step (jax's import included): %.2f s cold, %.2f s from the cache; "
        "the first call alone: %.3f s cold, %.3f s from the cache",
        first["first_step_s"],
        second["first_step_s"],
        first["step_s"],
        second["step_s"],
    )


def test_an_explicit_directory_overrides_the_default(child, tmp_path):
    runtime = JaxRuntime(
        platforms=("cpu",),
        compilation_cache_dir=tmp_path / "mine",
        persistent_cache_min_compile_time_secs=0,
    )
    _, second = _run_twice(child, runtime)
    assert _cache_files(tmp_path / "mine")
    assert second["hits"] >= 1


def test_an_explicit_off_keeps_no_cache(child, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    runtime = JaxRuntime(
        platforms=("cpu",), compilation_cache=False, persistent_cache_min_compile_time_secs=0
    )
    _, second = _run_twice(child, runtime)
    assert second["hits"] == 0
    assert _cache_files(tmp_path / "user-cache") == []


def test_a_directory_applied_after_jax_compiled_is_the_one_written(child, tmp_path):
    """Hostile finding: jax sets its cache up at the first compile, so a directory applied
    after it was taken silently and nothing was written there."""
    program = f"""
import json, os, jax, jax.numpy as jnp
from substrax.runtime import JaxRuntime, apply_runtime
jax.jit(lambda a: a + 1)(jnp.ones(4)).block_until_ready()  # jax set its cache up: none
files = []
for name in ("first", "second"):
    directory = {str(tmp_path)!r} + "/" + name
    apply_runtime(JaxRuntime(compilation_cache_dir=directory,
                             persistent_cache_min_compile_time_secs=0))
    jax.jit(lambda a, n=len(name): a * n + 1)(jnp.ones(len(files) + 5)).block_until_ready()
    files.append(sorted(os.listdir(directory)) if os.path.isdir(directory) else [])
print(json.dumps({{"first": len(files[0]), "second": len(files[1])}}))
"""
    counts = child(program, env={"JAX_PLATFORMS": "cpu"})
    assert counts["first"] >= 1, counts  # the first directory applied after a compile
    assert counts["second"] >= 1, counts  # and the one that replaced it
