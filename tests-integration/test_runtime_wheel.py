"""Packaging: every part's wheel holds only its own subpackages, and substrax-runtime installs alone.

One module-scoped build of every wheel (``uv build --all-packages``) backs all assertions; the
install test creates a fresh virtual environment, installs the substrax-runtime wheel with its
declared dependencies from the package index, imports every runtime module there and shows the
heavy and optional packages (flax, orbax-checkpoint, optax, wandb, mlflow, modal) stayed out.
It takes about half a minute to a minute.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]

WHEEL_MODULES = {
    "substrax_runtime": {"runtime", "devices", "artifacts", "rng", "typing", "records", "examples"},
    "substrax_mesh": {"mesh"},
    "substrax_spmd": {"spmd", "optim"},
    "substrax_checkpoint": {"checkpoint"},
    "substrax_tracking": {"tracking", "callbacks"},
    "substrax_compute": {"compute"},
    "substrax_testing": {"testing"},
}

RUNTIME_MODULES = (
    "substrax.runtime",
    "substrax.runtime.managed_env",
    "substrax.devices",
    "substrax.artifacts",
    "substrax.rng",
    "substrax.typing",
    "substrax.records",
    "substrax.examples",
)

LEFT_OUT = ("flax", "orbax", "optax", "wandb", "mlflow", "modal")


def _uv() -> str:
    found = shutil.which("uv")
    assert found is not None, "uv must be on PATH to build and install wheels"
    return found


def _run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [_uv(), *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False, env=env
    )
    assert result.returncode == 0, f"uv {' '.join(args)} failed:\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    _run("build", "--all-packages", "--wheel", "--out-dir", str(out))
    built = {path.name.split("-")[0]: path for path in out.glob("*.whl")}
    assert set(built) == {*WHEEL_MODULES, "substrax"}, sorted(built)
    return built


def _payload(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return [
            name
            for name in archive.namelist()
            if not name.endswith("/") and not name.split("/", 1)[0].endswith(".dist-info")
        ]


@pytest.mark.parametrize("distribution", sorted(WHEEL_MODULES))
def test_each_part_wheel_holds_only_its_subpackages(
    wheels: dict[str, Path], distribution: str
) -> None:
    names = _payload(wheels[distribution])
    assert names, f"{distribution} wheel is empty"
    assert "substrax/__init__.py" not in names
    subpackages = {name.split("/")[1] for name in names if name.startswith("substrax/")}
    assert subpackages == WHEEL_MODULES[distribution]
    assert all(name.startswith("substrax/") for name in names), names
    for module in WHEEL_MODULES[distribution]:
        assert f"substrax/{module}/__init__.py" in names
        assert f"substrax/{module}/py.typed" in names


def test_meta_wheel_holds_only_the_namespace_init(wheels: dict[str, Path]) -> None:
    assert sorted(_payload(wheels["substrax"])) == ["substrax/__init__.py", "substrax/py.typed"]


PROBE = f"""
import importlib, importlib.util, json, sys
for name in {RUNTIME_MODULES!r}:
    importlib.import_module(name)
from substrax.runtime import JaxRuntime, initialize_distributed
from substrax.devices import detect_devices
from substrax.rng import rngs_from_seed
try:
    rngs_from_seed(0)
    nnx_error = None
except ImportError as error:
    nnx_error = str(error)
print(json.dumps({{
    "installed": sorted(n for n in {LEFT_OUT!r} if importlib.util.find_spec(n) is not None),
    "devices": detect_devices().count,
    "single": initialize_distributed(env={{}}).num_processes,
    "nnx_error": nnx_error,
    "file": sys.modules["substrax.runtime"].__file__,
}}))
"""


def test_runtime_installs_alone_without_training_extras(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    env = {
        k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"}
    }
    env = {k: v for k, v in env.items() if not k.startswith(("JAX_", "XLA_"))}
    _run("venv", "--python", sys.executable, str(venv), env=env)
    python = venv / "bin" / "python"
    _run("pip", "install", "--python", str(python), str(wheels["substrax_runtime"]), env=env)
    frozen = _run("pip", "freeze", "--python", str(python), env=env).lower()
    assert "substrax-runtime" in frozen
    for name in ("flax", "orbax-checkpoint", "optax", "wandb", "mlflow", "modal", "substrax-mesh"):
        assert f"\n{name}==" not in f"\n{frozen}", f"{name} was installed"
    result = subprocess.run(
        [str(python), "-c", PROBE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env | {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["installed"] == []
    assert probe["devices"] == 2
    assert probe["single"] == 1
    assert "substrax-runtime[nnx]" in probe["nnx_error"]
    assert Path(probe["file"]).is_relative_to(venv)
