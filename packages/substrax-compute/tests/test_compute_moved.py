"""substrax 0.1.22's ``substrax.compute`` module paths: still imported, each with one warning.

The seven modules are gone; one map in ``substrax.compute``'s ``__init__`` serves them through
``substrax.support.moved_modules``. Each old path runs in a fresh interpreter, since a path warns
once per process.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[3]

# What each 0.1.22 path served (its __all__): the names users may import from it.
SERVED = {
    "substrax.compute.backend": [
        "STATE_DIR_ENV",
        "BackendFactory",
        "ComputeBackend",
        "NewRun",
        "RunHandle",
        "RunState",
        "RunStore",
        "backend_state_dir",
        "default_state_dir",
        "new_run",
        "new_run_id",
        "stage_run",
    ],
    "substrax.compute.config": [
        "ComputeConfig",
        "JobConfig",
        "parse_accelerator",
        "read_compute_config",
        "require_locked_substrax",
        "resolve_job",
    ],
    "substrax.compute.local": ["LocalBackend", "LocalSettings"],
    "substrax.compute.modal_backend": ["ModalBackend", "ModalSettings"],
    "substrax.compute.registry": [
        "ENTRY_POINT_GROUP",
        "BackendFactoryError",
        "UnknownBackendError",
        "backend_names",
        "load_backend",
    ],
    "substrax.compute.skypilot_backend": ["SkyPilotBackend", "SkyPilotSettings"],
    "substrax.compute.spec": [
        "JOB_SPEC_VERSION",
        "Accelerator",
        "JobSpec",
        "Mount",
        "MountAccess",
        "Resources",
        "Task",
        "example_tasks",
        "parse_accelerator",
        "read_job_spec",
    ],
}

# Imports the old path three ways (from-import, import, importlib) and reports the warnings
# raised, where they point, and whether each name is the object its new home holds.
OLD_PATH = """
import importlib, json, sys, warnings
old, names = sys.argv[1], json.loads(sys.argv[2])
with warnings.catch_warnings(record=True) as on_package:
    warnings.simplefilter("always")
    import substrax.compute
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exec(f"from {old} import {names[0]}")
    exec(f"import {old}")
    module = importlib.import_module(old)
    del sys.modules[old]
    again = importlib.import_module(old)
private = {
    name: f"substrax.compute._{old.rpartition('.')[2]}" for name in names
    if not hasattr(substrax.compute, name)
}
homes = {name: private.get(name, "substrax.compute") for name in names}
print(json.dumps({
    "on_package": [str(w.message) for w in on_package],
    "warnings": [[w.category.__name__, str(w.message), w.filename] for w in caught],
    "all": module.__all__,
    "same": {
        name: getattr(module, name) is getattr(importlib.import_module(homes[name]), name)
        and getattr(again, name) is getattr(module, name)
        for name in names
    },
    "private": sorted(private),
}))
"""


def _run(program: str, *args: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("old", sorted(SERVED))
def test_an_old_path_imports_warns_once_and_gives_the_same_objects(old: str) -> None:
    names = SERVED[old]
    out = _run(OLD_PATH, old, json.dumps(names))
    assert out["on_package"] == []  # importing substrax.compute itself warns nothing
    ((category, message, filename),) = out["warnings"]  # once, for four imports
    assert category == "DeprecationWarning"
    assert filename == "<string>"  # the importing line, not importlib's frames
    public = sorted(set(names) - set(out["private"]))
    assert message.startswith(f"{old} is deprecated")
    assert f"`from substrax.compute import {', '.join(public)}`" in message
    for name in out["private"]:
        assert name in message.rpartition(";")[2]
    assert out["all"] == sorted(names)
    assert out["same"] == dict.fromkeys(names, True)


@pytest.mark.usefixtures("child_processes")
def test_an_entry_point_registered_at_an_old_path_still_loads() -> None:
    program = (
        "import importlib.metadata, json, warnings\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "import substrax.compute\n"
        "entry = importlib.metadata.EntryPoint("
        "'mine', 'substrax.compute.local:LocalBackend', 'substrax.compute.backends')\n"
        "print(json.dumps(entry.load() is substrax.compute.LocalBackend))\n"
    )
    assert _run(program) is True


@pytest.mark.usefixtures("child_processes")
def test_an_old_path_fails_under_warnings_as_errors_and_naming_the_fix() -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", "import substrax.compute.spec"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "from substrax.compute import" in result.stderr


OLD_IMPORT = re.compile(
    r"(from|import)\s+substrax\.compute\."
    r"(spec|backend|registry|config|local|modal_backend|skypilot_backend)\b"
)


def test_our_own_code_and_docs_use_the_new_paths() -> None:
    places = [
        *ROOT.glob("packages/*/src/**/*.py"),
        *ROOT.glob("packages/*/tests/**/*.py"),
        *ROOT.glob("packages/*/README.md"),
        *ROOT.glob("tests-integration/**/*.py"),
        *ROOT.glob("examples/**/*.py"),
        *ROOT.glob("benchmarks/**/*.py"),
        *ROOT.glob("docs/**/*.md"),
        ROOT / "README.md",
    ]
    here = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in places
        if path.resolve() != here
        for match in OLD_IMPORT.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []
