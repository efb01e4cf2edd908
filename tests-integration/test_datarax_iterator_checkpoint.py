"""datarax 0.1.17's own ``IteratorCheckpoint`` saves and restores a data iterator's state.

datarax keeps an iterator's state (positions, a NumPy int64 order, seeds) as the
``data_iterator`` item of our ``OrbaxCheckpointStore`` and restores it without templates. Its
published release is installed on top of this checkout's packages in a virtual environment of
its own rather than in the workspace: datarax pins ``protobuf<6`` (the workspace lock holds
protobuf 7 for the tracking SDKs) and pulls grain and array-record, which nothing else here
needs. The environment gets substrax-runtime[nnx] and substrax-checkpoint from this checkout,
every third-party package at the version the workspace lock pins, datarax without its
dependencies, and only the modules ``import datarax.checkpoint`` imports beyond those, pinned.
Everything comes from PyPI through uv's cache.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


pytestmark = [pytest.mark.xdist_group("datarax"), pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[1]
DATARAX = "datarax==0.1.17"
# What `import datarax.checkpoint` imports beyond substrax's own dependencies (datarax's
# __init__ loads its pipeline modules), and what those pull in, at the versions seen working.
DATARAX_IMPORTS = (
    "grain==0.2.18",
    "array-record==0.8.6",
    "cloudpickle==3.1.3",
    "jaxtyping==0.3.11",
    "wadler-lindig==0.1.8",
    "tomli-w==1.2.0",
)
# How uv reports that the package index cannot be reached (then the test cannot run here).
_OFFLINE = ("dns error", "failed to fetch", "error sending request", "network is unreachable")


def _clean_env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"}
        and not key.startswith(("JAX_", "XLA_"))
    }


def _uv(*args: str) -> str:
    uv = shutil.which("uv")
    assert uv is not None, "uv must be on PATH to build datarax's environment"
    result = subprocess.run(
        [uv, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=_clean_env(),
    )
    if result.returncode != 0 and any(sign in result.stderr.lower() for sign in _OFFLINE):
        pytest.skip(
            f"PyPI is unreachable, so {DATARAX} cannot be installed: {result.stderr[-500:]}"
        )
    assert result.returncode == 0, f"uv {' '.join(args)} failed:\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def datarax_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment: this checkout's packages, the lock's pins, datarax 0.1.17."""
    where = tmp_path_factory.mktemp("datarax")
    constraints = where / "constraints.txt"
    constraints.write_text(
        _uv(
            "export",
            "--frozen",
            "--no-hashes",
            "--no-header",
            "--no-annotate",
            "--no-dev",
            "--no-emit-workspace",
            "--package",
            "substrax",
        )
    )
    venv = where / "venv"
    _uv("venv", "--python", sys.executable, str(venv))
    python = venv / "bin" / "python"
    _uv(
        "pip",
        "install",
        "--python",
        str(python),
        "--no-sources",  # this checkout's parts as built wheels, not editable workspace links
        "--constraint",
        str(constraints),
        f"{ROOT / 'packages' / 'substrax-runtime'}[nnx]",
        str(ROOT / "packages" / "substrax-checkpoint"),
        *DATARAX_IMPORTS,
    )
    _uv("pip", "install", "--python", str(python), "--no-deps", DATARAX)
    return python


PROBE = """
import json, sys
from pathlib import Path
import jax
import numpy as np
import datarax
import substrax.checkpoint
from datarax.checkpoint import IteratorCheckpoint

class Iterator:
    def __init__(self, state):
        self.state = state
    def get_state(self):
        return dict(self.state)
    def set_state(self, state):
        self.state = dict(state)

def saved_state():
    return {
        "sampler_repr": "SequentialSampler(num_records=6)",
        "epoch": 2,
        "position": 2**40 + 3,
        "order": np.arange(6, dtype=np.int64) * 2**33 + 1,
        "seed": np.uint64(2**64 - 1),
        "rng_state": np.array([2**32 - 1, 7], np.uint32),
        "weights": np.array([0.1, 1e300], np.float64),
        "done": np.array([True, False]),
    }

def describe(state):
    return {
        key: [type(value).__name__, str(getattr(value, "dtype", "")), repr(np.asarray(value).tolist())]
        for key, value in sorted(state.items())
    }

mode, root = sys.argv[1], Path(sys.argv[2])
if mode == "save":
    with IteratorCheckpoint(root, max_to_keep=2) as checkpoint:
        checkpoint.save(Iterator(saved_state()), 5, epoch=2)
with IteratorCheckpoint(root, max_to_keep=2) as checkpoint:
    fresh = Iterator({"sampler_repr": "SequentialSampler(num_records=6)"})
    checkpoint.restore(fresh)
print(json.dumps({
    "restored": describe(fresh.state),
    "saved": describe(saved_state()),
    "x64": bool(jax.config.jax_enable_x64),
    "datarax": datarax.__version__,
    "substrax": substrax.checkpoint.__file__,
}))
"""


def _probe(python: Path, mode: str, root: Path, cwd: Path, *, x64: bool) -> dict[str, Any]:
    env = _clean_env() | {"JAX_PLATFORMS": "cpu", "JAX_ENABLE_X64": "1" if x64 else "0"}
    result = subprocess.run(
        [str(python), "-c", PROBE, mode, str(root)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _assert_restored_as_saved(report: dict[str, Any], python: Path) -> None:
    assert report["datarax"] == "0.1.17"
    assert Path(report["substrax"]).is_relative_to(python.parents[1])
    assert report["restored"] == report["saved"]
    restored = report["restored"]
    assert restored["order"][:2] == ["ndarray", "int64"]
    assert restored["seed"][:2] == ["uint64", "uint64"]
    assert restored["position"] == ["int", "", repr(2**40 + 3)]


def test_iterator_state_with_int64_array_restores_exactly(datarax_python: Path, tmp_path: Path):
    report = _probe(datarax_python, "save", tmp_path / "pipeline", tmp_path, x64=False)
    assert report["x64"] is False
    _assert_restored_as_saved(report, datarax_python)


def test_state_saved_with_x64_off_restores_with_x64_on(datarax_python: Path, tmp_path: Path):
    root = tmp_path / "pipeline"
    _probe(datarax_python, "save", root, tmp_path, x64=False)
    report = _probe(datarax_python, "restore", root, tmp_path, x64=True)
    assert report["x64"] is True
    _assert_restored_as_saved(report, datarax_python)
