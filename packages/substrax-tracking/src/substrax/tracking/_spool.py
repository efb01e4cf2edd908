"""The spool: records a remote backend could not take, kept in a local JSONL file until replayed."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

from ._records import Record


__all__ = [
    "BadLine",
    "Sink",
    "SpoolContent",
    "SpoolFile",
    "SpoolNotFoundError",
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


_PATH_LOCKS: dict[Path, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    """One lock per spool path in this process, shared by every :class:`SpoolFile` of that path."""
    key = path.absolute()
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(key, threading.Lock())


class SpoolNotFoundError(FileNotFoundError):
    """A spool file to replay does not exist.

    Attributes:
        path: the path that was given.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(
            f"spool file {str(path)!r} does not exist; pass the <log_dir>/<name>.spool.jsonl path "
            "that the logger's warning named"
        )


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
class SpoolContent:
    """What :meth:`SpoolFile.read_content` found.

    Attributes:
        lines: the intact lines, parsed, with their line numbers (from 1).
        bad: the lines that are not records.
        size: how many bytes were read (for :meth:`SpoolFile.rewrite`).
    """

    lines: list[tuple[int, dict[str, Any]]]
    bad: list[BadLine]
    size: int


def _check_line(text: str) -> dict[str, Any]:
    line = json.loads(text)
    if not isinstance(line, dict):
        raise ValueError(f"a JSON {type(line).__name__}, not an object")  # noqa: TRY004
    checked = cast("dict[str, Any]", line)
    unknown = set(checked) - {"target", "record", "error"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    target = checked.get("target")
    if not isinstance(target, dict) or "backend" not in target:
        raise ValueError("no target naming a backend")
    record = checked.get("record")
    if not isinstance(record, dict):
        raise ValueError("no record")  # noqa: TRY004
    Record.from_json(cast("dict[str, Any]", record))
    return checked


class SpoolFile:
    """An append-only JSONL file of ``{"target", "record"[, "error"]}`` lines.

    Every :class:`SpoolFile` of one path in a process shares one lock, so that a rewrite by a
    replay never drops a line that a running logger appends.

    Args:
        path: the file (its directory is created on the first write).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = _lock_for(self.path)

    def append(
        self, target: Mapping[str, Any], records: Iterable[Record], error: str | None = None
    ) -> int:
        """Append materialized ``records`` for ``target``; return how many were written."""
        lines: list[str] = []
        for record in records:
            line: dict[str, Any] = {"target": dict(target), "record": record.to_json()}
            if error is not None:
                line["error"] = error
            lines.append(json.dumps(line) + "\n")
        if lines:
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as file:
                    file.writelines(lines)
                    file.flush()
                    os.fsync(file.fileno())
        return len(lines)

    def read_content(self) -> SpoolContent:
        """The intact lines, the bad ones, and the size read.

        Raises:
            SpoolNotFoundError: the file does not exist.
        """
        with self._lock:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                raise SpoolNotFoundError(self.path) from None
        lines: list[tuple[int, dict[str, Any]]] = []
        bad: list[BadLine] = []
        for number, text in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if not text.strip():
                continue
            try:
                lines.append((number, _check_line(text)))
            except (ValueError, KeyError, TypeError) as error:  # JSONDecodeError is a ValueError
                bad.append(BadLine(number=number, text=text, reason=str(error)))
        return SpoolContent(lines=lines, bad=bad, size=len(data))

    def read(self) -> list[dict[str, Any]]:
        """Every intact line, parsed (an empty list if there is no file)."""
        if not self.path.exists():
            return []
        return [line for _, line in self.read_content().lines]

    def rewrite(self, lines: list[dict[str, Any]], read_size: int | None = None) -> None:
        """Replace the first ``read_size`` bytes (all, if None) with ``lines``; delete an empty file.

        Lines appended after the read (by a logger still running) are kept.
        """
        with self._lock:
            tail = b""
            if read_size is not None and self.path.exists():
                with self.path.open("rb") as file:
                    file.seek(read_size)
                    tail = file.read()
            content = "".join(json.dumps(line) + "\n" for line in lines).encode("utf-8") + tail
            if not content:
                self.path.unlink(missing_ok=True)
                return
            tmp = self.path.with_name(self.path.name + ".tmp")
            with tmp.open("wb") as file:
                file.write(content)
                file.flush()
                os.fsync(file.fileno())
            tmp.replace(self.path)

    def set_aside(self, bad: list[BadLine]) -> Path:
        """Append ``bad`` lines to ``<spool>.bad`` (kept for a person to read) and return that path."""
        aside = self.path.with_name(self.path.name + ".bad")
        with self._lock, aside.open("a", encoding="utf-8") as file:
            file.writelines(f"{line.text}\n" for line in bad)
        return aside


def sink_factory(target: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], Sink]:
    """How to rebuild the sink that ``target`` (a spool line's target data) names.

    Raises:
        ValueError: no backend of that name is known.
    """
    backend = target.get("backend")
    if backend not in _FACTORIES:
        # The backends register themselves on import; import them for a fresh process.
        import importlib  # noqa: PLC0415

        for module in ("._mlflow", "._wandb"):
            importlib.import_module(module, __package__)
    if backend not in _FACTORIES:
        raise ValueError(
            f"spooled records name an unknown backend {backend!r}; known: {sorted(_FACTORIES)}"
        )
    return _FACTORIES[str(backend)]
