"""Writing a file so that no reader, and no crash, ever sees it half-written."""

import contextlib
import os
import secrets
import stat
from pathlib import Path


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories can't be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows opens no directories
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary_beside(target: Path) -> tuple[int, Path]:
    """A new file beside ``target``, created as ``open`` creates one (its mode the umask's)."""
    while True:
        candidate = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), candidate
        except FileExistsError:
            continue


def write_atomically(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Replace ``path`` with ``data`` in one step: the old content or the new, never a part.

    The bytes go to a temporary file beside ``path`` (same directory, so the rename stays on one
    file system), which is flushed and fsync'd, renamed over ``path``, and the directory is
    fsync'd so the rename survives a power cut. A replaced file keeps its permissions; a new one
    gets those ``open`` would give it (the umask's). The parent directory is created if missing. On
    any error the temporary file is removed and ``path`` is left as it was. Text is UTF-8.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.support import write_atomically
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     target = Path(directory) / "state.json"
        ...     write_atomically(target, '{"step": 1}')
        ...     target.read_text()
        '{"step": 1}'
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, temporary = _temporary_beside(target)
    try:
        with os.fdopen(fd, "wb") as file:
            with contextlib.suppress(FileNotFoundError):  # a replaced file keeps its permissions
                os.fchmod(file.fileno(), stat.S_IMODE(target.stat().st_mode))
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_directory(target.parent)
