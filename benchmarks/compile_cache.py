"""Time to the first step of a fresh process, with a cold and then a warm compilation cache.

Run: ``uv run python benchmarks/compile_cache.py [--rounds 3] [--quick]``. Each round starts
two fresh interpreters (``benchmarks/_first_step.py``) one after the other on one new, empty
cache directory: the first compiles and fills it (cold), the second is the identical run that
finds it filled (warm). Each builds the transformer LM example's model (FSDP over 8 emulated CPU
devices, bf16 compute, 2 microbatches, adamw; its init and train step are the programs that
compile) and takes one train step. Two figures per run:

* **from process start**: from the parent's clock just before it starts the process to the
  first step's loss on the host: the interpreter, the imports (jax, flax, optax, substrax),
  then everything below;
* **from setup**: from ``JaxRuntime`` setup (``apply_runtime``, right after the imports) to
  the first step's result: the devices and mesh, the sharded model's init, the ``TrainStep``
  and the first step, whose programs are compiled (cold) or loaded (warm).

The goal (a warm cache cuts the time to the first step by half or more) is judged on the
second: imports are paid whether or not anything compiles (jax alone is about a second here,
and more on a loaded machine), so they dilute the from-start ratio by a constant that no
cache can remove; the from-setup span is what the cache can act on. The from-start figures are
printed beside it, with where the warm run's time goes, phase by phase.

It runs twice over: with jax's default threshold for writing to the cache (compilations of a
second or more, what ``JaxRuntime`` keeps by default) and with every compilation written
(``persistent_cache_min_compile_time_secs=0``): a compilation under jax's threshold is not
written, and on a quiet machine this step's compile (about 0.9 s here) is near it. The rounds
alternate the two variants; times are medians over rounds and each ratio is the median of the
pairs' own ratios (a pair runs back to back, so a load drift hits both of its runs alike). On
this shared 2-core machine single runs move by tens of percent, even by several times under
other work, so the spread (min-max) is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
CHILD = HERE / "_first_step.py"
PHASES = ("interpreter", "imports", "runtime and mesh", "sharded model", "TrainStep", "first step")
VARIANTS: dict[str, str | None] = {
    "jax's default threshold (1 s)": None,
    "every compilation cached (0 s)": "0",
}
GOAL = 0.5  # warm over cold, from setup


def run_child(cache: Path, threshold: str | None, timeout: float) -> dict[str, object]:
    """One fresh run; its phase marks (seconds since it was started) and its cache hits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env |= {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8", "PYTHONUNBUFFERED": "1"}
    extra = [threshold] if threshold is not None else []
    result = subprocess.run(
        [sys.executable, str(CHILD), str(cache), repr(time.time()), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the first-step run failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def from_setup(marks: dict[str, float]) -> float:
    """Seconds from ``JaxRuntime`` setup (the end of the imports) to the first step's result."""
    return marks["first step"] - marks["imports"]


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def main() -> int:
    """Measure and print the tables; 0 whatever the figures (a benchmark, not a test)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="cold/warm pairs per variant")
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds

    runs: dict[tuple[str, str], list[dict[str, object]]] = {}
    root = Path(tempfile.mkdtemp(prefix="compile-cache-bench-"))
    try:
        for index in range(rounds):
            names = list(VARIANTS) if index % 2 == 0 else list(reversed(VARIANTS))
            for name in names:
                cache = root / f"{index}-{len(runs)}"
                for kind in ("cold", "warm"):
                    run = run_child(cache, VARIANTS[name], args.timeout)
                    runs.setdefault((name, kind), []).append(run)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(
        f"time to the first step's result, seconds, median of {rounds} fresh cold/warm pairs "
        "(spread min-max); transformer LM example, 8 CPU devices"
    )
    header = f"{'variant':<32}{'run':>6}{'from start':>12}{'spread':>12}{'from setup':>12}"
    print(f"{header}{'spread':>12}{'cache hits':>12}")
    for name in VARIANTS:
        for kind in ("cold", "warm"):
            marks = [run["marks"] for run in runs[(name, kind)]]  # pyright: ignore[reportUnknownVariableType]
            start = [m["first step"] for m in marks]  # pyright: ignore[reportUnknownVariableType]
            setup = [from_setup(m) for m in marks]  # pyright: ignore[reportUnknownArgumentType]
            hits = [int(run["cache_hits"]) for run in runs[(name, kind)]]  # pyright: ignore[reportArgumentType]
            print(
                f"{name:<32}{kind:>6}{statistics.median(start):>12.2f}{spread(start):>12}"
                f"{statistics.median(setup):>12.2f}{spread(setup):>12}"
                f"{statistics.median(hits):>12.0f}"
            )

    print()
    print(
        "warm over cold, median over rounds of each pair's ratio (a pair runs back to back, "
        f"so load drifts hit both alike); goal: from setup <= {GOAL:.2f}"
    )
    for name in VARIANTS:
        pairs = list(zip(runs[(name, "cold")], runs[(name, "warm")], strict=True))
        start = [w["marks"]["first step"] / c["marks"]["first step"] for c, w in pairs]  # pyright: ignore[reportIndexIssue, reportUnknownVariableType]
        setup = [from_setup(w["marks"]) / from_setup(c["marks"]) for c, w in pairs]  # pyright: ignore[reportArgumentType, reportUnknownVariableType]
        ratio = statistics.median(setup)  # pyright: ignore[reportUnknownArgumentType]
        verdict = "met" if ratio <= GOAL else "NOT met"
        print(
            f"{name:<32} from start {statistics.median(start):.2f} ({spread(start)})"  # pyright: ignore[reportUnknownArgumentType]
            f"   from setup {ratio:.2f} ({spread(setup)})   goal {verdict}"  # pyright: ignore[reportUnknownArgumentType]
        )

    print()
    print("where the time goes, median seconds per phase (each phase's own time)")
    print(f"{'variant':<32}{'run':>6}" + "".join(f"{phase:>18}" for phase in PHASES))
    for name in VARIANTS:
        for kind in ("cold", "warm"):
            marks = [run["marks"] for run in runs[(name, kind)]]  # pyright: ignore[reportUnknownVariableType]
            cells = []
            for i, phase in enumerate(PHASES):
                before = PHASES[i - 1] if i else None
                own = [m[phase] - (m[before] if before else 0.0) for m in marks]  # pyright: ignore[reportUnknownVariableType]
                cells.append(f"{statistics.median(own):>18.2f}")  # pyright: ignore[reportUnknownArgumentType]
            print(f"{name:<32}{kind:>6}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
