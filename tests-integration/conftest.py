"""Fixtures of the integration and release tiers: the built distributions and the demo job.

``demo_job`` runs the README's demo command (``substrax-compute run demo``, the job the
repository's pyproject declares) through the console script, the local backend and the worker,
fetching its outputs outside the working tree: in the examples' short mode for
``test_examples.py``, in full for the release tier's ``test_demo.py``.

This checkout's distributions, built once per test run for every test that installs them:

``built_packages`` is the directory ``uv build --all-packages`` wrote: each part's sdist, and each
wheel built from its sdist. Under pytest-xdist the first worker that asks builds into a directory
that every worker of the run shares, under an exclusive lock; the others wait on the lock and
reuse what it built, told so by a marker file written (atomically) once the build finished.
``SUBSTRAX_WHEELS``, when set, names a directory that already holds them (CI builds them once
before the release tier): it is checked to hold one wheel and one sdist per distribution, and
nothing is built.
"""

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


ROOT = Path(__file__).resolve().parents[1]
PREBUILT = "SUBSTRAX_WHEELS"


def _distributions() -> list[str]:
    """The workspace's distribution names, from ``packages/*/pyproject.toml``."""
    return sorted(
        tomllib.loads(pyproject.read_text())["project"]["name"]
        for pyproject in (ROOT / "packages").glob("*/pyproject.toml")
    )


def _what_is_missing(directory: Path) -> list[str]:
    """Each distribution without exactly one wheel and one sdist in ``directory``, and why."""
    missing = []
    for distribution in _distributions():
        stem = distribution.replace("-", "_")
        for kind, pattern, name_of in (
            ("wheel", "*.whl", lambda name: name.split("-")[0]),
            ("sdist", "*.tar.gz", lambda name: name.rsplit("-", 1)[0]),
        ):
            found = sorted(
                path.name for path in directory.glob(pattern) if name_of(path.name) == stem
            )
            if len(found) != 1:
                missing.append(f"{distribution}: {len(found)} {kind}s {found}")
    return missing


def _build(directory: Path) -> dict[str, object]:
    uv = shutil.which("uv")
    assert uv is not None, "uv must be on PATH to build the wheels"
    command = [uv, "build", "--all-packages", "--out-dir", str(directory)]
    env = {
        k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"}
    }
    started = time.monotonic()
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False, env=env
    )
    record: dict[str, object] = {
        "command": command[1:],
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "seconds": round(time.monotonic() - started, 1),
        "error": None,
    }
    if result.returncode != 0:
        record["error"] = f"uv {' '.join(command[1:])} failed:\n{result.stderr[-4000:]}"
    elif missing := _what_is_missing(directory):
        record["error"] = f"uv build left {directory} without: {'; '.join(missing)}"
    return record


@pytest.fixture(scope="session")
def built_packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory holding one sdist and one wheel (built from it) per distribution."""
    prebuilt = os.environ.get(PREBUILT)
    if prebuilt:
        directory = Path(prebuilt).resolve()
        if not directory.is_dir():
            pytest.fail(f"{PREBUILT}={prebuilt}: no such directory", pytrace=False)
        if missing := _what_is_missing(directory):
            pytest.fail(
                f"{PREBUILT}={prebuilt} ({directory}) must hold exactly one wheel and one sdist"
                f" per distribution (`uv build --all-packages --out-dir DIR`); it has"
                f" {'; '.join(missing)}",
                pytrace=False,
            )
        return directory
    # Every worker of one xdist run has its basetemp in the same parent; a run without xdist
    # has its own basetemp (its parent holds the other runs').
    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = shared.parent
    directory = shared / "built-packages"
    done = shared / "built-packages.json"
    with (shared / "built-packages.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed, or when its process dies
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)  # a build killed midway
            record = _build(directory)
            partial = done.with_suffix(".partial")
            partial.write_text(json.dumps(record, indent=1))
            partial.replace(done)
    record = json.loads(done.read_text())
    if record["error"] is not None:
        pytest.fail(f"building the wheels on {record['worker']}: {record['error']}", pytrace=False)
    return directory


@dataclass(frozen=True)
class DemoRun:
    """One run of the demo job: its console output, its fetched outputs and its state directory."""

    result: subprocess.CompletedProcess[str]
    fetched: Path
    state: Path

    def outputs(self, name: str) -> Path:
        """Where example ``name`` wrote, as fetched: ``<run>/examples.<name>/<name>``."""
        return self.fetched / f"examples.{name}" / name

    def summary(self, name: str) -> dict[str, Any]:
        """What example ``name``'s ``main()`` returned, from its ``summary.json``."""
        return json.loads((self.outputs(name) / "summary.json").read_text())

    def metrics(self, name: str) -> list[dict[str, Any]]:
        """Example ``name``'s file log: each record of its ``logs/<name>.metrics.jsonl``."""
        log = self.outputs(name) / "logs" / f"{name}.metrics.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()]

    def task_dir(self, name: str) -> Path:
        """The directory the worker gave example ``name`` (``AVITAI_OUTPUT_DIR``) on this machine."""
        (found,) = (p for p in self.state.rglob(f"examples.{name}") if p.parent.name == "outputs")
        return found

    def check_results(self, tasks: list[str]) -> None:
        """The run succeeded with ``tasks`` in order, and ended with one results row for each."""
        stdout = self.result.stdout
        assert f"{self.fetched.name} succeeded; outputs in {self.fetched}" in stdout
        manifest = json.loads((self.fetched / "manifest.json").read_text())
        assert [task["name"] for task in manifest["tasks"]] == tasks
        assert {task["status"] for task in manifest["tasks"]} == {"succeeded"}
        assert not (ROOT / "quick_start").exists()
        # The run ends with the results table: one row per example, each from its summary.json.
        results = stdout[stdout.index("Results (from each task's summary.json") :]
        rows = results.splitlines()[3:]
        assert [row.split()[0] for row in rows] == tasks, results
        assert "Note:" not in results


def _run_demo(base: Path, *, quick: bool, timeout: float) -> DemoRun:
    """Run the demo job into ``base`` (its state and fetched outputs), short or in full."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_", "XLA_")) and k != "SUBSTRAX_EXAMPLES_QUICK"
    }
    env["SUBSTRAX_STATE_DIR"] = str(base / "state")
    if quick:
        env["SUBSTRAX_EXAMPLES_QUICK"] = "1"  # the examples' short mode
    script = Path(sys.executable).parent / "substrax-compute"
    result = subprocess.run(
        [str(script), "run", "demo", "--into", str(base / "fetched")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (fetched,) = (base / "fetched").iterdir()
    return DemoRun(result=result, fetched=fetched, state=base / "state")


@pytest.fixture(scope="session")
def demo_job() -> Callable[..., DemoRun]:
    """``demo_job(base, quick=..., timeout=...)``: run the demo job into ``base``; a ``DemoRun``."""
    return _run_demo
