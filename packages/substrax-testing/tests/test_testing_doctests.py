"""The docstring examples of substrax.testing run as written."""

import doctest
import importlib

import pytest


MODULES = [
    "substrax.testing",
    "substrax.testing._child",
    "substrax.testing._traces",
    "substrax.testing._compiles",
    "substrax.testing._jax_config",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=False)
    assert attempted > 0
    assert failed == 0, (
        f"{failed} of {attempted} docstring examples in {name} failed (rerun with -s)"
    )
