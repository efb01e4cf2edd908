"""The spool: records a remote backend could not take, kept in a local JSONL file until replayed."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ._records import Record


__all__ = ["ReplayResult", "Sink", "SpoolFile", "register_sink_factory", "replay_spool"]

_log = logging.getLogger("substrax.tracking")


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


class SpoolFile:
    """An append-only JSONL file of ``{"target", "record"[, "error"]}`` lines.

    Args:
        path: the file (its directory is created on the first write).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

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

    def read(self) -> list[dict[str, Any]]:
        """Every line, parsed."""
        return self.read_with_size()[0]

    def read_with_size(self) -> tuple[list[dict[str, Any]], int]:
        """Every line, parsed, and the file size they were read from (for :meth:`rewrite`)."""
        with self._lock:
            if not self.path.exists():
                return [], 0
            data = self.path.read_bytes()
        text = data.decode("utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()], len(data)

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
            tmp.write_bytes(content)
            tmp.replace(self.path)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """What a replay did.

    Attributes:
        delivered: records sent to their backend.
        remaining: records left in the spool (their backend is still unreachable or refused them).
    """

    delivered: int
    remaining: int


def _factory_for(target: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], Sink]:
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


def replay_spool(
    path: str | os.PathLike[str],
    *,
    sinks: Mapping[str, Sink] | None = None,
    include_refused: bool = False,
) -> ReplayResult:
    """Send the records of a spool file to their backends, keeping only those that still fail.

    Args:
        path: the spool file.
        sinks: sinks to use, keyed by ``json.dumps(target, sort_keys=True)``; the others are
            rebuilt from their target data (e.g. an MLflow tracking URI and run id).
        include_refused: also retry records that a backend refused (spooled with an error).

    Returns:
        How many records were delivered and how many remain.

    Example:
        >>> import tempfile, pathlib
        >>> replay_spool(pathlib.Path(tempfile.mkdtemp()) / "none.jsonl")
        ReplayResult(delivered=0, remaining=0)
    """
    spool = SpoolFile(path)
    lines, read_size = spool.read_with_size()
    built: dict[str, Sink] = dict(sinks or {})
    remaining: list[dict[str, Any]] = []
    delivered = 0
    failed_targets: set[str] = set()
    index = 0
    while index < len(lines):
        key = json.dumps(lines[index]["target"], sort_keys=True)
        group: list[dict[str, Any]] = []
        while index < len(lines) and json.dumps(lines[index]["target"], sort_keys=True) == key:
            group.append(lines[index])
            index += 1
        todo = [line for line in group if include_refused or "error" not in line]
        kept = [line for line in group if not (include_refused or "error" not in line)]
        if key in failed_targets or not todo:
            remaining.extend(group)
            continue
        try:
            sink = built.get(key)
            if sink is None:
                sink = built[key] = _factory_for(group[0]["target"])(group[0]["target"])
            sink.deliver([Record.from_json(line["record"]) for line in todo])
        except Exception as error:
            _log.warning(
                "replay of %d spooled records to %s failed: %s",
                len(todo),
                group[0]["target"],
                error,
            )
            failed_targets.add(key)
            remaining.extend(group)
            continue
        delivered += len(todo)
        remaining.extend(kept)
    for key, sink in built.items():
        if sinks is None or key not in sinks:
            try:
                sink.finish()
            except Exception as error:
                _log.warning("could not finish the replayed run %s: %s", key, error)
    spool.rewrite(remaining, read_size)
    return ReplayResult(delivered=delivered, remaining=len(remaining))
