import doctest
import importlib

import pytest

import substrax.mesh


MODULES = [
    "substrax.mesh",
    *(f"substrax.mesh.{m}" for m in ("_meshes", "_rules", "_logical", "_config", "_strategies")),
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs=vars(substrax.mesh), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
