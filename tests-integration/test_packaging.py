"""Packaging, from built wheels rather than the editable workspace.

The run's one ``uv build --all-packages`` (each sdist, then each wheel built from its sdist; the
``built_packages`` fixture of tests-integration/conftest.py, or ``SUBSTRAX_WHEELS``) backs every
assertion: each part's wheel holds only its own subpackages; each part installed alone into a
fresh virtual environment imports every one of its modules and pulled only its own dependencies;
the meta-package installs every part and ``import substrax`` reaches them lazily; every extra
resolves. Sibling parts come from the built wheels (``--find-links``), third-party
packages from the package index, installed from uv's cache.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest


# These tests stay on one xdist worker; the build they share is shared by every worker.
pytestmark = pytest.mark.xdist_group("wheels")
ROOT = Path(__file__).resolve().parents[1]

WHEEL_MODULES = {
    "substrax_runtime": {
        "runtime",
        "devices",
        "artifacts",
        "rng",
        "typing",
        "records",
        "examples",
        "support",
    },
    "substrax_mesh": {"mesh", "nnx_typing"},
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
    "substrax.support",
)

OPTIONAL_SDKS = ("wandb", "mlflow", "modal", "sky", "tensorboardX", "tensorboard")
TRAINING = ("flax", "orbax", "optax")

# distribution -> (modules whose every submodule must import, import names that must be absent)
INSTALLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "substrax-runtime": (RUNTIME_MODULES, (*TRAINING, *OPTIONAL_SDKS)),
    # flax itself requires orbax-checkpoint and optax, so the flax-based parts bring them along.
    "substrax-mesh": (("substrax.mesh", "substrax.nnx_typing"), OPTIONAL_SDKS),
    "substrax-spmd": (("substrax.spmd", "substrax.optim"), OPTIONAL_SDKS),
    "substrax-checkpoint": (("substrax.checkpoint",), ("flax", "optax", *OPTIONAL_SDKS)),
    "substrax-tracking": (("substrax.tracking", "substrax.callbacks"), (*TRAINING, *OPTIONAL_SDKS)),
    "substrax-compute": (("substrax.compute",), (*TRAINING, *OPTIONAL_SDKS)),
    "substrax-testing": (("substrax.testing",), (*TRAINING, *OPTIONAL_SDKS)),
    "substrax": (("substrax",), OPTIONAL_SDKS),
}
# Modules that need an extra of their own distribution, so a bare install does not import them.
NEEDS_EXTRA = {"substrax.testing.compute": "substrax-testing[compute]"}
EXTRAS = ("wandb", "mlflow", "tensorboard", "modal", "skypilot", "testing", "cuda12", "metal")


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
def wheels(built_packages: Path) -> dict[str, Path]:
    built = {path.name.split("-")[0]: path for path in built_packages.glob("*.whl")}
    assert set(built) == {*WHEEL_MODULES, "substrax"}, sorted(built)
    sdists = {path.name.rsplit("-", 1)[0] for path in built_packages.glob("*.tar.gz")}
    assert sdists == set(built), sorted(sdists)
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
        assert f"substrax/{module}/__init__.pyi" in names  # the one list of its exports
        assert f"substrax/{module}/py.typed" in names


def test_meta_wheel_holds_only_the_namespace_init(wheels: dict[str, Path]) -> None:
    assert sorted(_payload(wheels["substrax"])) == ["substrax/__init__.py", "substrax/py.typed"]


PROBE = """
import importlib, importlib.util, json, pkgutil, sys
roots, absent, skip = json.loads(sys.argv[1])
imported = []
for root in roots:
    module = importlib.import_module(root)
    imported.append(root)
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), root + "."):
        if info.name in skip or info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        importlib.import_module(info.name)
        imported.append(info.name)
