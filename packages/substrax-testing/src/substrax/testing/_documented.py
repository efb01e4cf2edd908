"""Gathering what a repository documents: docstrings, pages and example scripts, as texts.

A check that must hold for everything a user reads (every ``make_mesh`` call names its axis
types, every import path exists) runs over this corpus. Standard library only: docstrings are
read from the syntax tree, never by importing the package.
"""

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from ._source_files import (
    SourceNotFoundError,
    SourceText,
    existing,
    existing_file,
    python_files,
    python_links_to_nothing,
    python_text,
)


PAGE_SUFFIXES: Final = (".md", ".rst")
"""The files :func:`documented_texts` reads from ``page_directories``."""

type _Documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def _where(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _string(statement: ast.stmt | None) -> str | None:
    """The text of ``statement`` if it is a string on its own (a docstring where it stands)."""
    if (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    ):
        return statement.value.value
    return None


def _assigned(statement: ast.stmt) -> str | None:
    """The name ``X = ...``, ``X: T = ...``, ``X: T`` or ``type X = ...`` binds; None otherwise."""
    target: ast.expr
    if isinstance(statement, ast.Assign):
        target = statement.targets[0]
    elif isinstance(statement, ast.AnnAssign):
        target = statement.target
    elif isinstance(statement, ast.TypeAlias):
        target = statement.name
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


def _blocks(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists inside an ``if``, ``try``, ``with``, ``for``, ``while`` or ``match``."""
    if isinstance(statement, ast.If | ast.For | ast.AsyncFor | ast.While):
        yield from (statement.body, statement.orelse)
    elif isinstance(statement, ast.With | ast.AsyncWith):
        yield statement.body
    elif isinstance(statement, ast.Try | ast.TryStar):
        yield statement.body
        yield from (handler.body for handler in statement.handlers)
        yield from (statement.orelse, statement.finalbody)
    elif isinstance(statement, ast.Match):
        yield from (case.body for case in statement.cases)


def _in_body(body: list[ast.stmt], scope: str) -> Iterator[tuple[str, int, str]]:
    """The docstrings of the public definitions and attributes in a module or class body.

    A definition or attribute inside an ``if``, ``try`` or ``with`` block counts as one beside
    it; an attribute's docstring is the string statement right after its assignment.
    """
    for index, statement in enumerate(body):
        following = body[index + 1] if index + 1 < len(body) else None
        if isinstance(statement, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if not statement.name.startswith("_"):
                yield from _docstrings(statement, _qualified(scope, statement.name))
        elif (name := _assigned(statement)) is not None:
            text = _string(following)
            if text is not None and following is not None and not name.startswith("_"):
                yield _qualified(scope, name), following.lineno, text
        else:
            for block in _blocks(statement):
                yield from _in_body(block, scope)


def _docstrings(node: _Documented, scope: str) -> Iterator[tuple[str, int, str]]:
    """``(scope, line, docstring)`` of ``node`` and of the public names defined in it."""
    first = node.body[0] if node.body else None
    text = _string(first)
    if text is not None and first is not None:
        yield scope, first.lineno, text
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        yield from _in_body(node.body, scope)  # what a function defines is not part of the API


def _qualified(scope: str, name: str) -> str:
    return f"{scope}.{name}" if scope else name


def _python_files(path: Path, argument: str) -> list[Path]:
    """``python_files(path)``; a link to nothing there (which it skips) is refused, named."""
    if path.is_dir() and (links := python_links_to_nothing(path)):
        raise SourceNotFoundError(argument=argument, path=links[0])
    return python_files(path)


def _whole(path: Path, root: Path, argument: str) -> SourceText:
    """A page (UTF-8) or script (as Python decodes it) read whole; ``argument`` listed it."""
    path = existing(path, argument)  # a link to nothing is listed, and is not there
    try:
        text = python_text(path) if path.suffix == ".py" else path.read_text("utf-8")
    except UnicodeDecodeError as error:
        encoding = (
            "the encoding it declares (UTF-8 by default)" if path.suffix == ".py" else "UTF-8"
        )
        raise ValueError(
            f"{argument}: {path} is not text in {encoding}: {error.reason} at byte "
            f"{error.start}; save it as UTF-8, or leave it out"
        ) from error
    return SourceText(path=_where(path, root), line=1, scope="", text=text)


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
            and of each public attribute (a string right after ``X = ...`` or ``X: T``, at
            module or class level), read without importing it; definitions inside ``if``,
            ``try`` or ``with`` blocks count. ``scope`` names the class, function or attribute,
            ``line`` is the docstring's first line.
        pages: Single pages read whole (``README.md``).
        page_directories: Directories whose ``.md`` and ``.rst`` files are read whole.
        script_directories: Directories whose Python files (example scripts) are read whole.

    Returns:
        The texts: the package's docstrings, then pages, page directories and scripts, each
        group in path order; a file reached twice (a page under a page directory too) once.

    Raises:
        SourceNotFoundError: A path does not exist (a ``FileNotFoundError``), or a file found
            in a directory is a link to nothing; the message names the argument that gave it.
        ValueError: ``package`` or a script directory is a file but not a ``.py`` file, a
            page is a directory, a page directory is a file, or a page (script) is not UTF-8
            (in the encoding it declares), named.

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
    for path in _python_files(existing(root / package, "package"), "package"):
        source = path.read_bytes()
        tree = ast.parse(source, str(path))  # decoded as an import decodes it
        texts.extend(
            SourceText(path=_where(path, root), line=line, scope=scope, text=text)
            for scope, line, text in _docstrings(tree, "")
        )
    texts.extend(_whole(existing_file(root / page, "pages"), root, "pages") for page in pages)
    for directory in page_directories:
        if not (folder := existing(root / directory, "page_directories")).is_dir():
            raise ValueError(
                f"page_directories={str(folder)!r} is a file, not a directory; pass a single "
                "page in pages="
            )
        found = [path for path in folder.rglob("*") if path.suffix in PAGE_SUFFIXES]
        files = [path for path in found if not path.is_dir()]  # not a directory ``x.md``
        texts.extend(_whole(path, root, "page_directories") for path in sorted(files))
    for directory in script_directories:
        scripts = _python_files(
            existing(root / directory, "script_directories"), "script_directories"
        )
        texts.extend(_whole(path, root, "script_directories") for path in scripts)
    unique: dict[tuple[object, ...], SourceText] = {}  # a page given and under a directory too
    for text in texts:
        unique.setdefault((text.path, text.scope, text.line, text.text), text)
    return list(unique.values())
