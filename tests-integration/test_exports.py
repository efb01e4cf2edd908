"""Each part's public names are written once, in its ``__init__.pyi``; everything else follows it.

The stub is what type checkers read. At run time ``substrax.support.lazy_exports`` reads the same
stub for ``__all__``, ``dir()`` and each name's first use, and the docs' API pages (``:::
substrax.part`` blocks that mkdocstrings renders through griffe) list what the stub lists. These
tests hold each of them to the stub, read here on its own with ``ast``: a name added to a stub
that does not resolve, or that an API page does not list, fails here.
"""

import ast
import json
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = {
    f"substrax.{init.parent.name}": init.parent
    for init in sorted(ROOT.glob("packages/*/src/substrax/*/__init__.py"))
}
# What a part's __init__.py may still import: the function that reads its stub (and, for
# compute, the one that keeps its 0.1.22 module paths), never one of its public names.
INIT_IMPORTS = {"lazy_exports", "moved_modules"}


def stub_names(package: str) -> list[str]:
    """The names ``package``'s stub re-exports, in its order; the stub holds nothing else."""
    stub = PACKAGES[package] / "__init__.pyi"
    names: list[str] = []
    for node in ast.parse(stub.read_text(encoding="utf-8"), str(stub)).body:
        assert isinstance(node, ast.ImportFrom), f"{stub}:{node.lineno}: not a re-export"
        for alias in node.names:
            assert alias.asname == alias.name, f"{stub}:{node.lineno}: not `{alias.name} as ...`"
            names.append(alias.name)
    return names


def test_a_stub_re_exports_from_its_own_package_or_support_only() -> None:
    """import-linter reads no stub: a name from another part may come from support alone."""
    for package, directory in PACKAGES.items():
        stub = directory / "__init__.pyi"
        for node in ast.parse(stub.read_text(encoding="utf-8"), str(stub)).body:
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module == "substrax.support", f"{package}: from {node.module}"


def test_every_part_package_lists_its_names_in_a_stub() -> None:
    assert len(PACKAGES) == 17
    missing = [
        package
        for package, directory in PACKAGES.items()
        if not (directory / "__init__.pyi").is_file()
    ]
    assert missing == []
    for package in PACKAGES:
        names = stub_names(package)
        assert names, package
        assert len(names) == len(set(names)), f"{package}'s stub lists a name twice"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_the_init_lists_no_name_of_its_own(package: str) -> None:
    """The ``__init__.py`` holds no second list: no ``__all__``, no import of a public name."""
    init = PACKAGES[package] / "__init__.py"
    tree = ast.parse(init.read_text(encoding="utf-8"), str(init))
    bound = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assigned = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    assert bound <= INIT_IMPORTS, f"{init} imports {sorted(bound - INIT_IMPORTS)}"
    assert "__all__" not in assigned, f"{init} writes __all__: the stub is the list"


# In a fresh interpreter: each package's __all__ and dir(), then every stub name by attribute
# access and by `from package import name` (the same object), and what a star import binds.
SURFACE = """
import importlib, json, sys
report = {}
for package, names in json.loads(sys.argv[1]).items():
    module = importlib.import_module(package)
    failed = {}
    for name in names:
        try:
            value = getattr(module, name)
            space = {}
            exec(f"from {package} import {name}", space)
            if space[name] is not value:
                failed[name] = "from-import gave another object"
            elif vars(module).get(name) is not value:
                failed[name] = "not kept in the package after its first use"
        except Exception as error:
            failed[name] = f"{type(error).__name__}: {error}"
    star = {}
    try:
        exec(f"from {package} import *", star)
    except Exception as error:
        failed["*"] = f"{type(error).__name__}: {error}"
    report[package] = {
        "all": list(module.__all__),
        "dir": dir(module),
        "star": sorted(n for n in star if n != "__builtins__"),
        "failed": failed,
    }
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def surface() -> dict[str, Any]:
    names = {package: stub_names(package) for package in PACKAGES}
    result = subprocess.run(
        [sys.executable, "-c", SURFACE, json.dumps(names)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_all_dir_and_imports_follow_the_stub(surface: dict[str, Any], package: str) -> None:
    names = stub_names(package)
    seen = surface[package]
    assert seen["failed"] == {}
    assert seen["all"] == sorted(names)
    assert set(names) <= set(seen["dir"])
    assert seen["star"] == sorted(names)


# The docs: which names each `::: substrax.part` block renders, as mkdocstrings does.


def api_blocks() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Every ``::: identifier`` block under ``docs/``: its page and its ``options``."""
    blocks: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if not line.startswith("::: "):
                continue
            indented: list[str] = []
            for following in lines[number + 1 :]:
                if not following.startswith(" "):
                    break
                indented.append(following)
            config = yaml.safe_load(textwrap.dedent("\n".join(indented))) if indented else None
            options = (config or {}).get("options", {})
            blocks.setdefault(line[4:].strip(), []).append((str(page.relative_to(DOCS)), options))
    return blocks


