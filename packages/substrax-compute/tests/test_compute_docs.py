"""Every docstring example in substrax.compute runs."""

import doctest
import importlib

import pytest


MODULES = [
    "substrax.compute",
    "substrax.compute._display",
    "substrax.compute._files",
    "substrax.compute._paths",
    "substrax.compute._toml",
    "substrax.compute._upload",
    "substrax.compute.backend",
    "substrax.compute.cli",
    "substrax.compute.config",
    "substrax.compute.local",
    "substrax.compute.manifest",
    "substrax.compute.modal_backend",
    "substrax.compute.registry",
    "substrax.compute.skypilot_backend",
    "substrax.compute.spec",
    "substrax.compute.worker",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SUBSTRAX_STATE_DIR", str(tmp_path))
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
