"""What a job of one trivial task costs on the ``local`` backend, against running that task directly.

Measured in one run, median of several repeats:

- direct: ``python -c pass`` as a subprocess, the plain alternative;
- local job: ``LocalBackend.submit`` until ``status`` is final (the detached worker, its
  manifest and logs), without and with the device probe (which imports jax in a child);
- CLI: ``substrax-compute run JOB`` in a subprocess (submit, follow, fetch, report).

Goal: under 1.5 s of overhead for the local job.

Usage: ``uv run python benchmarks/compute_overhead.py [--repeats N]``
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from substrax.compute import JobSpec, LocalBackend, RunState, Task


TRIVIAL = ("python", "-c", "pass")


def _direct() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def _job(backend: LocalBackend, project: Path, *, probe: bool) -> float:
    spec = JobSpec(
        name="overhead",
        tasks=(Task(name="trivial", argv=TRIVIAL, timeout_seconds=120),),
        timeout_seconds=120,
        runtime={"platforms": ["cpu"]},
        probe_devices=probe,
    )
    start = time.perf_counter()
    handle = backend.submit(spec, project=project)
    state = backend.status(handle)
    while not state.is_final:
        time.sleep(0.01)
        state = backend.status(handle)
    seconds = time.perf_counter() - start
    if state is not RunState.SUCCEEDED:
        raise RuntimeError(f"the benchmark job ended {state}")
    return seconds


def _cli(project: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "substrax.compute.cli",
            "run",
            "overhead",
            "--project",
            str(project),
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "pyproject.toml").write_text(
            "[tool.substrax.compute.jobs.overhead]\n"
            'commands = { trivial = ["python", "-c", "pass"] }\n'
            "timeout_seconds = 120\nprobe_devices = false\n"
        )
        backend = LocalBackend({"state_dir": str(root / "state")})
        env = {**os.environ, "SUBSTRAX_STATE_DIR": str(root / "cli-state")}
        runs = {
            "direct (python -c pass)": _direct,
            "local job, no probe": lambda: _job(backend, project, probe=False),
            "local job, device probe": lambda: _job(backend, project, probe=True),
            "substrax-compute run (CLI)": lambda: _cli(project, env),
        }
        for run in runs.values():  # warm the file cache and the interpreter's imports once
            run()
        medians = {
            name: statistics.median(run() for _ in range(args.repeats))
            for name, run in runs.items()
        }
    direct = medians["direct (python -c pass)"]
    print(f"median of {args.repeats} runs; goal: local job overhead < 1.5 s")
    print(f"{'what':<30}{'seconds':>10}{'overhead s':>13}{'ratio':>8}")
    for name, seconds in medians.items():
        print(f"{name:<30}{seconds:>10.3f}{seconds - direct:>13.3f}{seconds / direct:>8.1f}")


if __name__ == "__main__":
    main()
