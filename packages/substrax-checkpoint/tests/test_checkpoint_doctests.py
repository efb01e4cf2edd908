"""Every docstring example in substrax.checkpoint runs."""

import doctest
import importlib
import pkgutil

import pytest

import substrax.checkpoint


MODULES = sorted(
    {"substrax.checkpoint"}
    | {
        f"substrax.checkpoint.{info.name}"
        for info in pkgutil.iter_modules(substrax.checkpoint.__path__)
        if info.name != "__main__"
    }
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, raise_on_error=False, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
