"""Run every benchmark in this directory and write their results as one Markdown page.

    uv run python benchmarks/run_all.py [--quick] [--timeout SECONDS] [--only NAME ...]

Each ``benchmarks/*.py`` (except this file and ``_``-prefixed helpers) runs in its own
interpreter from the repository root, with a timeout, and without the caller's ``JAX_*`` and
``XLA_*`` variables: every benchmark chooses its own JAX settings. What each prints is
collected. A benchmark that fails, times out, or is expected but missing is recorded as such;
the others still run. The page starts with one summary table (benchmark, what it measures,
status, seconds) and the machine it ran on, followed by each benchmark's own tables. It is
written to ``docs/snippets/benchmarks-results.md`` (the docs' benchmarks page includes it) and
printed. The exit status is 1 when any benchmark did not succeed.

``--quick`` passes each known benchmark its own smaller-run arguments (fewer repeats, a
smaller state); the page says so.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path


HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUTPUT = ROOT / "docs" / "snippets" / "benchmarks-results.md"

# The benchmarks the project keeps; one that is not there is reported as missing.
EXPECTED = (
    "import_time",
    "compute_overhead",
    "train_step",
    "placement",
    "checkpoint",
    "tracking",
    "loop_overhead",
    "compile_cache",
    "accelerator",
)
# Smaller runs for --quick, per benchmark (a benchmark not listed runs with no arguments).
QUICK_ARGS: dict[str, tuple[str, ...]] = {
    "import_time": ("--runs", "3"),
    "compute_overhead": ("--repeats", "3"),
    "checkpoint": ("--mb", "64", "--steps", "200"),
    "tracking": ("--quick",),
    "loop_overhead": ("--quick",),
    "compile_cache": ("--quick",),
    "accelerator": ("--quick",),
}
VERSIONS = ("jax", "jaxlib", "flax", "orbax-checkpoint", "optax", "mlflow", "wandb")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How one benchmark ended and what it printed."""

    name: str
    args: tuple[str, ...] = ()
    summary: str
    status: str  # "ok", "failed (exit N)", "timed out after S s", "missing"
    seconds: float | None
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """Whether the benchmark ran to the end with exit status 0."""
        return self.status == "ok"


def discover(directory: Path = HERE) -> list[Path]:
    """The benchmark scripts of ``directory``: ``*.py`` but this runner and private helpers."""
    return sorted(
        path
        for path in directory.glob("*.py")
        if path.name != Path(__file__).name and not path.name.startswith("_")
    )


def first_line(path: Path) -> str:
    """The first line of a script's module docstring (read without importing it)."""
    try:
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (SyntaxError, UnicodeDecodeError):
        return ""
    return (docstring or "").strip().splitlines()[0] if docstring else ""


def child_env() -> dict[str, str]:
    """This environment without JAX and XLA settings, unbuffered, with a quiet W&B."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("WANDB_SILENT", "true")
    return env


def run_one(path: Path, *, args: tuple[str, ...], timeout: float) -> Outcome:
    """Run one benchmark script in its own process group, killed (with its children) on timeout."""
    name = path.stem
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, str(path), *args],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        status = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        status = f"timed out after {timeout:.0f} s"
    return Outcome(
        name=name,
        args=args,
        summary=first_line(path),
        status=status,
        seconds=time.perf_counter() - start,
        stdout=stdout,
        stderr=stderr,
    )


def missing(name: str) -> Outcome:
    """The record of an expected benchmark that has no script."""
    return Outcome(name=name, summary="", status="missing", seconds=None, stdout="", stderr="")


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> str:
    """One line about where the numbers come from."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    versions = ", ".join(f"{name} {_version(name)}" for name in VERSIONS)
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}, load average before the run {load}; {versions}"
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def render(outcomes: list[Outcome], *, quick: bool, started: dt.datetime) -> str:
    """The results page: the summary table, the machine, then each benchmark's output."""
    command = "uv run python benchmarks/run_all.py" + (" --quick" if quick else "")
    lines = [
        f"Measured {started:%Y-%m-%d %H:%M} UTC with `{command}`"
        + (" (smaller runs: `--quick`)" if quick else "")
        + ".",
        "",
        f"Machine: {machine()}.",
        "",
        "| benchmark | what it measures | status | seconds |",
        "| --- | --- | --- | ---: |",
    ]
    for outcome in outcomes:
        seconds = "" if outcome.seconds is None else f"{outcome.seconds:.1f}"
        lines.append(
            f"| [`{outcome.name}`](#{outcome.name}) | {_cell(outcome.summary)} "
            f"| {outcome.status} | {seconds} |"
        )
    for outcome in outcomes:
        lines += ["", f"### {outcome.name}", ""]
        if outcome.status == "missing":
            lines.append(f"`benchmarks/{outcome.name}.py` does not exist yet.")
            continue
        command = " ".join(("uv run python", f"benchmarks/{outcome.name}.py", *outcome.args))
        lines.append(f"`{command}`: {outcome.status}.")
        if outcome.stdout.strip():
            lines += ["", "```text", outcome.stdout.rstrip(), "```"]
        if not outcome.ok and outcome.stderr.strip():
            lines += [
                "",
                "The last lines of its stderr:",
                "",
                "```text",
                _tail(outcome.stderr),
                "```",
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks, write the page, print it; 1 if any benchmark did not succeed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark")
    parser.add_argument("--quick", action="store_true", help="smaller runs of each benchmark")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the Markdown file")
    args = parser.parse_args(argv)

    scripts = {path.stem: path for path in discover()}
    names = list(dict.fromkeys([*EXPECTED, *scripts]))
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            parser.error(f"unknown benchmark(s) {unknown}; choose from {names}")
        names = [name for name in names if name in args.only]

    started = dt.datetime.now(dt.UTC)
    outcomes: list[Outcome] = []
    for name in names:
        if name not in scripts:
            outcomes.append(missing(name))
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        extra = QUICK_ARGS.get(name, ()) if args.quick else ()
        outcome = run_one(scripts[name], args=extra, timeout=args.timeout)
        print(f"  {outcome.status} in {outcome.seconds:.1f} s", file=sys.stderr, flush=True)
        outcomes.append(outcome)

    page = render(outcomes, quick=args.quick, started=started)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(page, encoding="utf-8")
    print(page)
    print(f"written to {args.output}", file=sys.stderr)
    return 0 if all(outcome.ok for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
