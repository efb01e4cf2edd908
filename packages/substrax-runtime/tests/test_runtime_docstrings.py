"""Every docstring example in substrax-runtime runs and prints what it shows."""

import doctest
import importlib
import pkgutil

import pytest

import substrax


def _modules() -> list[str]:
    names = []
    for part in ("runtime", "devices", "artifacts", "rng", "typing", "records", "examples"):
        package = importlib.import_module(f"substrax.{part}")
        names.append(package.__name__)
        names.extend(
            info.name for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}.")
        )
    return names


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_namespace_is_shared():
    assert substrax.runtime.__name__ == "substrax.runtime"
