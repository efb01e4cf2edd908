"""List a repository's example scripts."""

import fnmatch
from collections.abc import Iterable
from pathlib import Path

from ._errors import ExamplesRootNotADirectoryError


def discover_examples(root: Path | str, *, include: Iterable[str] | None = None) -> list[Path]:
    """Every ``*.py`` under ``root``, sorted, skipping any path part that starts with ``_``.

    Args:
        root: The examples directory.
        include: Shell-style patterns matched against each path relative to ``root`` in posix
            form (``*`` also crosses ``/``), e.g. ``("mesh/*", "quick_start.py")``; an example
            must match one. ``None`` keeps every example.

    Returns:
        The example scripts, sorted.

    Raises:
        ExamplesRootNotADirectoryError: ``root`` is not a directory (a ``NotADirectoryError``).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.examples import discover_examples
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     root = Path(directory)
        ...     for name in ("b.py", "a.py", "_helpers.py", "_lib/x.py", "notes.txt"):
        ...         (root / name).parent.mkdir(exist_ok=True)
        ...         _ = (root / name).write_text("")
        ...     [p.name for p in discover_examples(root)]
        ['a.py', 'b.py']
    """
    if isinstance(root, str) and not root.strip():  # Path("") is the working directory
        raise ValueError("root='' names no directory; pass the examples directory")
    base = Path(root)
    if not base.is_dir():
        raise ExamplesRootNotADirectoryError(base)
    if isinstance(include, str):
        raise TypeError(f"include must be an iterable of patterns, not the string {include!r}")
    patterns = None if include is None else tuple(include)
    found: list[Path] = []
    for path in base.rglob("*.py"):
        relative = path.relative_to(base)
        if any(part.startswith("_") for part in relative.parts) or not path.is_file():
            continue
        if patterns is not None and not any(
            fnmatch.fnmatchcase(relative.as_posix(), p) for p in patterns
        ):
            continue
        found.append(path)
    return sorted(found)
