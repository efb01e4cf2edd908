"""Every step's epoch and metrics in memory (``best_step`` reads no step's metadata).

They are cached in one JSON file at the root, each with the identity of the record it was read
from (inode, mtime, size), and reconciled with the step directories at open: a step whose
record is another (a step directory put back from a backup or another run) is read again.
"""

import json
import math
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from substrax.support import Mode, write_atomically

from ._lock import is_primary
from ._metadata import read_step
from ._steps import scan_steps


INDEX_FILE: Final = "substrax_index.json"
type Record = tuple[int, int, int]  # a step's metadata record: inode, mtime (ns), size
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

    def _beats(self, step: int, best: int | None, metric: str, mode: Mode) -> bool:
        """Whether ``step``'s ``metric`` ranks above ``best``'s (a NaN or infinity never ranks)."""
        value = self.entries[step].metrics.get(metric)
        if value is None or not math.isfinite(value):
            return False
        return best is None or mode.better(value, self.entries[best].metrics[metric])

    def add(self, step: int, entry: IndexEntry) -> None:
        """Record ``step``; the cached best of each metric it carries is updated in O(1)."""
        self.remove(step)
        self.entries[step] = entry
        for (name, mode), best in list(self._best.items()):
            if self._beats(step, best, name, mode):
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
                if self._beats(step, best, metric, mode):
                    best = step
            self._best[key] = best
        return self._best[key]

    def metrics(self) -> dict[int, Mapping[str, float]]:
        """Every step's metrics."""
        return {step: entry.metrics for step, entry in self.entries.items()}

    @staticmethod
    def payload(entries: Mapping[int, IndexEntry], records: Mapping[int, Record]) -> str:
        """The index file's text: ``entries``, each with its step's record identity."""
        steps = {
            str(step): {"epoch": e.epoch, "metrics": dict(e.metrics), "record": records.get(step)}
            for step, e in sorted(entries.items())
        }
        return json.dumps({"format": _INDEX_FORMAT, "version": 1, "steps": steps})

    @classmethod
    def load(
        cls,
        root: Path,
        held: Mapping[int, Record | None],
        read_entry: Callable[[int], IndexEntry | None],
    ) -> "StepIndex":
        """The cached index reconciled with the ``held`` steps and their records' identities.

        A step the cache lacks, or cached from another record, is read with ``read_entry``.
        """
        cached: dict[int, IndexEntry] = {}
        try:
            raw: Any = json.loads((root / INDEX_FILE).read_text())
            if raw.get("format") == _INDEX_FORMAT:
                for key, value in raw["steps"].items():
                    step, record = int(key), held.get(int(key))
                    if record is not None and tuple(value.get("record") or ()) == record:
                        metrics = {str(k): float(v) for k, v in value["metrics"].items()}
                        cached[step] = IndexEntry(epoch=value["epoch"], metrics=metrics)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            cached = {}
        index = cls()
        for step in held:
            if (entry := cached.get(step) or read_entry(step)) is not None:
                index.entries[step] = entry
        return index


class IndexBook:
    """A store's :class:`StepIndex`: loaded at first use, followed by readers, kept by the writer.

    A ``read_only`` book reloads the index whenever a committed step, or its record, changed
    (a step overwritten keeps its number, not its record). A writer's
    is updated at every save, deletion and failed write; process 0 persists it with ``run`` (in
    order, on another thread) while it holds the directory's lock (``intact``).
    """

    def __init__(
        self,
        directory: Path,
        *,
        read_only: bool,
        steps: Callable[[], list[int]],
        run: Callable[[Callable[[], None]], Future[None]],
        intact: Callable[[], bool],
    ) -> None:
        self._directory = directory
        self._intact = intact
        self._read_only = read_only
        self._steps = steps
        self._run = run
        self._written: Future[None] | None = None  # the latest write left running
        self._index: StepIndex | None = None
        self._loaded: tuple[tuple[int, tuple[int, int, int]], ...] | None = None  # a reader's
        # index reflects these steps, each as its record was (an overwrite changes the record)

    def follow(self) -> None:
        """The store only reads from now on: the index follows the directory, never written."""
        self._read_only, self._index, self._written = True, None, None

    def index(self) -> StepIndex:
        """The index, loaded (or, for a reader, reloaded when a step or its record changed)."""
        if self._read_only:
            held = scan_steps(self._directory).steps
            seen = tuple(held.items())
            if self._index is None or seen != self._loaded:
                self._index = StepIndex.load(self._directory, held, self.read_entry)
                self._loaded = seen
        elif self._index is None:
            records = scan_steps(self._directory).steps
            held = {step: records.get(step) for step in self._steps()}
            self._index = StepIndex.load(self._directory, held, self.read_entry)
        return self._index

    def read_entry(self, step: int) -> IndexEntry | None:
        """``step``'s entry read from its metadata record (None when it cannot be read)."""
        try:
            record = read_step(self._directory / str(step), step)
        except (OSError, ValueError):
            return None
        return IndexEntry(epoch=record.metadata.epoch, metrics=dict(record.metadata.metrics))

    def metrics(self) -> dict[int, Mapping[str, float]]:
        """Every indexed step's metrics."""
        return self.index().metrics()

    def best_step(self, metric: str, mode: Mode) -> int | None:
        """The indexed step with the best ``metric``, or None."""
        return self.index().best_step(metric, mode)

    def saving(self, step: int, entry: IndexEntry) -> None:
        """``step`` is being written with ``entry`` (replacing any entry it had)."""
        self.index().add(step, entry)

    def evict(self, steps: Iterable[int]) -> None:
        """``steps`` leave the store (retention's choice, a deletion, a refused write)."""
        index = self.index()
        for step in steps:
            index.remove(step)

    def deleted(self, step: int) -> None:
        """``step`` was deleted: drop it and persist the index."""
        self.evict([step])
        self.write()

    def failed(self, step: int, held: Callable[[], Iterable[int]]) -> None:
        """Writing ``step`` failed: drop it, re-read what the store ``held`` really, persist."""
        if self._index is not None:
            self._index.remove(step)
            for step_held in held():
                if step_held not in self._index.entries and (entry := self.read_entry(step_held)):
                    self._index.add(step_held, entry)
        self.write()

    def committed(self, held: Iterable[int]) -> None:
        """A write committed: drop the steps retention deleted (not in ``held``); persist in the background."""
        if self._index is None:
            return
        kept = set(held)
        for step in [s for s in self._index.entries if s not in kept]:
            self._index.remove(step)
        self.write(wait=False)

    def write(self, *, wait: bool = True) -> None:
        """Persist the index as of now (process 0 of a writer only, while it holds the root)."""
        if self._index is None or self._read_only or not is_primary():
            return
        if not self._directory.is_dir():
            return
        directory, entries, intact = self._directory, dict(self._index.entries), self._intact

        def persist() -> None:
            if directory.is_dir() and intact():  # a store removed meanwhile gets no index
                text = StepIndex.payload(entries, scan_steps(directory).steps)
                write_atomically(directory / INDEX_FILE, text)

        self._written = self._run(persist)
        if wait:
            self.flush()

    def flush(self) -> None:
        """Wait for the index write left running, raising its error (if any)."""
        written, self._written = self._written, None
        if written is not None:
            written.result()
