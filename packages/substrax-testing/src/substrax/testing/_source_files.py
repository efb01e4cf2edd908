"""Which files of a repository are its Python sources, and the record every source scan returns.

Standard library only (and the error convention of ``substrax.support``, which imports no
third-party code): a repository runs these scans in any environment, jax installed or not.
"""

import ast
import io
import os
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from substrax.support import StructuredError


EXCLUDED_DIRECTORIES: Final = frozenset(
    {
        ".git",
        ".hg",
        ".mypy_cache",
        ".nox",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".venv",
        "__pycache__",
        "node_modules",
        "site-packages",
        "venv",
    }
)
"""Directory names :func:`python_files` never enters, at any depth: environments and caches."""

BUILD_OUTPUTS: Final = frozenset({"build", "dist"})
"""Directory names :func:`python_files` skips where they are build outputs, not packages."""


class SourceNotFoundError(StructuredError, FileNotFoundError, kw_only=True):
    """A source scan was given a path that does not exist.

    Attributes:
        argument: The argument that named it (``"root"``, ``"pages"``, ...).
        path: The path it looked for.

    Example:
        >>> from pathlib import Path
        >>> from substrax.testing.source_scans import SourceNotFoundError
        >>> print(SourceNotFoundError(argument="pages", path=Path("/repo/README.md")))
        pages names /repo/README.md, which does not exist; pass paths that exist (relative ones are read from root)
    """

    __module__ = "substrax.testing.source_scans"
    template = (
        "{argument} names {path}, which does not exist; "
        "pass paths that exist (relative ones are read from root)"
    )

    argument: str
    path: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceText:
    """A piece of text at a place in a repository: a scan's finding, or a documented text.

    Attributes:
        path: Where it is (as the scan was given it, or relative to the repository root).
        line: Its first line, counted from 1.
        scope: The qualified name of the enclosing class or function (``"Trainer.fit"``);
            ``""`` at module level and for whole files.
        text: The source line of a finding, or the whole documented text.

    Example:
        >>> from substrax.testing.source_scans import SourceText
        >>> print(SourceText(path="src/app.py", line=3, scope="main", text="os.putenv('A', '1')"))
        src/app.py:3 (main): os.putenv('A', '1')
    """

    path: str
    line: int
    scope: str
    text: str

    def __str__(self) -> str:
        where = f" ({self.scope})" if self.scope else ""
        return f"{self.path}:{self.line}{where}: {self.text}"


def existing(path: Path | str, argument: str) -> Path:
    """``path`` as a Path, or :class:`SourceNotFoundError` naming ``argument`` if it is missing."""
    path = Path(path)
    if not path.exists():
        raise SourceNotFoundError(argument=argument, path=path)
    return path


def existing_file(path: Path | str, argument: str) -> Path:
    """:func:`existing`, and a ValueError naming ``argument`` if ``path`` is a directory."""
    path = existing(path, argument)
    if path.is_dir():
        raise ValueError(
            f"{argument}={str(path)!r} is a directory, not a file; pass one of its files "
            "(python_files(directory) lists its Python files)"
        )
    return path


def python_text(path: Path, errors: str = "strict") -> str:
    r"""A Python file's text, decoded as Python decodes it (byte-order mark, ``# coding:`` line).

    Line ends (``\r\n``, ``\r``) read as ``\n``, so ``text.split("\n")`` has the lines
    ``ast`` counts; a form feed or U+2028 stays inside its line, as Python reads it. ``errors``:
    as ``bytes.decode``'s, for bytes that encoding cannot decode (``"strict"`` raises).
    """
    with path.open("rb") as raw:
        encoding, _ = tokenize.detect_encoding(raw.readline)
        raw.seek(0)
        with io.TextIOWrapper(raw, encoding, errors=errors, line_buffering=True) as file:
            return file.read()


def parsed_python(path: Path) -> tuple[ast.Module, list[str]]:
    """A Python file's syntax tree and its lines, numbered as the tree numbers them (from 0).

    A file that parses is read whole, as Python imports it: Python does not decode a comment,
    so a byte its encoding cannot decode there (a latin-1 ``é`` in a UTF-8 file) is no error,
    and its line reads with U+FFFD in its place.

    Raises:
        SyntaxError: The file is not Python that Python would import (its bytes included).
    """
    tree = ast.parse(path.read_bytes(), str(path))  # decoded as an import decodes it
    return tree, python_text(path, errors="replace").split("\n")


