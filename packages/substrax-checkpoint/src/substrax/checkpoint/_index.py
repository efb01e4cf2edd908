"""An in-memory index of every step's epoch and metrics, cached in one JSON file at the root.

The index answers ``best_step`` without reading any step's metadata. The file is only a cache:
at open it is reconciled with the step directories, so a crash between a step's commit and the
index write (or a deletion) can never make the index lie.
"""

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ._retention import Mode


INDEX_FILE: Final = "substrax_index.json"
_INDEX_FORMAT: Final = "substrax-checkpoint-index"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One step's epoch and metrics."""

    epoch: int | None
    metrics: Mapping[str, float]


@dataclass(slots=True)
class StepIndex:
    """Epoch and metrics per step, with ``best_step`` answered from a per-metric cache."""

    entries: dict[int, IndexEntry] = field(default_factory=dict[int, IndexEntry])
    _best: dict[tuple[str, Mode], int | None] = field(
        default_factory=dict[tuple[str, Mode], int | None]
    )

    def add(self, step: int, entry: IndexEntry) -> None:
        """Record ``step``; the cached best of each metric it carries is updated in O(1)."""
        self.remove(step)
        self.entries[step] = entry
        for (name, mode), best in list(self._best.items()):
            value = entry.metrics.get(name)
            if value is None or math.isnan(value):
                continue
            if best is None or _better(value, self.entries[best].metrics[name], mode):
                self._best[name, mode] = step

    def remove(self, step: int) -> None:
        """Forget ``step``; a cached best that named it is recomputed at the next query."""
        if self.entries.pop(step, None) is None:
            return
        for key, best in list(self._best.items()):
            if best == step:
                del self._best[key]

    def best_step(self, metric: str, mode: Mode) -> int | None:
        """The step with the best ``metric`` (the earliest on ties), or None when none has it."""
        key = (metric, mode)
        if key not in self._best:
            best: int | None = None
            for step in sorted(self.entries):
                value = self.entries[step].metrics.get(metric)
                if value is None or math.isnan(value):
                    continue
                if best is None or _better(value, self.entries[best].metrics[metric], mode):
                    best = step
            self._best[key] = best
        return self._best[key]

    def metrics(self) -> dict[int, Mapping[str, float]]:
        """Every step's metrics."""
        return {step: entry.metrics for step, entry in self.entries.items()}

    def write(self, root: Path) -> None:
        """Write the index atomically (a temporary file renamed over the old one)."""
        payload = {
            "format": _INDEX_FORMAT,
            "version": 1,
            "steps": {
                str(step): {"epoch": e.epoch, "metrics": dict(e.metrics)}
                for step, e in sorted(self.entries.items())
            },
        }
        target = root / INDEX_FILE
        temporary = root / f".{INDEX_FILE}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps(payload))
        temporary.replace(target)

    @classmethod
    def load(
        cls, root: Path, steps: Iterable[int], read_entry: Callable[[int], IndexEntry | None]
    ) -> "StepIndex":
        """Read the cached index and reconcile it with ``steps`` (the committed step directories).

        Steps the cache lacks are read with ``read_entry``; cached steps no longer on disk are
        dropped.
        """
        cached: dict[int, IndexEntry] = {}
        try:
            raw: Any = json.loads((root / INDEX_FILE).read_text())
            if raw.get("format") == _INDEX_FORMAT:
                for key, value in raw["steps"].items():
                    metrics = {str(k): float(v) for k, v in value["metrics"].items()}
                    cached[int(key)] = IndexEntry(epoch=value["epoch"], metrics=metrics)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            cached = {}
        index = cls()
        for step in steps:
            entry = cached.get(step)
            if entry is None:
                entry = read_entry(step)
            if entry is not None:
                index.entries[step] = entry
        return index


def _better(value: float, best: float, mode: Mode) -> bool:
    return value < best if mode == "min" else value > best
