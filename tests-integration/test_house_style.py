"""One house style across the parts: every CLI's bad input, every public error's home, every raise.

The conventions are written down in CONTRIBUTING.md; these tests hold every part to them.
"""

import ast
import builtins
import importlib
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(ROOT.glob("packages/*/src/substrax"))
PUBLIC_PACKAGES = [
    "substrax.runtime",
    "substrax.devices",
    "substrax.artifacts",
    "substrax.rng",
    "substrax.typing",
    "substrax.records",
    "substrax.examples",
    "substrax.support",
    "substrax.mesh",
    "substrax.spmd",
    "substrax.optim",
    "substrax.checkpoint",
    "substrax.tracking",
    "substrax.callbacks",
    "substrax.compute",
    "substrax.testing",
]
# Builtins that name the mistake precisely enough to raise as they are: a bad argument's type or
# value, an abstract method, a missing attribute of a module's lazy ``__getattr__``; and the
# process's own exit; a test contract's failed check.
ARGUMENT_ERRORS = {
    "ValueError",
    "TypeError",
    "NotImplementedError",
    "AttributeError",
    "SystemExit",
    "AssertionError",  # a failed check of substrax.testing's contracts, as pytest reports it
}


def _cli(*args: str) -> list[str]:
    return [sys.executable, *args]


# Every command-line entry, with bad input each: (argv, the prog its error line starts with).
CASES = [
    (_cli("-m", "substrax.checkpoint", "ls", "/no/such/store"), "python -m substrax.checkpoint"),
    (_cli("-m", "substrax.checkpoint", "show", ".", "not-a-step"), "python -m substrax.checkpoint"),
    (_cli("-m", "substrax.checkpoint", "--no-such-flag"), "python -m substrax.checkpoint"),
    (
        _cli("-m", "substrax.tracking", "replay", "/no/such/spool.jsonl"),
        "python -m substrax.tracking",
    ),
    (_cli("-m", "substrax.tracking", "--no-such-flag"), "python -m substrax.tracking"),
    (
        [str(Path(sys.executable).parent / "substrax-compute"), "run", "no-such-job"],
        "substrax-compute",
    ),
    ([str(Path(sys.executable).parent / "substrax-compute"), "--no-such-flag"], "substrax-compute"),
    (
        [str(Path(sys.executable).parent / "substrax-compute"), "logs", "no-such-job-id"],
        "substrax-compute",
    ),
    (
        _cli("-m", "substrax.runtime.managed_env", "--no-such-flag"),
        "python -m substrax.runtime.managed_env",
    ),
]


@pytest.mark.parametrize(("argv", "prog"), CASES, ids=[" ".join(c[0][1:]) for c in CASES])
def test_every_cli_refuses_bad_input_with_exit_2_and_one_error_line(
    argv: list[str], prog: str, tmp_path: Path
) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\n')
    environment = {**os.environ, "SUBSTRAX_COMPUTE_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run(
        argv,
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    # argparse names a subcommand after the prog: "python -m substrax.checkpoint show: error: "
    line = re.compile(rf"{re.escape(prog)}( [a-z-]+)?: error: \S")
    assert any(line.match(text) for text in result.stderr.splitlines()), result.stderr


def _public_errors() -> list[tuple[str, type[BaseException]]]:
    found: list[tuple[str, type[BaseException]]] = []
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", []):
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.append((package, value))
    return found


def test_every_public_error_shows_the_module_users_import_it_from() -> None:
    errors = _public_errors()
    assert len(errors) > 30  # every part exports its errors
    wrong = {
        f"{package}.{error.__name__}": error.__module__
        for package, error in errors
        if error.__module__ != package
        and getattr(importlib.import_module(error.__module__), error.__name__, None) is not error
    }
    assert wrong == {}


def _raised_builtins(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if (
            isinstance(raised, ast.Name)
            and isinstance(getattr(builtins, raised.id, None), type)
            and issubclass(getattr(builtins, raised.id), BaseException)
            and raised.id not in ARGUMENT_ERRORS
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {raised.id}")
    return found


def test_every_raise_beyond_a_bad_argument_uses_a_substrax_error() -> None:
    raised = [
        hit for source in SOURCES for path in source.rglob("*.py") for hit in _raised_builtins(path)
    ]
    assert raised == []


# Module paths that are an interface: entry points, ``python -m`` targets, the pytest plugin, and
# the import paths substrax 0.1.22 documented (../shared/reference).
INTERFACE_MODULES = {
    "substrax.testing.compute",
    "substrax.checkpoint.__main__",
    "substrax.tracking.__main__",
    "substrax.runtime.managed_env",
    "substrax.compute.cli",
    "substrax.compute.worker",
    "substrax.compute.spec",
    "substrax.compute.backend",
    "substrax.compute.registry",
    "substrax.compute.config",
    "substrax.compute.local",
    "substrax.compute.modal_backend",
    "substrax.compute.skypilot_backend",
    "substrax.testing.pytest_plugin",
    "substrax.testing.compiles",
}


def _public_modules() -> set[str]:
    found: set[str] = set()
    for source in SOURCES:
        for path in source.rglob("*.py"):
            parts = path.relative_to(source.parent).with_suffix("").parts
            if path.name != "__init__.py" and not any(
                p.startswith("_") and p != "__main__" for p in parts
            ):
                found.add(".".join(parts))
    return found


def test_public_module_paths_are_only_interfaces_and_say_so() -> None:
    public = _public_modules()
    assert public - INTERFACE_MODULES == set()
    for name in sorted(INTERFACE_MODULES):
        source = ROOT.joinpath(
            *next(
                s
                for s in SOURCES
                if (s.parent / name.replace(".", "/")).with_suffix(".py").exists()
            ).parent.parts,
            *name.split("."),
        )
        text = source.with_suffix(".py").read_text()
        assert "path is an interface" in " ".join(text.split()), name


@pytest.mark.parametrize(
    "name",
    sorted(INTERFACE_MODULES - {"substrax.checkpoint.__main__", "substrax.tracking.__main__"}),
)
def test_interface_paths_import(name: str) -> None:
    importlib.import_module(name)


def _extras(distribution: str) -> set[str]:
    directory = "substrax" if distribution == "substrax" else distribution
    with (ROOT / "packages" / directory / "pyproject.toml").open("rb") as file:
        return set(tomllib.load(file)["project"].get("optional-dependencies", {}))


def test_every_extra_a_missing_sdk_names_exists() -> None:
    named: set[tuple[str, str]] = set()
    for source in SOURCES:
        for path in source.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require":
                    words = {k.arg: k.value for k in node.keywords}
                    if all(
                        isinstance(words.get(k), ast.Constant) for k in ("distribution", "extra")
                    ):
                        named.add((words["distribution"].value, words["extra"].value))  # type: ignore[attr-defined]
    assert len(named) > 5
    missing = {
        f"{where}[{extra}]"
        for distribution, extra in named
        for where in (distribution, "substrax")
        if extra not in _extras(where)
    }
    assert missing == set()