def _skipped(directory: Path, skipped: frozenset[str], build_outputs: frozenset[str]) -> bool:
    if directory.name in skipped:
        return True
    return directory.name in build_outputs and not (directory / "__init__.py").is_file()


def python_files(
    root: Path | str,
    *,
    excluded: Iterable[str] = EXCLUDED_DIRECTORIES,
    build_outputs: Iterable[str] = BUILD_OUTPUTS,
) -> list[Path]:
    """The ``*.py`` files under ``root``, sorted, skipping environments, caches and build outputs.

    A directory named in ``excluded`` is never entered. One named in ``build_outputs`` is
    skipped unless it holds an ``__init__.py``: ``build/lib/app.py`` (what setuptools writes)
    and ``dist/`` are outputs, at the root or in a workspace member alike, while a package
    ``app/dist/__init__.py`` is source and is scanned. A namespace package (no
    ``__init__.py``) named ``build`` or ``dist`` is skipped too: pass ``build_outputs=()``.
    Symbolic links are followed, to directories and files alike, as Python imports through
    them: a file reached by two paths is listed under each (each is a module of its own). A
    link to nothing is skipped, and a link to a directory it is in (a loop) is not entered.

    Args:
        root: A directory (or a single ``.py`` file, returned as it is; any other file is
            refused).
        excluded: Directory names never entered, at any depth (default:
            :data:`EXCLUDED_DIRECTORIES`: ``.git``, ``.venv``, ``__pycache__``, ...).
        build_outputs: Directory names skipped where they hold no ``__init__.py`` (default:
            :data:`BUILD_OUTPUTS`: ``build`` and ``dist``).

    Returns:
        The files, sorted by path.

    Raises:
        SourceNotFoundError: ``root`` does not exist (a ``FileNotFoundError``).
        TypeError: ``excluded`` or ``build_outputs`` is a single ``str``, not a collection.
        ValueError: ``root`` is a file whose name does not end in ``.py``.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.testing.source_scans import python_files
        >>> names = ["app/main.py", ".venv/lib/site.py", "build/lib/app.py", "app/dist/__init__.py"]
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     root = Path(directory)
        ...     for name in names:
        ...         (root / name).parent.mkdir(parents=True, exist_ok=True)
        ...         _ = (root / name).write_text("")
        ...     found = [path.relative_to(root).as_posix() for path in python_files(root)]
        >>> found
        ['app/dist/__init__.py', 'app/main.py']
    """
    for argument, value in (("excluded", excluded), ("build_outputs", build_outputs)):
        if isinstance(value, str):
            raise TypeError(
                f"{argument} must be a collection of directory names, not the str {value!r}"
            )
    root = existing(root, "root")
    if root.is_file():
        if root.suffix != ".py":
            raise ValueError(
                f"{root} is a file but not a .py file; pass a directory to search, or a .py file"
            )
        return [root]
    return _walk(root, frozenset(excluded), frozenset(build_outputs))[0]


def python_links_to_nothing(root: Path) -> list[Path]:
    """The ``*.py`` links to nothing under the directory ``root``, which python_files skips."""
    return _walk(root, EXCLUDED_DIRECTORIES, BUILD_OUTPUTS)[1]


def _walk(
    root: Path, skipped: frozenset[str], outputs: frozenset[str]
) -> tuple[list[Path], list[Path]]:
    """The ``*.py`` files under the directory ``root``, and its ``*.py`` links to nothing."""
    inside = {root: frozenset({os.path.realpath(root)})}  # each directory's real ancestors
    found: list[Path] = []
    for directory, subdirectories, files in root.walk(follow_symlinks=True):
        above = inside.pop(directory)
        subdirectories[:] = [
            name
            for name in subdirectories
            if not _skipped(directory / name, skipped, outputs)
            and os.path.realpath(directory / name) not in above  # a link into itself: a loop
        ]
        for name in subdirectories:
            inside[directory / name] = above | {os.path.realpath(directory / name)}
        found.extend(directory / name for name in files if name.endswith(".py"))
    files = [path for path in found if path.is_file()]
    return sorted(files), sorted(path for path in found if not path.is_file())
