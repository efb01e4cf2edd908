"""The repository's own checks run as tests, so the README's one test command covers them.

ruff (lint and format), pyright strict over every part's ``src`` (through scripts/typecheck.py), the import-linter layer
contracts, the lock file's agreement with the pyprojects, and the xdist grouping the suite relies on.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is not installed in {BIN}: run `uv sync`"
    return str(path)


def _uv() -> list[str]:
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


@pytest.mark.xdist_group("tooling")
def test_ruff_lint_is_clean() -> None:
    result = _run(_tool("ruff"), "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.xdist_group("tooling")
def test_ruff_format_is_clean() -> None:
    result = _run(_tool("ruff"), "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.xdist_group("tooling")
def test_pyright_strict_passes_on_every_part() -> None:
    result = _run(sys.executable, "scripts/typecheck.py", timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr


@pytest.mark.xdist_group("tooling")
def test_import_layers_hold() -> None:
    result = _run(sys.executable, "scripts/lint_imports.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.xdist_group("tooling")
def test_lock_matches_the_pyprojects() -> None:
    env = {**os.environ, "UV_OFFLINE": "1"}
    result = subprocess.run(
        [*_uv(), "lock", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr


GROUPED = """
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("costly")


@pytest.fixture(scope="module")
def costly() -> None:
    with Path("setups.txt").open("a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("n", range(6))
def test_grouped(n: int, costly: None) -> None:
    pass
"""


def test_xdist_groups_keep_a_costly_fixture_on_one_worker(pytester: pytest.Pytester) -> None:
    # The suite's addopts distribute by xdist_group: the MLflow server, the demo job's run and the
    # wheel builds are each made once. A pytest or pytest-xdist release that breaks the grouping
    # (pytest-xdist#1386) makes each worker make them again; this fails first.
    pytester.makepyfile(test_grouped=GROUPED)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=6)
    assert len((pytester.path / "setups.txt").read_text().split()) == 1
