"""replay_spool: send a spool file's records to their backends, within a time limit."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._records import Record
from ._spool import Sink, SpoolFile, sink_factory


__all__ = ["ReplayResult", "replay_spool", "target_key"]

_log = logging.getLogger("substrax.tracking")

_CHUNK = 1000


def target_key(target: Mapping[str, Any]) -> str:
    """The key that groups spool lines by their target (``json.dumps`` with sorted keys).

    Example:
        >>> target_key({"run": "r1", "backend": "mlflow"})
        '{"backend": "mlflow", "run": "r1"}'
    """
    return json.dumps(target, sort_keys=True)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """What a replay did.

    Attributes:
        delivered: records sent to their backend (and removed from the spool).
        remaining: records left in the spool (their backend is still unreachable, refused
            them, or the time ran out).
        bad_lines: the line numbers (from 1) of lines that are not records, moved to
            ``<spool>.bad``.
        timed_out: the time limit ran out before every backend answered.
        bad_file: where the bad lines went.
        bad_reasons: why each bad line is not a record.
    """

    delivered: int
    remaining: int
    bad_lines: tuple[int, ...] = ()
    timed_out: bool = False
    bad_file: Path | None = dataclasses.field(default=None, repr=False)
    bad_reasons: tuple[str, ...] = dataclasses.field(default=(), repr=False)

    def describe_bad_lines(self, limit: int = 10) -> str:
        """The bad lines as ``line N: reason; ...`` (at most ``limit``), and where they went.

        Example:
            >>> ReplayResult(delivered=0, remaining=0, bad_lines=(3,), bad_reasons=("cut",)).describe_bad_lines()
            'line 3: cut'
        """
        shown = "; ".join(
            f"line {number}: {reason}"
            for number, reason in list(zip(self.bad_lines, self.bad_reasons, strict=True))[:limit]
        )
        more = f"; and {len(self.bad_lines) - limit} more" if len(self.bad_lines) > limit else ""
        where = f" (moved to {self.bad_file})" if self.bad_file is not None else ""
        return shown + more + where


class _Replay:
    """Delivers spool lines group by group from its own thread; :meth:`settle` ends it at any time."""

    def __init__(
        self,
        lines: list[dict[str, Any]],
        sinks: Mapping[str, Sink],
        *,
        include_refused: bool,
        only: str | None,
    ) -> None:
        self._lines = lines
        self._sinks = dict(sinks)
        self._given = set(sinks)
        self._include_refused = include_refused
        self._only = only
        self._lock = threading.Lock()
        self._delivered: set[int] = set()
        self._settled = False
        self._built: dict[str, Sink] = {}
        self.errors: dict[str, tuple[Mapping[str, Any], BaseException]] = {}

    def _groups(self) -> list[tuple[str, list[int]]]:
        groups: list[tuple[str, list[int]]] = []
        for index, line in enumerate(self._lines):
            key = target_key(line["target"])
            if groups and groups[-1][0] == key:
                groups[-1][1].append(index)
            else:
                groups.append((key, [index]))
        return groups

    def run(self) -> None:
        failed: set[str] = set()
        built = self._built
        for key, indexes in self._groups():
            todo = [i for i in indexes if self._include_refused or "error" not in self._lines[i]]
            if key in failed or not todo or (self._only is not None and key != self._only):
                continue
            target = self._lines[todo[0]]["target"]
            try:
                sink = self._sinks.get(key)
                if sink is None:
                    sink = self._sinks[key] = sink_factory(target)(target)
                    with self._lock:
                        built[key] = sink
                for start in range(0, len(todo), _CHUNK):
                    chunk = todo[start : start + _CHUNK]
                    sink.deliver([Record.from_json(self._lines[i]["record"]) for i in chunk])
                    with self._lock:
                        if self._settled:
                            return
                        self._delivered.update(chunk)
            except Exception as error:
                failed.add(key)
                with self._lock:
                    self.errors[key] = (target, error)
        for key, sink in built.items():
            if key in failed:
                continue
            try:
                sink.finish()
            except Exception as error:
                _log.warning("could not finish the replayed run %s: %s", key, error)

    def failures(self) -> dict[str, tuple[Mapping[str, Any], BaseException]]:
        """The error of each target that failed so far."""
        with self._lock:
            return dict(self.errors)

    def settle(self) -> tuple[list[dict[str, Any]], int]:
        """Stop taking deliveries; return the lines not delivered and how many were."""
        with self._lock:
            self._settled = True
            delivered = set(self._delivered)
            built = list(self._built.values())
        for sink in built:  # what a rebuilt sink holds (MLflow's HTTP bounds) is given back
            release = getattr(sink, "release", None)
            if callable(release):
                release()
        kept = [line for i, line in enumerate(self._lines) if i not in delivered]
        return kept, len(delivered)


def run_replay(
    spool: SpoolFile,
    *,
    sinks: Mapping[str, Sink] | None = None,
    include_refused: bool = False,
    timeout: float | None = None,
    only: str | None = None,
) -> tuple[ReplayResult, dict[str, tuple[Mapping[str, Any], BaseException]]]:
    """:func:`replay_spool` without its warnings: the result and the error of each failed target.

    ``only`` (a :func:`target_key`) limits the replay to one target's lines.
    """
    content = spool.read_content()
    aside = spool.set_aside(content.bad) if content.bad else None
    job = _Replay(
        [line for _, line in content.lines],
        sinks or {},
        include_refused=include_refused,
        only=only,
    )
    timed_out = False
    if timeout is None:
        job.run()
    else:
        worker = threading.Thread(target=job.run, name="substrax-tracking-replay", daemon=True)
        worker.start()
        worker.join(timeout)
        timed_out = worker.is_alive()
    kept, delivered = job.settle()
    spool.rewrite(kept, content.size)
    result = ReplayResult(
        delivered=delivered,
        remaining=len(kept),
        bad_lines=tuple(bad.number for bad in content.bad),
        timed_out=timed_out,
        bad_file=aside,
        bad_reasons=tuple(bad.reason for bad in content.bad),
    )
    return result, job.failures()


def replay_spool(
    path: str | os.PathLike[str],
    *,
    sinks: Mapping[str, Sink] | None = None,
    include_refused: bool = False,
    timeout: float | None = None,
) -> ReplayResult:
    r"""Send the records of a spool file to their backends, keeping only those that still fail.

    Intact lines are sent in order, a target's records in batches; lines that are not records
    (a line cut short by a crash) are moved to ``<spool>.bad`` and their numbers reported. With
    a ``timeout``, the replay stops waiting after that many seconds: records a backend has not
    confirmed by then stay in the spool (a record may then arrive twice, which MLflow and W&B
    ignore for a metric of the same step, time and value).

    Args:
        path: the spool file.
        sinks: sinks to use, keyed by :func:`target_key` of their target; the others are rebuilt
            from their target data (e.g. an MLflow tracking URI and run id).
        include_refused: also retry records that a backend refused (spooled with an error).
        timeout: the most seconds to spend; None waits for every backend.

    Returns:
        How many records were delivered, how many remain, the bad lines, and whether the time
        ran out.

    Raises:
        SpoolNotFoundError: the file does not exist (a ``FileNotFoundError``).

    Example:
        >>> import tempfile, pathlib
        >>> spool = pathlib.Path(tempfile.mkdtemp()) / "run.spool.jsonl"
        >>> _ = spool.write_text('{"target": {"backend": "mlflow"}, "rec\n')
        >>> replay_spool(spool, timeout=10)
        ReplayResult(delivered=0, remaining=0, bad_lines=(1,), timed_out=False)
    """
    started = time.monotonic()
    spool = SpoolFile(path)
    result, errors = run_replay(
        spool, sinks=sinks, include_refused=include_refused, timeout=timeout
    )
    if result.bad_lines:
        _log.warning(
            "%s: %d lines are not records: %s",
            spool.path,
            len(result.bad_lines),
            result.describe_bad_lines(),
        )
    for target, error in errors.values():
        _log.warning(
            "replay to %s failed (%s: %s); its records stay in %s",
            dict(target),
            type(error).__name__,
            error,
            spool.path,
        )
    if result.timed_out:
        _log.warning(
            "replay of %s stopped after %.0f s with %d records undelivered; they stay in the spool",
            spool.path,
            time.monotonic() - started,
            result.remaining,
        )
    return result
