"""Every docstring example in substrax.tracking and substrax.callbacks runs as written."""

import doctest
import importlib
import pkgutil

import pytest

import substrax.callbacks
import substrax.tracking


MODULES = [
    *sorted(
        f"{package.__name__}.{info.name}"
        for package in (substrax.tracking, substrax.callbacks)
        for info in pkgutil.iter_modules(package.__path__)
        if info.name != "__main__"
    ),
    "substrax.tracking",
    "substrax.callbacks",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AVITAI_OUTPUT_DIR", str(tmp_path / "out"))
    module = importlib.import_module(name)
    package = importlib.import_module(name.rsplit("._", 1)[0])
    result = doctest.testmod(
        module, extraglobs=vars(package), optionflags=doctest.ELLIPSIS, verbose=False
    )
    assert result.failed == 0
    assert list(tmp_path.iterdir()) in (
        [],
        [tmp_path / "out"],
    )  # examples write nowhere near the CWD
