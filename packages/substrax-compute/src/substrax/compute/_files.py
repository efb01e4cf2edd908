"""Copying a run's outputs without leaving their root, and following a growing log file."""

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ._errors import OutputPathError


POLL_SECONDS = 0.1


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


def copy_outputs(source: Path, target: Path) -> None:
    """Copy the regular files under ``source`` to ``target``; links are never followed."""
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
        shutil.copy2(path, destination)


def follow_lines(path: Path, *, done: Callable[[], bool] | None) -> Iterator[str]:
    """Yield the lines of ``path`` (without newlines); with ``done``, keep reading until it says so.

    The file may not exist yet; a partial last line is held back until its newline arrives or
    the run is done.
    """
    position = 0
    pending = ""
    while True:
        finished = done() if done is not None else True
        if path.is_file():
            with path.open(errors="replace") as file:
                file.seek(position)
                chunk = file.read()
                position = file.tell()
            pending += chunk
            *lines, pending = pending.split("\n")
            yield from lines
        if finished:
            if pending:
                yield pending
            return
        time.sleep(POLL_SECONDS)
