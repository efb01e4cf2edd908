"""This checkout's distributions, built once per test run for every test that installs them.

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
import time
import tomllib
from pathlib import Path

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
