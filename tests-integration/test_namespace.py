"""The ``substrax`` namespace: one ``__init__`` (the meta-package's), every part reachable lazily."""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

import substrax


ROOT = Path(__file__).resolve().parents[1]
PARTS = {
    "substrax-runtime": (
        "runtime",
        "devices",
        "artifacts",
        "rng",
        "typing",
        "records",
        "examples",
        "support",
    ),
    "substrax-mesh": ("mesh", "nnx_typing"),
    "substrax-spmd": ("spmd", "optim"),
    "substrax-checkpoint": ("checkpoint",),
    "substrax-tracking": ("tracking", "callbacks"),
    "substrax-compute": ("compute",),
    "substrax-testing": ("testing",),
}


def test_only_the_meta_package_owns_the_namespace_init() -> None:
    inits = sorted(p.relative_to(ROOT) for p in ROOT.glob("packages/*/src/substrax/__init__.py"))
    assert inits == [Path("packages/substrax/src/substrax/__init__.py")]


def test_every_part_lives_in_its_own_distribution() -> None:
    for distribution, modules in PARTS.items():
        src = ROOT / "packages" / distribution / "src" / "substrax"
        assert sorted(p.name for p in src.iterdir() if p.is_dir()) == sorted(modules)


def test_version_is_the_meta_packages() -> None:
    assert substrax.__version__ == importlib.metadata.version("substrax")


def test_parts_are_reached_as_attributes() -> None:
    assert substrax.records.__name__ == "substrax.records"
    assert substrax.runtime.__name__ == "substrax.runtime"
    assert "mesh" in dir(substrax)
    # a review: the modules the namespace's own code imports were public names of substrax
    assert not {"os", "sys", "ModuleType", "import_module"} & set(dir(substrax))
    assert not hasattr(substrax, "os")


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="not_a_part"):
        substrax.not_a_part  # noqa: B018 - the access is the test


def test_importing_substrax_imports_no_jax() -> None:
    program = (
        "import json, sys, substrax; substrax.__version__; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {'jax', 'flax'})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(result.stdout) == []
