"""Import time of every substrax part against ``import jax``, each against the 5% goal.

Every import runs in a fresh interpreter, several times (alternating, so drift hits all alike);
the table shows medians of the import itself, measured inside the child with
``time.perf_counter`` so interpreter start-up is left out:

- ``alone``: the part imported first, in a fresh interpreter;
- ``beyond jax``: the part imported after ``import jax``, i.e. what it adds to a program that
  uses jax anyway.

A part that imports no jax is held to ``alone`` (``substrax-compute status`` pays all of it); a
part built on jax (mesh, spmd, checkpoint...) is held to ``beyond jax``, since jax's own import
is not the part's. Goal: each part under 5% of jax's import time.

Usage: ``uv run python benchmarks/import_time.py [--runs 7] [--check]`` (``--check``: exit 1
when a part misses the goal).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


GOAL = 0.05

# part: the module its users import
PARTS = {
    "runtime": "substrax.runtime",
    "mesh": "substrax.mesh",
    "spmd": "substrax.spmd",
    "checkpoint": "substrax.checkpoint",
    "tracking": "substrax.tracking",
    "compute": "substrax.compute",
    "testing": "substrax.testing",
    "substrax (meta-package)": "substrax",
}

CHILD = """
import json, sys, time
exec(sys.argv[1])
start = time.perf_counter()
exec(sys.argv[2])
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "jax": "jax" in sys.modules}))
"""


def _measure(setup: str, statement: str, env: dict[str, str]) -> tuple[float, bool]:
    """Seconds ``statement`` took after ``setup`` in a fresh interpreter; whether jax was loaded."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, setup, statement],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return float(result["seconds"]), bool(result["jax"])


def _cases() -> dict[str, tuple[str, str]]:
    """Every measurement: name -> (setup, statement)."""
    cases = {"jax": ("pass", "import jax")}
    for part, module in PARTS.items():
        cases[f"{part} alone"] = ("pass", f"import {module}")
        cases[f"{part} beyond jax"] = ("import jax", f"import {module}")
    return cases


def main() -> int:
    """Measure and print the table; with ``--check``, return 1 when a part misses the goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per import")
    parser.add_argument("--check", action="store_true", help="exit 1 when a part misses the goal")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["JAX_PLATFORMS"] = "cpu"
    cases = _cases()
    imports_jax: dict[str, bool] = {}
    for name, (setup, statement) in cases.items():  # warm the file-system cache once
        imports_jax[name] = _measure(setup, statement, env)[1]
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (setup, statement) in cases.items():
            samples[name].append(_measure(setup, statement, env)[0])
    median = {name: statistics.median(values) for name, values in samples.items()}
    jax_time = median["jax"]
    print(
        f"median of {args.runs} fresh interpreters each (python {sys.version.split()[0]}); "
        f"import jax: {jax_time * 1e3:.0f} ms; goal: each part under {GOAL:.0%} of that"
    )
    header = f"{'part':<25}{'jax?':>6}{'alone ms':>10}{'beyond jax ms':>15}{'held to':>12}"
    print(f"{header}{'vs jax':>8}  goal")
    missed: list[str] = []
    for part in PARTS:
        alone, beyond = median[f"{part} alone"], median[f"{part} beyond jax"]
        uses_jax = imports_jax[f"{part} alone"]
        held = beyond if uses_jax else alone
        ratio = held / jax_time
        if ratio >= GOAL:
            missed.append(part)
        print(
            f"{part:<25}{'yes' if uses_jax else 'no':>6}{alone * 1e3:>10.1f}{beyond * 1e3:>15.1f}"
            f"{'beyond jax' if uses_jax else 'alone':>12}{ratio:>8.1%}  "
            f"{'met' if ratio < GOAL else 'NOT met'}"
        )
    print(f"goal met by {len(PARTS) - len(missed)} of {len(PARTS)} parts", end="")
    print(f"; not by: {', '.join(missed)}" if missed else "")
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
