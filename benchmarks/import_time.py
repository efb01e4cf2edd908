"""Import time of ``substrax.runtime`` and ``substrax`` against ``import jax``, in one run.

Each import runs in a fresh interpreter several times (alternating, so drift hits all alike);
the table shows the median of the import itself (measured inside the child with
``time.perf_counter``, so interpreter start-up is left out) and its ratio to jax's.
Goal: both substrax imports under 5% of jax's import time (neither imports jax).

Usage: ``uv run python benchmarks/import_time.py [--runs 7]``
"""

import argparse
import os
import statistics
import subprocess
import sys


# name: (setup run before the clock starts, statement timed)
STATEMENTS = {
    "import jax": ("pass", "import jax"),
    "import substrax.runtime": ("pass", "import substrax.runtime"),
    "import substrax": ("pass", "import substrax"),
    # The runtime part's own modules, with the namespace package already imported.
    "  runtime's own modules": ("import substrax", "import substrax.runtime"),
}

CHILD = """
import sys, time
exec(sys.argv[1])
start = time.perf_counter()
exec(sys.argv[2])
elapsed = time.perf_counter() - start
assert {check} or "jax" not in sys.modules, "imported jax"
print(elapsed)
"""


def _measure(setup: str, statement: str, env: dict[str, str]) -> float:
    check = "True" if statement == "import jax" else "False"
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(check=check), setup, statement],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["JAX_PLATFORMS"] = "cpu"
    for setup, statement in STATEMENTS.values():  # warm the file-system cache once
        _measure(setup, statement, env)
    samples: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    for _ in range(args.runs):
        for name, (setup, statement) in STATEMENTS.items():
            samples[name].append(_measure(setup, statement, env))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    jax_time = medians["import jax"]
    print(f"median of {args.runs} fresh interpreters each (python {sys.version.split()[0]})")
    print(f"{'import':<26}{'median ms':>12}{'min ms':>10}{'vs jax':>10}")
    for name, values in samples.items():
        ratio = medians[name] / jax_time
        print(f"{name:<26}{medians[name] * 1e3:>12.1f}{min(values) * 1e3:>10.1f}{ratio:>9.1%}")
    worst = max(medians["import substrax.runtime"], medians["import substrax"]) / jax_time
    print(f"goal: under 5% of jax's import time -> {'met' if worst < 0.05 else 'NOT met'}")


if __name__ == "__main__":
    main()
