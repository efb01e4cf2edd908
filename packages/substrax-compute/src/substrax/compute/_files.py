"""Copying a run's outputs without leaving their root, and following a growing log file."""

import codecs
import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ._errors import OutputPathError


POLL_SECONDS = 0.1
READ_BYTES = 1 << 20
"""The most :func:`follow_lines` reads of a log at once."""
LINE_CHARS = 64 * 1024
"""The longest line :func:`follow_lines` yields: a longer one comes in parts."""


def inside(root: Path, relative: str) -> Path:
    """``root / relative``, refused when it would resolve outside ``root``.

    Raises:
        OutputPathError: ``relative`` is absolute or climbs out with ``..`` or a link.

    Example:
        >>> from pathlib import Path
        >>> from substrax.compute._files import inside
        >>> inside(Path("/r"), "a/b.txt").as_posix()
        '/r/a/b.txt'
    """
    base = root.resolve()
    target = (base / relative).resolve()
    if not target.is_relative_to(base):
        raise OutputPathError(target, base)
    return target


def copy_atomically(source: Path, destination: Path) -> None:
    """Copy ``source`` (data and metadata) over ``destination`` in one step.

    The copy goes to a temporary file beside ``destination``, is fsync'd and renamed over it,
    so a reader, or a kill -9 mid-copy, sees the old file or the new one, never a part. On any
    error the temporary file is removed and ``destination`` is left as it was.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.compute._files import copy_atomically
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     source, copy = Path(directory) / "a.json", Path(directory) / "b.json"
        ...     _ = source.write_text("{}")
        ...     copy_atomically(source, copy)
        ...     copy.read_text()
        '{}'
    """
    temporary = destination.with_name(f".{destination.name}.{secrets.token_hex(6)}.tmp")
    try:
        shutil.copy2(source, temporary)
        with temporary.open("rb+") as file:
            os.fsync(file.fileno())
        temporary.replace(destination)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename durable where directories open
        fd = os.open(destination.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def copy_outputs(source: Path, target: Path) -> None:
    """Copy the regular files under ``source`` to ``target`` atomically; links are never followed."""
    target.mkdir(parents=True, exist_ok=True)
    if not source.is_dir():
        return
    base = source.resolve()
    for path in sorted(base.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        relative = path.relative_to(base)
        destination = inside(target, relative.as_posix())
        destination.parent.mkdir(parents=True, exist_ok=True)
        copy_atomically(path, destination)


def follow_lines(path: Path, *, done: Callable[[], bool] | None) -> Iterator[str]:
    """Yield the lines of ``path`` (without newlines); with ``done``, keep reading until it says so.

    The file may not exist yet; a partial last line is held back until its newline arrives or
    the run is done. It is read as UTF-8 whatever the locale (the worker writes its log so),
    ``READ_BYTES`` at a time, and a line longer than ``LINE_CHARS`` comes in parts of that
    length: output without newlines is never held whole.
    """
    position = 0
    pending = ""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # as the worker writes it
    while True:
        finished = done() if done is not None else True
        if path.is_file():
            with path.open("rb") as file:
                file.seek(position)
                while chunk := file.read(READ_BYTES):
                    position += len(chunk)
                    *lines, pending = (pending + decoder.decode(chunk)).split("\n")
                    for line in lines:
                        yield from (line[i : i + LINE_CHARS] for i in _starts(line))
                    while len(pending) > LINE_CHARS:
                        yield pending[:LINE_CHARS]
                        pending = pending[LINE_CHARS:]
        if finished:
            pending += decoder.decode(b"", final=True)
            if pending:
                yield pending
            return
        time.sleep(POLL_SECONDS)


def _starts(line: str) -> range:
    """Where each part of ``line`` starts, ``LINE_CHARS`` apart (an empty line is one part)."""
    return range(0, max(len(line), 1), LINE_CHARS)
