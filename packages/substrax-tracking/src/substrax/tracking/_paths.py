"""Where a logger writes when no directory is given: the artifacts policy, never the working tree."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ._errors import LogDirNotWritableError


__all__ = ["ensure_writable_dir", "resolve_log_dir"]


def resolve_log_dir(name: str, log_dir: str | os.PathLike[str] | None) -> Path:
    """``log_dir`` resolved; when None, ``$AVITAI_OUTPUT_DIR/<name>`` or a per-run temporary directory."""
    if log_dir is not None:
        return Path(log_dir).resolve()
    from substrax.artifacts import resolve_output_dir  # noqa: PLC0415

    return Path(resolve_output_dir(name).path)


def ensure_writable_dir(path: Path, logger: str) -> None:
    """Create the directory ``path`` if needed; LogDirNotWritableError if this process cannot write in it."""
    if path.exists() and not path.is_dir():
        raise LogDirNotWritableError(logger, path, "a file is in its place")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # what the OS allows, whatever the mode bits say
            pass
    except OSError as error:
        raise LogDirNotWritableError(logger, path, error.strerror or str(error)) from error
