"""Where a logger writes: its directory, its spool file, and the file names made from its name."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from ._errors import InvalidLoggerNameError, InvalidSpoolPathError, LogDirNotWritableError


__all__ = [
    "check_logger_name",
    "check_spool_path",
    "ensure_writable_dir",
    "file_part",
    "log_stem",
    "resolve_log_dir",
    "safe_name",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
_DIGEST = 8  # hex digits of a name's hash in a file name

_FILE_NAME_MOST = 255  # the bytes of one path component (ext4, XFS, btrfs, APFS, tmpfs...)
# The longest file name made from a logger's name N: a FileLogger log rewritten on resume
# (write_atomically's ".<file>.<12 hex>.tmp"), with all_processes' suffix; the others are shorter.
_LONGEST_MADE = ".N.p999999.histograms.jsonl.0123456789ab.tmp"
_SPOOL_MADE = ".0123456789abcdef.live"  # the longest suffix of a file beside a spool
NAME_MOST = _FILE_NAME_MOST - len(_LONGEST_MADE) + 1
"""The most bytes (UTF-8) of a logger's name: every file named after it then fits."""


def check_logger_name(name: object) -> str:
    """``name``, refused if empty, not a str, or too long for the files named after it.

    Example:
        >>> from substrax.tracking._paths import check_logger_name
        >>> check_logger_name("demo")
        'demo'
        >>> check_logger_name("n" * 213)
        Traceback (most recent call last):
        ...
        substrax.tracking.InvalidLoggerNameError: name='nnnnnnnnnnnnnnnnnnn...nnnnnnnnn' (213 bytes) is too long: ...
    """
    if not isinstance(name, str) or not name:
        raise InvalidLoggerNameError(name)
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MOST:
        raise InvalidLoggerNameError(name, NAME_MOST)
    return name


def check_spool_path(path: Path, logger: str) -> None:
    """Refuse a spool path that is a directory, too long a name, or in a directory not writable.

    Creates its directory if missing.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.tracking._paths import check_spool_path
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     check_spool_path(Path(directory), "MLFlowLogger")
        Traceback (most recent call last):
        ...
        substrax.tracking.InvalidSpoolPathError: MLFlowLogger: spool_path='...' cannot be the spool file (it is a directory); ...
    """
    if path.is_dir():
        raise InvalidSpoolPathError(logger, path, "it is a directory")
    if len(os.fsencode(path.name) + _SPOOL_MADE.encode()) > _FILE_NAME_MOST:
        most = _FILE_NAME_MOST - len(_SPOOL_MADE)
        raise InvalidSpoolPathError(logger, path, f"its name is longer than {most} bytes")
    try:
        ensure_writable_dir(path.parent, logger)
    except LogDirNotWritableError as error:
        reason = f"its directory cannot be written: {error.reason}"
        raise InvalidSpoolPathError(logger, path, reason) from error


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


def safe_name(name: str) -> str:
    """``name`` made safe for a file name (``train/loss`` -> ``train_loss``).

    Example:
        >>> from substrax.tracking._paths import safe_name
        >>> safe_name("train/loss")
        'train_loss'
    """
    return _UNSAFE.sub("_", name).strip("_") or "_"


def file_part(name: str, room: int = 200) -> str:
    """``name`` in a file name: file-safe, at most ``room`` bytes, and never another name's.

    A name that is not file-safe (``"."`` and ``".."`` neither: they name a directory), or does
    not fit, is cut and gets 8 hex digits of its hash.

    Example:
        >>> from substrax.tracking._paths import file_part
        >>> file_part("loss"), file_part("a b") == file_part("a:b"), len(file_part("m" * 300))
        ('loss', False, 200)
        >>> file_part(".."), file_part(".")
        ('..-5ec1f7e7', '.-cdb4ee2a')
    """
    safe = safe_name(name)  # ASCII: a character is a byte
    if safe == name and len(safe) <= room and safe not in (".", ".."):
        return safe
    digest = hashlib.sha256(name.encode(errors="surrogatepass")).hexdigest()[:_DIGEST]
    return f"{safe[: max(room - _DIGEST - 1, 1)]}-{digest}"


def log_stem(name: str, process_index: int = 0, *, all_processes: bool = False) -> str:
    """The start of the name of every file a logger named ``name`` writes in its ``log_dir``.

    :func:`file_part` of ``name``, then ``.p<index>`` for a process other than 0 of ``all_processes``.

    Example:
        >>> from substrax.tracking._paths import log_stem
        >>> log_stem("run"), log_stem("run", 2, all_processes=True), log_stem("lr=0.1/seed=0")
        ('run', 'run.p2', 'lr_0.1_seed_0-4b4ba0b8')
    """
    suffix = f".p{process_index}" if all_processes and process_index else ""
    return file_part(name, NAME_MOST) + suffix
