"""Gathering what a repository documents: docstrings, pages and example scripts, as texts.

A check that must hold for everything a user reads (every ``make_mesh`` call names its axis
types, every import path exists) runs over this corpus. Standard library only: docstrings are
read from the syntax tree, never by importing the package.
"""

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from ._source_files import SourceText, existing, python_files


PAGE_SUFFIXES: Final = (".md", ".rst")
"""The files :func:`documented_texts` reads from ``page_directories``."""

type _Documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def _where(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _docstrings(node: _Documented, scope: str) -> Iterator[tuple[str, int, str]]:
    """``(scope, line, docstring)`` of ``node`` and of the public classes and functions in it."""
    first = node.body[0] if node.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        yield scope, first.lineno, first.value.value
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return  # what is defined inside a function is not part of the API
    for child in node.body:
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and (
            not child.name.startswith("_")
        ):
            yield from _docstrings(child, f"{scope}.{child.name}" if scope else child.name)


def _whole(path: Path, root: Path) -> SourceText:
    return SourceText(path=_where(path, root), line=1, scope="", text=path.read_text("utf-8"))


def documented_texts(
    root: Path | str,
    *,
    package: str | Path,
    pages: Sequence[str | Path] = (),
    page_directories: Sequence[str | Path] = (),
    script_directories: Sequence[str | Path] = (),
) -> list[SourceText]:
    r"""Every text a repository documents: docstrings, pages and example scripts.

    Relative paths are read from ``root``; each text's ``path`` is relative to ``root``.

    Args:
        root: The repository root.
        package: A package's source directory (or one module): the docstring of each module
            and of each public class, function and method (a name without a leading ``_``),
            read without importing it. ``scope`` names the class or function, ``line`` is the
            docstring's first line.
        pages: Single pages read whole (``README.md``).
        page_directories: Directories whose ``.md`` and ``.rst`` files are read whole.
        script_directories: Directories whose Python files (example scripts) are read whole.

    Returns:
        The texts: the package's docstrings, then pages, page directories and scripts, each
        group in path order.

    Raises:
        SourceNotFoundError: A path does not exist (a ``FileNotFoundError``); the message names
            the argument that gave it.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.testing.source_scans import documented_texts
        >>> source = ["'The app.'", "def run():", "    'Run it.'", "def _helper():", "    'Hidden.'"]
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     root = Path(directory)
        ...     (root / "src").mkdir()
        ...     _ = (root / "src" / "app.py").write_text("\n".join(source))
        ...     _ = (root / "README.md").write_text("# App\n")
        ...     texts = documented_texts(root, package="src", pages=["README.md"])
        >>> [(text.path, text.scope, text.text) for text in texts]
        [('src/app.py', '', 'The app.'), ('src/app.py', 'run', 'Run it.'), ('README.md', '', '# App\n')]
    """
    for argument, value in (
        ("pages", pages),
        ("page_directories", page_directories),
        ("script_directories", script_directories),
    ):
        if isinstance(value, str | Path):
            raise TypeError(
                f"{argument} must be a sequence of paths, not the single path {value!r}"
            )
    root = existing(root, "root")
    texts: list[SourceText] = []
    for path in python_files(existing(root / package, "package")):
        tree = ast.parse(path.read_text("utf-8"), str(path))
        texts.extend(
            SourceText(path=_where(path, root), line=line, scope=scope, text=text)
            for scope, line, text in _docstrings(tree, "")
        )
    texts.extend(_whole(existing(root / page, "pages"), root) for page in pages)
    for directory in page_directories:
        found = existing(root / directory, "page_directories").rglob("*")
        texts.extend(_whole(path, root) for path in sorted(found) if path.suffix in PAGE_SUFFIXES)
    for directory in script_directories:
        scripts = python_files(existing(root / directory, "script_directories"))
        texts.extend(_whole(path, root) for path in scripts)
    return texts