print(json.dumps({
    "imported": imported,
    "present": sorted(n for n in absent if importlib.util.find_spec(n) is not None),
    "file": sys.modules[roots[0]].__file__,
}))
"""


def _clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"} and not k.startswith(("JAX_", "XLA_"))
    }


def _installed(python: Path) -> set[str]:
    frozen = _run("pip", "freeze", "--python", str(python), env=_clean_env())
    return {line.split("==")[0].split(" @ ")[0].strip().lower() for line in frozen.splitlines()}


def _install_alone(distribution: str, wheels: dict[str, Path], venv: Path) -> Path:
    env = _clean_env()
    _run("venv", "--python", sys.executable, str(venv), env=env)
    python = venv / "bin" / "python"
    wheel = wheels[distribution.replace("-", "_")]
    links = str(wheel.parent)
    # without the workspace's compile-bytecode: compiling jax costs more than the one or two
    # interpreters each of these environments starts would save
    _run(
        "pip",
        "install",
        "--no-compile-bytecode",
        "--python",
        str(python),
        "--find-links",
        links,
        str(wheel),
        env=env,
    )
    return python


def _probe(
    python: Path, code: str, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``code`` on the CPU in ``python``; the JSON object its last stdout line prints."""
    result = subprocess.run(
        [str(python), "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=_clean_env() | {"JAX_PLATFORMS": "cpu"} | (env or {}),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("distribution", sorted(INSTALLS))
def test_part_installs_alone_and_imports_every_module(
    wheels: dict[str, Path], tmp_path: Path, distribution: str
) -> None:
    roots, absent = INSTALLS[distribution]
    python = _install_alone(distribution, wheels, tmp_path / "venv")
    assert distribution in _installed(python)
    probe = _probe(python, PROBE, json.dumps([roots, absent, sorted(NEEDS_EXTRA)]), cwd=tmp_path)
    assert probe["present"] == [], f"{distribution} pulled {probe['present']}"
    assert Path(probe["file"]).is_relative_to(tmp_path / "venv")
    assert len(probe["imported"]) > len(roots) or distribution == "substrax"


RUNTIME_PROBE = """
import json
from substrax.devices import detect_devices
from substrax.runtime import initialize_distributed
from substrax.rng import rngs_from_seed
try:
    rngs_from_seed(0)
    nnx_error = None
except ImportError as error:
    nnx_error = str(error)
print(json.dumps({
    "devices": detect_devices().count,
    "single": initialize_distributed(env={}).num_processes,
    "nnx_error": nnx_error,
}))
"""


def test_runtime_alone_works_and_names_the_nnx_extra(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    python = _install_alone("substrax-runtime", wheels, tmp_path / "venv")
    probe = _probe(python, RUNTIME_PROBE, cwd=tmp_path, env={"JAX_NUM_CPU_DEVICES": "2"})
    assert probe["devices"] == 2
    assert probe["single"] == 1
    assert "substrax-runtime[nnx]" in probe["nnx_error"]


LAZY_PROBE = """
import json, sys
import substrax
before = sorted(m for m in sys.modules if m.split(".")[0] in {"jax", "flax"})
parts = {name: getattr(substrax, name).__name__ for name in ("runtime", "mesh", "spmd", "optim",
         "checkpoint", "tracking", "callbacks", "compute")}
print(json.dumps({"before": before, "parts": parts, "version": substrax.__version__}))
"""


def test_meta_package_reaches_every_part_lazily(wheels: dict[str, Path], tmp_path: Path) -> None:
    python = _install_alone("substrax", wheels, tmp_path / "venv")
    installed = _installed(python)
    for distribution in set(INSTALLS) - {"substrax-testing"}:  # testing is the meta's extra
        assert distribution in installed, f"{distribution} missing from the meta install"
    assert "substrax-testing" not in installed
    probe = _probe(python, LAZY_PROBE, cwd=tmp_path)
    assert probe["before"] == []
    assert probe["parts"] == {name: f"substrax.{name}" for name in probe["parts"]}
    assert probe["version"] == "0.2.0"


@pytest.mark.parametrize("extra", EXTRAS)
def test_extra_resolves(wheels: dict[str, Path], tmp_path: Path, extra: str) -> None:
    platform = "aarch64-apple-darwin" if extra == "metal" else "x86_64-manylinux_2_28"
    requirement = tmp_path / "requirements.in"
    requirement.write_text(f"substrax[{extra}]==0.2.0\n")
    output = _run(
        "pip",
        "compile",
        str(requirement),
        "--python-version",
        "3.12",
        "--python-platform",
        platform,
        "--find-links",
        str(wheels["substrax"].parent),
        "--no-header",
        env=_clean_env(),
    )
    expected = {
        "wandb": "wandb==",
        "mlflow": "mlflow==",
        "tensorboard": "tensorboardx==",
        "modal": "modal==",
        "skypilot": "skypilot==",
        "testing": "substrax-testing==",
        "cuda12": "jax-cuda12-plugin==",
        "metal": "jax-metal==",
    }[extra]
    assert expected in output.lower(), output