def undocumented(
    names: list[str],
    blocks: list[tuple[str, dict[str, Any]]],
    griffe_module: Any,  # a griffe.Module
) -> list[str]:
    """The names none of a package's API ``blocks`` renders (mkdocstrings' own test, per member).

    A block renders a member its ``members`` option lists, or, without that option, every member
    that is public by griffe's rules (an imported name only when it is exported), whose name the
    ``!^_`` filter keeps and whose import griffe resolves.
    """
    rendered: set[str] = set()
    for _page, options in blocks:
        listed = options.get("members")
        for name in names:
            member = griffe_module.members.get(name)
            if member is None or name.startswith("_"):
                continue
            if listed is False or (isinstance(listed, list) and name not in listed):
                continue
            if member.is_imported and not member.is_public:
                continue
            if member.is_alias and not member.resolved:
                continue
            rendered.add(name)
    return [name for name in names if name not in rendered]


@pytest.fixture(scope="module")
def griffe_substrax() -> Any:  # a griffe.Module
    """``substrax`` as mkdocstrings loads it: mkdocs.yml's search path and griffe extensions."""
    griffe = pytest.importorskip("griffe", reason="the docs group (mkdocstrings' griffe) is absent")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    (handler,) = (
        plugin["mkdocstrings"]["handlers"]["python"]
        for plugin in config["plugins"]
        if isinstance(plugin, dict) and "mkdocstrings" in plugin
    )
    runpy.run_path(str(ROOT / "docs" / "hooks" / "namespace.py"))  # lays out the search path
    extensions = griffe.load_extensions(
        *(str(ROOT / extension) for extension in handler["options"]["extensions"])
    )
    loader = griffe.GriffeLoader(
        search_paths=[str(ROOT / path) for path in handler["paths"]], extensions=extensions
    )
    substrax = loader.load("substrax")
    loader.resolve_aliases(implicit=False, external=None)
    return substrax


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_the_api_pages_document_every_name(griffe_substrax: Any, package: str) -> None:
    blocks = api_blocks().get(package, [])
    assert blocks, f"no docs page has a `::: {package}` block"
    module = griffe_substrax[package.removeprefix("substrax.")]
    assert undocumented(stub_names(package), blocks, module) == []


def test_a_name_the_docs_leave_out_fails(griffe_substrax: Any) -> None:
    """The check above can fail: a block listing only some members, or no block, misses names."""
    names = stub_names("substrax.tracking")
    module = griffe_substrax["tracking"]
    only_logger = [("packages/tracking.md", {"members": ["Logger"]})]
    assert undocumented(names, only_logger, module) == [name for name in names if name != "Logger"]
    assert undocumented(names, [], module) == names
    saved, module.exports = module.exports, None  # griffe without the stub's names: all private
    try:
        assert undocumented(names, [("x.md", {})], module) == names
    finally:
        module.exports = saved
