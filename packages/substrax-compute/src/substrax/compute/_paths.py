"""Directories the CLI writes to, refused up front when a plain file stands in the way."""

import os
from pathlib import Path
from typing import cast

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


def check_state_dir(setting: object) -> str | os.PathLike[str] | None:
    """A backend's ``state_dir`` setting when it is a path (a str or a Path) or None, else TypeError.

    Example:
        >>> from substrax.compute._paths import check_state_dir
        >>> check_state_dir(3)
        Traceback (most recent call last):
        ...
        TypeError: setting=3 must be a state directory (a str or a Path), or None for the default, not int
    """
    if setting is not None and not isinstance(setting, (str, os.PathLike)):
        raise TypeError(
            f"setting={setting!r:.80} must be a state directory (a str or a Path), or None for "
            f"the default, not {type(setting).__name__}"
        )
    return cast("str | os.PathLike[str] | None", setting)
