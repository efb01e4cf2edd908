"""Fixtures shared by the compute tests (test modules cannot import each other by name)."""

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from substrax.compute._processes import is_alive


SPAWNS_A_CHILD = (
    "import subprocess, sys, time; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print('child', p.pid, flush=True); print('sleeping now', flush=True); time.sleep(600)"
)


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether process ``pid`` has ended (or is a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid, ""):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def spawns_a_child() -> str:
    """Python code that starts a sleeping child, prints ``child <pid>`` then ``sleeping now``."""
    return SPAWNS_A_CHILD


@pytest.fixture
def gone() -> Callable[..., bool]:
    """``gone(pid, timeout=10.0)``: whether process ``pid`` has ended (or is a zombie) in time."""
    return _gone


def _write_files(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.fixture
def write_files() -> Callable[[Path, Mapping[str, str]], None]:
    """``write_files(root, {relative path: text})``: write each file, creating its directories."""
    return _write_files


_LOCAL_PROJECT = """\
[project]
name = "p"
version = "0"

[tool.substrax.compute]
backend = "local"

[tool.substrax.compute.backends.local]
state_dir = "{state}"

"""


@pytest.fixture
def local_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str, Mapping[str, str]], Path]:
    """``local_project(jobs_toml, files)``: a project run on the local backend, as the cwd.

    Its pyproject.toml holds the local backend (its state under ``tmp_path``) and the
    ``[tool.substrax.compute.jobs.*]`` tables given; ``files`` are written beside it, and
    ``SUBSTRAX_STATE_DIR`` points into ``tmp_path``. Returns the project's root.
    """

    def make(jobs: str, files: Mapping[str, str]) -> Path:
        root = tmp_path / "project"
        root.mkdir()
        header = _LOCAL_PROJECT.format(state=tmp_path / "local-state")
        _write_files(root, {"pyproject.toml": header + jobs, **files})
        monkeypatch.setenv("SUBSTRAX_STATE_DIR", str(tmp_path / "state"))
        monkeypatch.chdir(root)
        return root

    return make
