"""Directories the CLI writes to, refused up front when a plain file stands in the way."""

import os
from pathlib import Path
from typing import cast

from substrax.support import UsageError

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


def require_writable(path: Path, *, what: str, fix: str) -> Path:
    """``path`` when it is, or can be made, a directory this user may write to (nothing is made).

    Checked before a run is submitted: the run's record and outputs come after it started.

    Raises:
        DirectoryPathError: ``path`` or one of its parents is an existing non-directory.
        UsageError: The directory, or the nearest existing parent that would hold it, is on a
            read-only file system or not writable by this user; the message names it and ends
            with ``fix``.
    """
    require_directory(path, what=what, fix=fix)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "is on a read-only file system" if read_only else "is not writable by this user"
        where = f"{what} {path}" if existing == path else f"{what} {path} can't be made: {existing}"
        raise UsageError(f"{where} {why}; {fix}")
    return path


def require_text(value: str, *, what: str, fix: str) -> str:
    """``value`` unless it is empty or blank: an unset shell variable, which must mean nothing.

    ``Path("")`` is the working directory and an empty run id matched every run, so a script's
    ``status "$RUN"`` with ``RUN`` unset passed.

    Raises:
        UsageError: ``value`` is empty or blank; the message names ``what`` and ends with ``fix``.

    Example:
        >>> from substrax.compute._paths import require_text
        >>> require_text(" ", what="--into", fix="pass a directory")
        Traceback (most recent call last):
        ...
        substrax.support.UsageError: --into ' ' is empty; pass a directory
    """
    if not value.strip():
        raise UsageError(f"{what} {value!r} is empty; {fix}")
    return value


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
