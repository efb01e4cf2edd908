"""substrax.support's export plumbing: names read from a package's stub, old paths kept with a warning."""

import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import substrax.support
from substrax.support import lazy_exports, moved_modules
from substrax.support._lazy import read_stub


def _stub(tmp_path: Path, text: str) -> str:
    path = tmp_path / "__init__.pyi"
    path.write_text(text)
    return str(path)


def test_read_stub_keeps_the_order_and_each_module_as_written(tmp_path: Path) -> None:
    stub = _stub(
        tmp_path,
        '"""The names."""\n'
        "# a comment\n"
        "from ._b import B as B, b as b\n"
        "from ._a import (\n    A as A,\n)\n"
        "from substrax.support import Mode as Mode\n",
    )
    assert read_stub(stub) == {"B": "._b", "b": "._b", "A": "._a", "Mode": "substrax.support"}


@pytest.mark.parametrize(
    ("line", "wanted"),
    [
        ("import os", "only `from .module import Name as Name` lines"),
        ("x = 1", "only `from .module import Name as Name` lines"),
        ("from ..other import A as A", "only `from .module import Name as Name` lines"),
        ("from . import _a as _a", "only `from .module import Name as Name` lines"),
        ("from ._a import A", "re-exports as `A as A`"),
        ("from ._a import A as B", "re-exports as `A as A`"),
        ("from ._a import *", "only `from .module import Name as Name` lines"),
        ("from ._a import A as A\nfrom ._b import A as A", "'A' once"),
    ],
)
def test_read_stub_refuses_anything_but_re_exports(tmp_path: Path, line: str, wanted: str) -> None:
    stub = _stub(tmp_path, f"from ._z import Z as Z\n{line}\n")
    with pytest.raises(ValueError, match=rf"__init__\.pyi:\d+: a package stub holds {wanted}"):
        read_stub(stub)


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """An importable package of its own: ``_a`` defines ``A`` and ``a``, ``_b`` defines ``B``."""
    name = f"lazy_demo_{uuid.uuid4().hex}"
    directory = tmp_path / name
    directory.mkdir()
    (directory / "_a.py").write_text("A = object()\na = 'a'\n")
    (directory / "_b.py").write_text("B = object()\n")
    (directory / "__init__.pyi").write_text(
        "from ._a import A as A, a as a\n"
        "from ._b import B as B\n"
        "from substrax.support import Mode as Mode\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, directory
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]


def _import(name: str, directory: Path, init: str) -> Any:
    (directory / "__init__.py").write_text(f"from substrax.support import lazy_exports\n{init}\n")
    return __import__(name)


def test_names_load_on_first_use_and_stay(package: tuple[str, Path]) -> None:
    name, directory = package
    module = _import(name, directory, "lazy_exports(__name__)")
    assert f"{name}._a" not in sys.modules
    assert module.__all__ == ["A", "B", "Mode", "a"]
    assert {"A", "B", "Mode", "a"} <= set(dir(module))
    first = module.A
    assert f"{name}._a" in sys.modules
    assert f"{name}._b" not in sys.modules
    assert vars(module)["A"] is first is sys.modules[f"{name}._a"].A
    assert module.Mode is substrax.support.Mode
    from_import = __import__(name, fromlist=["B"]).B  # what `from name import B` runs
    assert from_import is sys.modules[f"{name}._b"].B
    with pytest.raises(AttributeError, match=f"module '{name}' has no attribute 'C'"):
        module.C  # noqa: B018 - the access is the test


def test_eager_loads_the_named_modules_now(package: tuple[str, Path]) -> None:
    name, directory = package
    module = _import(name, directory, 'lazy_exports(__name__, eager=("._b",))')
    assert "B" in vars(module)
    assert "A" not in vars(module)
    assert f"{name}._a" not in sys.modules


def test_eager_true_loads_every_name_now(package: tuple[str, Path]) -> None:
    name, directory = package
    module = _import(name, directory, "lazy_exports(__name__, eager=True)")
    assert {"A", "a", "B", "Mode"} <= set(vars(module))


def test_a_name_the_init_bound_itself_is_kept(package: tuple[str, Path]) -> None:
    name, directory = package
    module = _import(name, directory, "A = 'mine'\nlazy_exports(__name__, eager=True)")
    assert module.A == "mine"


def test_an_eager_module_the_stub_does_not_name_is_refused(package: tuple[str, Path]) -> None:
    name, directory = package
    with pytest.raises(ValueError, match=r"eager modules \['\._c'\] are not in its __init__\.pyi"):
        _import(name, directory, 'lazy_exports(__name__, eager=("._c",))')


def test_a_package_installed_without_its_stub_names_the_damage(
    package: tuple[str, Path],
) -> None:
    name, directory = package
    (directory / "__init__.pyi").unlink()  # what a hand-pruned or half-copied install leaves
    with pytest.raises(ImportError, match=r"installed without .*__init__\.pyi.*reinstall") as error:
        _import(name, directory, "lazy_exports(__name__)")
    assert error.value.name == name


def test_lazy_exports_is_support_s_own_mechanism() -> None:
    assert substrax.support.lazy_exports is lazy_exports
    assert substrax.support.__all__ == sorted(substrax.support.__all__)
    assert "moved_modules" in substrax.support.__all__


def test_an_old_path_warns_once_and_serves_the_same_objects() -> None:
    old = f"old_support_{uuid.uuid4().hex}"
    moved_modules(
        {old: {"substrax.support": ["Mode", "check_int"], "substrax.support._lazy": ["read_stub"]}}
    )
    try:
        with pytest.warns(DeprecationWarning, match=f"{old} is deprecated") as caught:
            module = __import__(old)
        (warning,) = caught
        assert str(warning.message) == (
            f"{old} is deprecated and will be removed: use"
            " `from substrax.support import Mode, check_int`; read_stub went private, with no"
            " import to use instead"
        )
        assert warning.filename == __file__  # the importing line
        assert module.Mode is substrax.support.Mode
        assert module.read_stub is read_stub
        assert module.__all__ == ["Mode", "check_int", "read_stub"]
        del sys.modules[old]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = __import__(old)  # once per process: no second warning
        assert again.check_int is substrax.support.check_int
    finally:
        sys.modules.pop(old, None)
