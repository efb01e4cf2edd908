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

from substrax.support import check_seconds

from ._errors import NotARecordError
from ._records import Record, split_scalars
from ._spool import BadLine, Sink, SpoolFile, sink_factory, spool_line


__all__ = ["ReplayResult", "replay_spool", "target_key"]

_logger = logging.getLogger(__name__)

_CHUNK = 1000


def target_key(target: Mapping[str, Any]) -> str:
    """The key that groups spool lines by their target (``json.dumps`` with sorted keys).

    Example:
        >>> from substrax.tracking._replay import target_key
        >>> target_key({"run": "r1", "backend": "mlflow"})
        '{"backend": "mlflow", "run": "r1"}'
    """
    return json.dumps(target, sort_keys=True)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """What a replay did.

    Attributes:
        delivered: records sent to their backend (and removed from the spool).
        remaining: records left in the spool (their backend is still unreachable, or the time
            ran out).
        bad_lines: the line numbers (from 1) of lines that are not records, moved to
            ``<spool>.bad``.
        timed_out: the time limit ran out before every backend answered.
        bad_file: where the bad lines went.
        bad_reasons: why each bad line is not a record.
        refused: records their backend refused (a value it does not accept), moved with their
            error to ``<spool>.refused``; the records after them were delivered. Of a record
            of several scalars refused for some of them, only those are set aside (a record of
            their own each), and the record counts as delivered too.
        refused_file: where the refused records went.
        refused_reasons: each refused record's error.
        waited_for: the pid of another replay of the same spool that this one waited for
            (None when it did not wait): what that replay left is what this one saw.
    """

    delivered: int
    remaining: int
    bad_lines: tuple[int, ...] = ()
    timed_out: bool = False
    bad_file: Path | None = dataclasses.field(default=None, repr=False)
    bad_reasons: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    refused: int = 0
    refused_file: Path | None = dataclasses.field(default=None, repr=False)
    refused_reasons: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    waited_for: int | None = dataclasses.field(default=None, repr=False)

    def describe_bad_lines(self, limit: int = 10) -> str:
        """The bad lines as ``line N: reason; ...`` (at most ``limit``), and where they went.

        Example:
            >>> from substrax.tracking import ReplayResult
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


class _Settled(Exception):  # noqa: N818  (a signal, not an error)
    """The replay was settled (its time ran out): deliver nothing more."""


class _Replay:
    """Delivers spool lines group by group from its own thread; :meth:`settle` ends it at any time.

    A record its backend refuses (``Sink.is_permanent``) is set aside with its error, and the
    rest goes on: a batch that is refused is sent again one record at a time to find it, and a
    refused record of several scalars one scalar at a time, so that only the refused ones are
    set aside.
    """

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
        self._include_refused = include_refused
        self._only = only
        self._lock = threading.Lock()
        self._delivered: set[int] = set()
        # each refused line: the records set aside (the line's own, or the refused scalars of
        # it), each with its error
        self._refused: dict[int, list[tuple[dict[str, Any], str]]] = {}
        self._bad: dict[int, str] = {}
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
        try:
            self._run()
        except _Settled:
            return

    def _run(self) -> None:
        failed: set[str] = set()
        built = self._built
        for key, indexes in self._groups():
            if key in failed or (self._only is not None and key != self._only):
                continue
            todo = self._todo(indexes)
            if not todo:
                continue
            target = self._lines[todo[0]]["target"]
            try:
                sink = self._sinks.get(key)
                if sink is None:
                    try:
                        sink = self._sinks[key] = sink_factory(target)(target)
                    except NotARecordError as error:  # a target its backend cannot use
                        self._set_bad(todo, str(error))
                        continue
                    with self._lock:
                        built[key] = sink
                for start in range(0, len(todo), _CHUNK):
                    self._deliver(sink, todo[start : start + _CHUNK])
            except _Settled:
                raise
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
                _logger.warning("could not finish the replayed run %s: %s", key, error)

    def _todo(self, indexes: list[int]) -> list[int]:
        """The lines to send; a line spooled with an error (refused before) is set aside."""
        todo: list[int] = []
        for i in indexes:
            error = self._lines[i].get("error")
            if error is not None and not self._include_refused:
                self._refuse(i, [(self._lines[i]["record"], str(error))])
            else:
                todo.append(i)
        return todo

    def _deliver(self, sink: Sink, chunk: list[int]) -> None:
        try:
            sink.deliver([Record.from_json(self._lines[i]["record"]) for i in chunk])
        except Exception as error:
            if not _is_permanent(sink, error):
                raise
            if len(chunk) == 1:
                self._refuse_line(sink, chunk[0], f"{type(error).__name__}: {error}")
                return
            for i in chunk:  # find the refused records: one at a time
                self._deliver(sink, [i])
            return
        with self._lock:
            if self._settled:
                raise _Settled
            self._delivered.update(chunk)

    def _refuse_line(self, sink: Sink, index: int, error: str) -> None:
        """Set aside a refused line; of several scalars, only those refused one at a time."""
        record = self._lines[index]["record"]
        parts = split_scalars(Record.from_json(record))
        refused: list[tuple[dict[str, Any], str]] = []
        for part in parts:
            try:
                sink.deliver([part])
            except Exception as failure:
                if not _is_permanent(sink, failure):
                    raise
                refused.append((part.to_json(), f"{type(failure).__name__}: {failure}"))
        if len(refused) == len(parts):  # all of it (or one record): the line as it is
            self._refuse(index, [(record, refused[0][1] if refused else error)])
            return
        with self._lock:
            if self._settled:
                raise _Settled
            self._delivered.add(index)
            if refused:
                self._refused[index] = refused

    def _refuse(self, index: int, refused: list[tuple[dict[str, Any], str]]) -> None:
        with self._lock:
            if self._settled:
                raise _Settled
            self._refused[index] = refused

    def _set_bad(self, indexes: list[int], reason: str) -> None:
        with self._lock:
            if self._settled:
                raise _Settled
            self._bad.update(dict.fromkeys(indexes, reason))

    def failures(self) -> dict[str, tuple[Mapping[str, Any], BaseException]]:
        """The error of each target that failed so far."""
        with self._lock:
            return dict(self.errors)

    def settle(
        self,
    ) -> tuple[set[int], dict[int, list[tuple[dict[str, Any], str]]], dict[int, str]]:
        """Stop taking deliveries; return the lines delivered, refused and bad (with the reason)."""
        with self._lock:
            self._settled = True
            delivered = set(self._delivered)
            refused = dict(self._refused)
            bad = dict(self._bad)
            built = list(self._built.values())
        for sink in built:  # what a rebuilt sink holds (MLflow's HTTP bounds) is given back
            release = getattr(sink, "release", None)
            if callable(release):
                release()
        return delivered, refused, bad


def _is_permanent(sink: Sink, error: BaseException) -> bool:
    try:
        return bool(sink.is_permanent(error))
    except Exception:
        return False


def run_replay(
    spool: SpoolFile,
    *,
    sinks: Mapping[str, Sink] | None = None,
    include_refused: bool = False,
    timeout: float | None = None,
    only: str | None = None,
    limit: int | None = None,
    wait: float | None = 0.0,
) -> tuple[ReplayResult, dict[str, tuple[Mapping[str, Any], BaseException]]]:
    """:func:`replay_spool` without its warnings: the result and the error of each failed target.

    ``only`` (a :func:`target_key`) limits the replay to one target's lines, ``limit`` to the
    first ``limit`` intact lines of the spool (the others are not read, and stay). Another
    replay of the same spool is waited for, for at most ``wait`` seconds (None: as long as it
    takes; its time counts against ``timeout``); a spool it emptied meanwhile is an empty result.

    Raises:
        SpoolNotFoundError: the file does not exist.
        NotASpoolError: the path is not a spool file (nothing is changed).
        SpoolBusyError: another replay held the spool for longer than ``wait`` (a TimeoutError).
    """
    started = time.monotonic()
    if spool.path.exists() or not include_refused:
        spool.check_regular()
    with spool.replaying(wait) as waited_for:
        if waited_for is not None and not spool.path.exists() and not include_refused:
            return ReplayResult(delivered=0, remaining=0, waited_for=waited_for), {}
        if timeout is not None:
            timeout = max(0.0, timeout - (time.monotonic() - started))
        result, errors = _replay_held(
            spool,
            sinks=sinks,
            include_refused=include_refused,
            timeout=timeout,
            only=only,
            limit=limit,
        )
    return dataclasses.replace(result, waited_for=waited_for), errors


def _replay_held(
    spool: SpoolFile,
    *,
    sinks: Mapping[str, Sink] | None,
    include_refused: bool,
    timeout: float | None,
    only: str | None,
    limit: int | None,
) -> tuple[ReplayResult, dict[str, tuple[Mapping[str, Any], BaseException]]]:
    """:func:`run_replay` once this process holds the spool's replay lock."""
    if include_refused:
        spool.restore_refused()
    content = spool.read_content(limit)
    job = _Replay(
        [line.data for line in content.lines],
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
    delivered, refused, unusable = job.settle()
    lines = content.lines
    bad = sorted(
        [*content.bad]
        + [
            BadLine(number=lines[i].number, text=lines[i].text, reason=r)
            for i, r in unusable.items()
        ],
        key=lambda line: line.number,
    )
    content = dataclasses.replace(content, bad=bad)
    set_aside = [(i, record, error) for i in sorted(refused) for record, error in refused[i]]
    if lines or content.bad:
        spool.remove(
            [lines[i].text for i in {*delivered, *refused}] + [b.text for b in content.bad],
            refused=[
                spool_line(lines[i].data["target"], record, error) for i, record, error in set_aside
            ],
            bad=[b.text for b in content.bad],
        )
    result = ReplayResult(
        delivered=len(delivered),
        remaining=len(lines) - len({*delivered, *refused}) - len(unusable),
        bad_lines=tuple(b.number for b in content.bad),
        timed_out=timed_out,
        bad_file=spool.bad_path if content.bad else None,
        bad_reasons=tuple(b.reason for b in content.bad),
        refused=len(set_aside),
        refused_file=spool.refused_path if set_aside else None,
        refused_reasons=tuple(error for _, _, error in set_aside),
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
    ignore for a metric of the same step, time and value). A record its backend refuses (such
    as an MLflow param logged again with another value) is moved with its error to
    ``<spool>.refused``, and the records after it are still sent. Other processes may append
    to the spool meanwhile: a replay removes only the lines it delivered. A second replay of
    the same spool waits for the first (within its ``timeout``) and then sends what is left;
    a line whose target lacks a field its backend needs is a bad line too.

    Args:
        path: the spool file.
        sinks: sinks to use, keyed by :func:`target_key` of their target; the others are rebuilt
            from their target data (e.g. an MLflow tracking URI and run id).
        include_refused: first move the records of ``<spool>.refused`` back into the spool,
            and send them again.
        timeout: the most seconds to spend (finite); None waits for every backend.

    Returns:
        How many records were delivered, how many remain, how many were refused, the bad lines,
        and whether the time ran out.

    Raises:
        SpoolNotFoundError: the file does not exist (a ``FileNotFoundError``).
        SpoolBusyError: another replay still held the spool when ``timeout`` ran out.
        NotASpoolError: the path is a directory, a device, or a file none of whose lines is a
            spool record (a ``ValueError``); nothing is changed.
        ValueError: ``timeout`` is NaN, infinite or negative.

    Example:
        >>> import tempfile, pathlib
        >>> from substrax.tracking import replay_spool
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     spool = pathlib.Path(directory) / "run.spool.jsonl"
        ...     _ = spool.write_text('{"target": {"backend": "mlflow"}, "rec\n')
        ...     replay_spool(spool, timeout=10)
        ReplayResult(delivered=0, remaining=0, bad_lines=(1,), timed_out=False, refused=0)
    """
    if timeout is not None:
        timeout = check_seconds("timeout", timeout)
    started = time.monotonic()
    spool = SpoolFile(path)
    result, errors = run_replay(
        spool, sinks=sinks, include_refused=include_refused, timeout=timeout, wait=timeout
    )
    if result.bad_lines:
        _logger.warning(
            "%s: %d lines are not records: %s",
            spool.path,
            len(result.bad_lines),
            result.describe_bad_lines(),
        )
    if result.refused:
        _logger.warning(
            "%s: %d records were refused by their backend and moved to %s: %s",
            spool.path,
            result.refused,
            result.refused_file,
            "; ".join(sorted(set(result.refused_reasons)))[:2000],
        )
    for target, error in errors.values():
        _logger.warning(
            "replay to %s failed (%s: %s); its records stay in %s",
            dict(target),
            type(error).__name__,
            error,
            spool.path,
        )
    if result.timed_out:
        _logger.warning(
            "replay of %s stopped after %.0f s with %d records undelivered; they stay in the spool",
            spool.path,
            time.monotonic() - started,
            result.remaining,
        )
    return result
