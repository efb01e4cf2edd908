"""Directories the CLI writes to, refused up front when a plain file stands in the way."""

from pathlib import Path

from ._errors import DirectoryPathError


def require_directory(path: Path, *, what: str, fix: str) -> Path:
    """``path`` when it is a directory or can be created as one (nothing is created).

    Raises:
        DirectoryPathError: ``path`` or one of its parents is an existing non-directory.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.compute._paths import require_directory
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     file = Path(directory) / "notes.txt"
        ...     _ = file.write_text("x")
        ...     require_directory(file / "out", what="--into", fix="pass a directory")
        Traceback (most recent call last):
        ...
        substrax.compute.DirectoryPathError: --into .../notes.txt/out cannot be a directory: .../notes.txt is a file; pass a directory
    """
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise DirectoryPathError(path, candidate, what=what, fix=fix)
            break
    return path
