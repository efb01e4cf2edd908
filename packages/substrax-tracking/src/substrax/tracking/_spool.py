"""The spool: records a remote backend could not take, kept in a local JSONL file until replayed."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

from substrax.support import write_atomically

from ._errors import (
    NotARecordError,
    NotASpoolError,
    SpoolBusyError,
    SpoolNotFoundError,
    UnknownBackendError,
)
from ._records import Record


__all__ = [
    "BadLine",
    "Sink",
    "SpoolContent",
    "SpoolFile",
    "SpoolLine",
    "register_sink_factory",
    "sink_factory",
]


class Sink(Protocol):
    """Where a remote logger's records go: one run of one backend.

    ``deliver`` sends records (all of them, or raises); ``target`` is JSON data naming the run,
    enough for :func:`replay_spool` to build the sink again in another process.
    """

    def target(self) -> dict[str, Any]:
        """JSON data naming the backend (``"backend"``) and the run."""
        ...

    def deliver(self, records: list[Record]) -> None:
        """Send ``records`` in order; raise if any could not be delivered."""
        ...

    def is_permanent(self, error: BaseException) -> bool:
        """Whether ``error`` will not go away by retrying (a refused value, not a lost server)."""
        ...

    def finish(self) -> None:
        """End the run."""
        ...


_FACTORIES: dict[str, Callable[[Mapping[str, Any]], Sink]] = {}


def register_sink_factory(backend: str, factory: Callable[[Mapping[str, Any]], Sink]) -> None:
    """Register how to rebuild a sink for ``backend`` from its spooled ``target`` data."""
    _FACTORIES[backend] = factory


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BadLine:
    """A spool line that is not a record (cut short by a crash, edited by hand).

    Attributes:
        number: the line number, from 1.
        text: the line as read.
        reason: why it is not a record.
    """

    number: int
    text: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpoolLine:
    """An intact spool line.

    Attributes:
        number: the line number, from 1.
        text: the line as read (what :meth:`SpoolFile.remove` matches).
        data: the line, parsed: ``{"target", "record"[, "error"]}``.
    """

    number: int
    text: str
    data: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpoolContent:
    """What :meth:`SpoolFile.read_content` found.

    Attributes:
        lines: the intact lines.
        bad: the lines that are not records.
    """

    lines: list[SpoolLine]
    bad: list[BadLine]


def _check_line(text: str) -> dict[str, Any]:
    line = json.loads(text)
    if not isinstance(line, dict):
        raise NotARecordError(f"a JSON {type(line).__name__}, not an object")
    checked = cast("dict[str, Any]", line)
    unknown = set(checked) - {"target", "record", "error"}
    if unknown:
        raise NotARecordError(f"unknown fields {sorted(unknown)}")
    target = checked.get("target")
    if not isinstance(target, dict) or "backend" not in target:
        raise NotARecordError("no target naming a backend")
    record = checked.get("record")
    if not isinstance(record, dict):
        raise NotARecordError("no record")
    Record.from_json(cast("dict[str, Any]", record))
    return checked


def spool_line(target: Mapping[str, Any], record: Mapping[str, Any], error: str | None) -> str:
    """One spool line (without its newline) for a record's JSON data."""
    line: dict[str, Any] = {"target": dict(target), "record": dict(record)}
    if error is not None:
        line["error"] = error
    return json.dumps(line)


class _Held:
    """The lock of a spool file, held: :meth:`discard` removes the lock file (no spool left)."""

    def __init__(self, lock_path: Path) -> None:
        self.lock_path = lock_path
        self.discarded = False

    def discard(self) -> None:
        self.lock_path.unlink(missing_ok=True)
        self.discarded = True


