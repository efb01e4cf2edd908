"""Which files of a repository are its Python sources, and the record every source scan returns.

Standard library only (and the error convention of ``substrax.support``, which imports no
third-party code): a repository runs these scans in any environment, jax installed or not.
"""

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
        "build",
        "dist",
        "node_modules",
        "site-packages",
        "venv",
    }
)
"""Directory names :func:`python_files` never enters: environments, caches and build outputs."""


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


def python_files(root: Path | str, *, excluded: Iterable[str] = EXCLUDED_DIRECTORIES) -> list[Path]:
    """The ``*.py`` files under ``root``, sorted, skipping excluded directories.

    Args:
        root: A directory (or a single ``.py`` file, returned as it is).
        excluded: Directory names never entered, at any depth (default:
            :data:`EXCLUDED_DIRECTORIES`: ``.venv``, ``build``, ``dist``, caches, ...).

    Returns:
        The files, sorted by path.

    Raises:
        SourceNotFoundError: ``root`` does not exist (a ``FileNotFoundError``).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.testing.source_scans import python_files
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     root = Path(directory)
        ...     for name in ("app/main.py", ".venv/lib/site.py", "build/lib/app.py", "README.md"):
        ...         (root / name).parent.mkdir(parents=True, exist_ok=True)
        ...         _ = (root / name).write_text("")
        ...     found = [path.relative_to(root).as_posix() for path in python_files(root)]
        >>> found
        ['app/main.py']
    """
    if isinstance(excluded, str):
        raise TypeError(
            f"excluded must be a collection of directory names, not the str {excluded!r}"
        )
    root = existing(root, "root")
    if root.is_file():
        return [root]
    skipped = frozenset(excluded)
    found: list[Path] = []
    for directory, subdirectories, files in root.walk():
        subdirectories[:] = [name for name in subdirectories if name not in skipped]
        found.extend(directory / name for name in files if name.endswith(".py"))
    return sorted(found)
