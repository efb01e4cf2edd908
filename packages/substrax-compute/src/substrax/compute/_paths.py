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


def check_file_name(what: str, name: object) -> str:
    """``name`` when it can name one file of a directory (a run id, a job): else ValueError.

    Example:
        >>> from substrax.compute._paths import check_file_name
        >>> check_file_name("run_id", "../escape")
        Traceback (most recent call last):
        ...
        ValueError: run_id='../escape' must name one file: a non-empty text without a slash, a backslash or a leading dot
    """
    if not isinstance(name, str) or not name or name.startswith(".") or {"/", "\\"} & set(name):
        raise ValueError(
            f"{what}={name!r} must name one file: a non-empty text without a slash, a "
            "backslash or a leading dot"
        )
    return name