class SpoolFile:
    """An append-only JSONL file of ``{"target", "record"}`` lines, shared safely between processes.

    Every change and every read holds an exclusive ``flock`` on ``<spool>.lock`` (removed with
    the spool), so a logger, a second process logging to the same spool and a
    ``python -m substrax.tracking replay`` can all work on one spool at once: a replay removes
    exactly the lines it delivered, and keeps every line appended meanwhile. Records a backend
    refused go to ``<spool>.refused`` with their error, lines that are not records to
    ``<spool>.bad``.

    Args:
        path: the file (its directory is created on the first write).

    Raises:
        NotASpoolError: ``path`` names no file (``""``, ``.``, ``/``: a directory).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.name in ("", ".", ".."):
            raise NotASpoolError(self.path, "a directory")
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.refused_path = self.path.with_name(self.path.name + ".refused")
        self.bad_path = self.path.with_name(self.path.name + ".bad")
        self.replay_lock_path = self.path.with_name(self.path.name + ".replay.lock")

    @contextlib.contextmanager
    def replaying(self, wait: float | None) -> Generator[int | None]:
        """Hold the spool for a whole replay: a second replay waits for the first.

        The lock is an exclusive ``flock`` on ``<spool>.replay.lock`` (holding the replaying
        process's pid, removed when the replay ends); loggers appending meanwhile take only the
        spool's own lock and are never held up. Yields the pid of the replay this one waited
        for (None when it did not wait).

        Args:
            wait: the most seconds to wait for another replay (None: as long as it takes).

        Raises:
            SpoolBusyError: another replay still held the spool after ``wait`` seconds.
        """
        deadline = None if wait is None else time.monotonic() + wait
        waited_for: int | None = None
        while True:
            try:
                fd = os.open(self.replay_lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # no directory: no spool
                raise SpoolNotFoundError(self.path) from None
            try:
                if not _try_flock(fd):
                    waited_for = _pid_in(fd) or waited_for
                    if not _flock_by(fd, deadline):
                        raise SpoolBusyError(self.path, _pid_in(fd))
                try:  # the lock file may have been removed (and made again) while we waited
                    current = self.replay_lock_path.stat().st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    current = False
                if current:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, str(os.getpid()).encode(), 0)
                    try:
                        yield waited_for
                    finally:
                        self.replay_lock_path.unlink(missing_ok=True)
                    return
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _locked(self) -> Generator[_Held]:
        """Hold the spool's lock (between processes and threads alike: a fresh ``flock`` each time)."""
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:  # the lock file may have been removed (and made again) while we waited
                    current = self.lock_path.stat().st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    current = False
                if current:
                    yield _Held(self.lock_path)
                    return
            finally:
                os.close(fd)

    def check_regular(self) -> None:
        """Raise unless the spool is a regular file.

        Raises:
            SpoolNotFoundError: it does not exist.
            NotASpoolError: it is a directory or a device.
        """
        self._check_regular()

    def _check_regular(self) -> None:
        try:
            mode = self.path.stat().st_mode
        except FileNotFoundError:
            raise SpoolNotFoundError(self.path) from None
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise NotASpoolError(self.path, kind)

    def append(
        self, target: Mapping[str, Any], records: Iterable[Record], error: str | None = None
    ) -> int:
        """Append materialized ``records`` for ``target`` (with an ``error``: to ``<spool>.refused``).

        Returns:
            how many were written.
        """
        lines = [spool_line(target, record.to_json(), error) for record in records]
        if lines:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._locked():
                _append_lines(self.refused_path if error is not None else self.path, lines)
        return len(lines)

    def read_content(self, limit: int | None = None) -> SpoolContent:
        """The intact lines and the bad ones (up to the ``limit``-th intact line).

        Raises:
            SpoolNotFoundError: the file does not exist.
            NotASpoolError: the path is a directory or a device, or no line of it is a record
                (nothing is changed).
        """
        self._check_regular()
        with self._locked() as held:
            try:
                self._check_regular()
                data = self.path.read_bytes()
            except (SpoolNotFoundError, NotASpoolError):
                held.discard()
                raise
            if not data.strip():  # nothing to replay: the file is left as it is
                held.discard()
                return SpoolContent(lines=[], bad=[])
        lines: list[SpoolLine] = []
        bad: list[BadLine] = []
        for number, text in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if limit is not None and len(lines) >= limit:
                break
            if not text.strip():
                continue
            try:
                lines.append(SpoolLine(number=number, text=text, data=_check_line(text)))
            except (ValueError, KeyError, TypeError) as error:  # JSONDecodeError is a ValueError
                bad.append(BadLine(number=number, text=text, reason=str(error)))
        if bad and not lines and not any(b.text.startswith('{"target"') for b in bad):
            with self._locked() as held:  # made by this call: nothing else locks a file like this
                held.discard()
            first = bad[0]
            raise NotASpoolError(
                self.path, f"no line is a spool record; line {first.number}: {first.reason}"
            )
        return SpoolContent(lines=lines, bad=bad)

    def count(self, target: Mapping[str, Any]) -> int:
        """How many lines of the spool are ``target``'s (0 without a file), without parsing them."""
        prefix = ('{"target": ' + json.dumps(dict(target)) + ",").encode()
        if not self.path.is_file():
            return 0
        with self._locked() as held:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                held.discard()
                return 0
        return data.count(b"\n" + prefix) + data.startswith(prefix)

    def remove(
        self, texts: Iterable[str], *, refused: Iterable[str] = (), bad: Iterable[str] = ()
    ) -> None:
        """Remove the lines ``texts`` (once each) from the spool, keeping every other line.

        ``refused`` lines (with their error) are first added to ``<spool>.refused`` and ``bad``
        lines to ``<spool>.bad``. A spool left empty is deleted.
        """
        refused, bad = list(refused), list(bad)
        gone = collections.Counter(texts)
        with self._locked() as held:
            if refused:
                _append_lines(self.refused_path, refused)
            if bad:
                _append_lines(self.bad_path, bad)
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                held.discard()
                return
            kept: list[str] = []
            for text in data.decode("utf-8", errors="replace").splitlines():
                if gone[text] > 0:
                    gone[text] -= 1
                elif text.strip():
                    kept.append(text)
            if not kept:
                self.path.unlink(missing_ok=True)
                held.discard()
                return
            write_atomically(self.path, "".join(f"{text}\n" for text in kept))

    def restore_refused(self) -> int:
        """Move the records of ``<spool>.refused`` back into the spool, without their errors.

        Returns:
            how many were moved.

        Raises:
            NotASpoolError: the spool path is a directory or a device.
        """
        if self.path.exists():
            self._check_regular()
        if not self.refused_path.is_file():
            return 0
        with self._locked():
            try:
                data = self.refused_path.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                return 0
            lines: list[str] = []
            for text in data.splitlines():
                try:
                    line = _check_line(text)
                except (ValueError, KeyError, TypeError):
                    continue
                line.pop("error", None)
                lines.append(json.dumps(line))
            _append_lines(self.path, lines)
            self.refused_path.unlink()
        return len(lines)


def _try_flock(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` if no other holder has one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _flock_by(fd: int, deadline: float | None) -> bool:
    """Take an exclusive ``flock`` on ``fd``, waiting until ``deadline`` (None: for ever)."""
    if deadline is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    while not _try_flock(fd):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _pid_in(fd: int) -> int | None:
    """The pid a replay lock file holds (None when empty or unreadable)."""
    text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    return int(text) if text.isdigit() else None


def _append_lines(path: Path, lines: list[str]) -> None:
    """Append ``lines`` with one write and an fsync (the caller holds the spool's lock).

    All or nothing: a write that fails part way (a full disk) is cut off again, so the file
    never ends in a line cut short that the next append would run into.

    Raises:
        OSError: the lines could not be written (the file is as it was).
    """
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def sink_factory(target: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], Sink]:
    """How to rebuild the sink that ``target`` (a spool line's target data) names.

    The returned factory raises ``NotARecordError`` for a target that lacks a field its
    backend needs (such a line is set aside as a bad line, never retried).

    Raises:
        UnknownBackendError: no backend of that name is known (a ``ValueError``).
    """
    backend = target.get("backend")
    if backend not in _FACTORIES:
        # The backends register themselves on import; import them for a fresh process.
        import importlib  # noqa: PLC0415

        for module in ("._mlflow", "._wandb"):
            importlib.import_module(module, __package__)
    if backend not in _FACTORIES:
        raise UnknownBackendError(backend, sorted(_FACTORIES))
    factory = _FACTORIES[str(backend)]

    def build(target: Mapping[str, Any]) -> Sink:
        try:
            return factory(target)
        except KeyError as error:  # the target lacks a field its backend needs: not a record
            raise NotARecordError(
                f"its {backend} target has no {error.args[0]!r} (a line written by hand, or "
                "damaged)"
            ) from None

    return build
