"""List a repository's example scripts."""

import fnmatch
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from ._errors import ExamplesRootNotADirectoryError


def discover_examples(root: Path | str, *, include: Iterable[str] | None = None) -> list[Path]:
    """Every ``*.py`` under ``root``, sorted, skipping any path part that starts with ``_`` or ``.``.

    Hidden files and directories (``.ipynb_checkpoints``, ``.venv``) are skipped like private
    ones. Symlinked directories are followed, each directory once: a link back to a directory
    already walked (a loop, or a second link to it) adds nothing.

    Args:
        root: The examples directory.
        include: Shell-style patterns matched against each path relative to ``root`` in posix
            form (``*`` also crosses ``/``), e.g. ``("mesh/*", "quick_start.py")``; an example
            must match one. ``None`` keeps every example.

    Returns:
        The example scripts, sorted.

    Raises:
        ExamplesRootNotADirectoryError: ``root`` is not a directory (a ``NotADirectoryError``).
        TypeError: ``root`` is not a path, or ``include`` is a single string.
        ValueError: ``root`` is ``""``.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.examples import discover_examples
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     root = Path(directory)
        ...     for name in ("b.py", "a.py", "_helpers.py", "_lib/x.py", ".cache/y.py", "n.txt"):
        ...         (root / name).parent.mkdir(exist_ok=True)
        ...         _ = (root / name).write_text("")
        ...     [p.name for p in discover_examples(root)]
        ['a.py', 'b.py']
    """
    if isinstance(root, str) and not root.strip():  # Path("") is the working directory
        raise ValueError("root='' names no directory; pass the examples directory")
    if not isinstance(root, str | os.PathLike):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"root must be the examples directory (a str or Path), got {root!r}")
    base = Path(root)
    if not base.is_dir():
        raise ExamplesRootNotADirectoryError(base)
    if isinstance(include, str):
        raise TypeError(f"include must be an iterable of patterns, not the string {include!r}")
    patterns = None if include is None else tuple(include)
    found: list[Path] = []
    for path in _scripts(base):
        relative = path.relative_to(base)
        if patterns is not None and not any(
            fnmatch.fnmatchcase(relative.as_posix(), p) for p in patterns
        ):
            continue
        found.append(path)
    return sorted(found)


def _hidden(name: str) -> bool:
    return name.startswith(("_", "."))


def _scripts(base: Path) -> Iterator[Path]:
    """The ``*.py`` files under ``base``, following symlinked directories, each directory once."""
    walked: set[tuple[int, int]] = set()
    for directory, subdirectories, files in os.walk(base, followlinks=True):
        try:
            here = Path(directory).stat()
        except OSError:  # gone, or a link to nowhere, since it was listed: os.walk skips such too
            subdirectories.clear()
            continue
        if (here.st_dev, here.st_ino) in walked:  # a loop, or a directory reached before
            subdirectories.clear()
            continue
        walked.add((here.st_dev, here.st_ino))
        subdirectories[:] = sorted(d for d in subdirectories if not _hidden(d))
        for name in files:
            path = Path(directory, name)
            if name.endswith(".py") and not _hidden(name) and path.is_file():
                yield path
