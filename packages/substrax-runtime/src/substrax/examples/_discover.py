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
            must match one. A leading ``./`` is dropped (``"./a.py"`` is ``"a.py"``). Each
            pattern must match at least one example. ``None`` keeps every example.

    Returns:
        The example scripts, sorted.

    Raises:
        ExamplesRootNotADirectoryError: ``root`` is not a directory (a ``NotADirectoryError``).
        TypeError: ``root`` is not a path, or ``include`` is a single string or holds a
            pattern that is no str.
        ValueError: ``root`` is ``""``, or an ``include`` pattern matches no example (naming it).

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
    patterns = None if include is None else _patterns(include)
    found: list[Path] = []
    unmatched = dict.fromkeys(patterns or ())
    for path in _scripts(base):
        relative = path.relative_to(base).as_posix()
        matched = [p for p in patterns or () if fnmatch.fnmatchcase(relative, p)]
        if patterns is None or matched:
            found.append(path)
        for pattern in matched:
            unmatched.pop(pattern, None)
    if unmatched:
        raise ValueError(
            f"include pattern(s) {', '.join(map(repr, unmatched))} match no example under "
            f"{str(base)!r}; patterns match paths relative to the root, e.g. 'sub/x.py' or "
            "'sub/*', and private or hidden scripts (a path part starting with '_' or '.') are "
            "never examples"
        )
    return sorted(found)


def _patterns(include: Iterable[str]) -> tuple[str, ...]:
    """The ``include`` patterns, each without a leading ``./``; TypeError for one that is no str."""
    patterns: list[str] = []
    for pattern in include:
        if not isinstance(pattern, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"include patterns must be str, got {pattern!r}")
        while pattern.startswith("./"):
            pattern = pattern[2:]  # noqa: PLW2901 - the pattern as it is matched
        patterns.append(pattern)
    return tuple(patterns)


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
