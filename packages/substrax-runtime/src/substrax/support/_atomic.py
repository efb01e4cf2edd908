"""Writing a file so that no reader, and no crash, ever sees it half-written."""

import contextlib
import functools
import hashlib
import os
import secrets
import socket
import stat
import string
import time
from pathlib import Path


# A temporary file is named ".<target>.<12 hex digits>.tmp", the length other parts budget for
# (a tracking log's longest name, the checkpoint's leftover pattern): 6 digits of the writer's
# process id, 4 of its host name's hash, 2 random ones. A later write of the same target removes
# one whose writer is gone, so that writers killed mid-write leave no litter that accumulates.
_DIGITS = 12
_PID_DIGITS = 6
_UNKNOWN_PID = 16**_PID_DIGITS - 1  # a process id too large to write: never taken for gone
_STALE_AFTER = 60.0  # seconds a dead writer's temporary file stays untouched before it goes
_HEX = frozenset(string.hexdigits.lower())
_ATTEMPTS = 4096  # random names tried before giving up: 2 random digits give 256


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


@functools.cache
def _host_tag() -> str:
    """4 hex digits of this host's name: a process id is only looked up on its own host."""
    return hashlib.blake2b(socket.gethostname().encode(), digest_size=2).hexdigest()


def _writer_tag(pid: int) -> str:
    """The first 10 of a temporary file's 12 digits: who writes it."""
    return f"{min(pid, _UNKNOWN_PID):0{_PID_DIGITS}x}{_host_tag()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: is there such a process? (sends nothing)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _remove_stale_temporaries(target: Path) -> None:
    """Remove ``target``'s temporary files left by writers of this host that are gone.

    Only files untouched for ``_STALE_AFTER`` seconds whose writer's process id names no
    process; any error leaves the file (another writer may be removing it too).
    """
    if os.name == "nt":  # os.kill(pid, 0) would end the process there, not look it up
        return
    prefix, host, now = f".{target.name}.", _host_tag(), time.time()
    try:
        entries = os.scandir(target.parent)
    except OSError:
        return
    with entries:
        for entry in entries:
            name = entry.name
            digits = name[len(prefix) : -len(".tmp")]
            if not (name.startswith(prefix) and name.endswith(".tmp") and len(digits) == _DIGITS):
                continue
            if not set(digits) <= _HEX or digits[_PID_DIGITS:-2] != host:
                continue
            pid = int(digits[:_PID_DIGITS], 16)
            if pid in (_UNKNOWN_PID, os.getpid()) or _alive(pid):
                continue
            with contextlib.suppress(OSError):
                status = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(status.st_mode) and now - status.st_mtime > _STALE_AFTER:
                    Path(entry.path).unlink()


def _temporary_beside(target: Path) -> tuple[int, Path]:
    """A new file beside ``target``, created as ``open`` creates one (its mode the umask's)."""
    writer = _writer_tag(os.getpid())
    for _ in range(_ATTEMPTS):
        candidate = target.with_name(f".{target.name}.{writer}{secrets.token_hex(1)}.tmp")
        try:
            return os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), candidate
        except FileExistsError:
            continue
    raise ValueError(
        f"cannot write {str(target)!r}: the 256 temporary names of this process beside it "
        f"(.{target.name}.{writer}??.tmp) are all taken; remove the leftover files"
    )


def write_atomically(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Replace ``path`` with ``data`` in one step: the old content or the new, never a part.

    The bytes go to a temporary file beside ``path`` (same directory, so the rename stays on one
    file system), which is flushed and fsync'd, renamed over ``path``, and the directory is
    fsync'd so the rename survives a power cut. A replaced file keeps its permissions; a new one
    gets those ``open`` would give it (the umask's). The parent directory is created if missing. On
    any error the temporary file is removed and ``path`` is left as it was. Text is UTF-8.

    Where ``path`` is a symbolic link (or lies under one), the file it resolves to
    (``os.path.realpath``) is replaced and the link is kept: the temporary file goes beside
    that file. A link to a path that does not exist yet creates it.

    The temporary file's name, ``.<name>.<12 hex digits>.tmp``, holds the writer's process id
    and host: a writer killed mid-write (``kill -9``) leaves its temporary file behind, and a
    later write of the same ``path`` removes it once that process is gone and the file has sat
    untouched for a minute (not on Windows), so such files do not pile up.

    Raises:
        ValueError: ``path`` is empty (``""`` names no file).
        OSError: The file or its directory cannot be written.

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
    if not os.fspath(path):  # realpath("") is the working directory
        raise ValueError(f"write_atomically: path={path!r} names no file; pass the file's path")
    target = Path(os.path.realpath(path))  # through a link: replace its target, keep the link
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    _remove_stale_temporaries(target)
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
