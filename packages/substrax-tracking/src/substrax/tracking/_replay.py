"""replay_spool: send a spool file's records to their backends, within a time limit."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from substrax.support import check_seconds

from ._errors import NotARecordError
from ._records import Record, split_scalars
from ._spool import Sink, SpoolFile, SpoolLine, build_sink, spool_line


__all__ = ["Failures", "ReplayResult", "describe_error", "is_permanent", "problems", "replay_spool"]
__all__ += ["deliver_in_memory", "run_replay", "target_key"]

_logger = logging.getLogger(__name__)

_CHUNK = 1000
type Failures = dict[str, tuple[Mapping[str, Any], BaseException]]  # by target_key


def target_key(target: Mapping[str, Any]) -> str:
    """The key that groups spool lines by their run (``json.dumps``, sorted, without ``failed``).

    Example:
        >>> from substrax.tracking._replay import target_key
        >>> target_key({"run": "r1", "backend": "mlflow", "failed": True})
        '{"backend": "mlflow", "run": "r1"}'
    """
    return json.dumps({k: v for k, v in target.items() if k != "failed"}, sort_keys=True)


def describe_error(error: BaseException) -> str:
    """``error`` as ``Type: message`` on one line (an SDK's message may span several)."""
    return " ".join(f"{type(error).__name__}: {error}".split())


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """What a replay did.

    Attributes:
        delivered: records sent to their backend (and removed from the spool).
        remaining: records left in the spool (a backend unreachable, or the time ran out).
        bad_lines: the numbers (from 1) of lines that are not records, moved to ``<spool>.bad``.
        timed_out: the time limit ran out before every backend answered.
        bad_file: where the bad lines went.
        bad_reasons: why each bad line is not a record.
        refused: records their backend refused, moved with their error to ``<spool>.refused``
            (of a record of several scalars, only the refused ones, each a record of its own).
        refused_file: where the refused records went.
        refused_reasons: each refused record's error.
        waited_for: the pid of another replay of the spool this one waited for, or None.
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


class _Settled(BaseException):  # not an Exception: passes the handlers around backend calls
    """The replay's result was taken (its time ran out): deliver nothing more."""


class _Replay:
    """Delivers spool lines target by target; :meth:`settle` fixes the result at any time.

    Of a batch its backend refuses (``Sink.is_permanent``), the records are sent one at a time,
    and of a refused record of several scalars, each scalar: only refused values are set aside.
    """

    def __init__(
        self,
        lines: list[SpoolLine],
        sinks: Mapping[str, Sink],
        *,
        include_refused: bool,
        only: str | None,
        skip: frozenset[str] = frozenset(),
    ) -> None:
        self.data = {i: line.data for i, line in enumerate(lines) if line.data is not None}
        self.delivered: set[int] = set()
        self.refused: dict[int, list[tuple[str, str]]] = {}  # spool lines set aside, and why
        self.bad = {i: line.reason for i, line in enumerate(lines) if line.data is None}
        self._sinks = dict(sinks)
        self._include_refused = include_refused
        self._only = only
        self._skip = skip
        self._built: dict[str, Sink] = {}  # the sinks this replay made
        self._failures: Failures = {}
        # the runs a line of marks failed (the logger's run was marked failed): they end so
        self._failed = {
            target_key(d["target"]) for d in self.data.values() if d["target"].get("failed") is True
        }
        self._settled = False
        self._lock = threading.Lock()

    def run(self) -> None:
        """Deliver every line, then finish the runs of the sinks it made."""
        failed: set[str] = set()
        keyed = ((target_key(data["target"]), i) for i, data in self.data.items())
        try:
            for key, group in itertools.groupby(keyed, key=lambda pair: pair[0]):
                if key not in failed | self._skip and self._only in (None, key):
                    self._send(key, [i for _, i in group], failed)
        except _Settled:
            return
        for key, sink in self._built.items():
            if key not in failed:
                try:
                    if key in self._failed:
                        cast("Any", sink).failed = True
                    sink.finish()
                except Exception as error:
                    _logger.warning("could not finish the replayed run %s: %s", key, error)

    def _send(self, key: str, indexes: list[int], failed: set[str]) -> None:
        """Send one run of ``key``'s lines; a line spooled with an error was refused before."""
        todo: list[int] = []
        for i in indexes:
            error = self.data[i].get("error")
            if error is None or self._include_refused:
                todo.append(i)
            else:
                self._note([i], refused=[(self.data[i]["record"], str(error))])
        if not todo:
            return
        target = self.data[todo[0]]["target"]
        try:
            sink = self._sinks.get(key)
            if sink is None:
                try:
                    sink = self._sinks[key] = build_sink(target)
                except NotARecordError as error:  # a target its backend cannot use
                    self._note(todo, bad=str(error))
                    return
                with self._lock:
                    self._built[key] = sink
            for start in range(0, len(todo), _CHUNK):
                self._deliver(sink, todo[start : start + _CHUNK])
        except Exception as error:
            failed.add(key)
            with self._lock:
                self._failures[key] = (target, error)

    def _deliver(self, sink: Sink, chunk: list[int]) -> None:
        try:
            sink.deliver([Record.from_json(self.data[i]["record"]) for i in chunk])
        except Exception as error:
            if not is_permanent(sink, error):
                raise
            if len(chunk) == 1:
                self._refuse(sink, chunk[0], describe_error(error))
            else:  # find the refused records: one at a time
                for i in chunk:
                    self._deliver(sink, [i])
            return
        self._note(chunk, delivered=True)

    def _refuse(self, sink: Sink, index: int, error: str) -> None:
        """Set a refused line aside; of several scalars, only those refused one at a time."""
        record = self.data[index]["record"]
        parts = split_scalars(Record.from_json(record))
        refused: list[tuple[dict[str, Any], str]] = []
        for part in parts:
            try:
                sink.deliver([part])
            except Exception as failure:
                if not is_permanent(sink, failure):
                    raise
                refused.append((part.to_json(), describe_error(failure)))
        if len(refused) == len(parts):  # all of it (or a record of one part): the line as it is
            self._note([index], refused=[(record, refused[0][1] if refused else error)])
        else:
            self._note([index], delivered=True, refused=refused)

    def _note(
        self,
        indexes: Iterable[int],
        *,
        delivered: bool = False,
        refused: Sequence[tuple[dict[str, Any], str]] = (),
        bad: str | None = None,
    ) -> None:
        """Record what became of lines, unless the result was taken (then stop the replay)."""
        with self._lock:
            if self._settled:
                raise _Settled
            for i in indexes:
                if delivered:
                    self.delivered.add(i)
                if refused:
                    target = self.data[i]["target"]
                    self.refused[i] = [
                        (spool_line(target, record, error), error) for record, error in refused
                    ]
                if bad is not None:
                    self.bad[i] = bad

    def settle(self) -> Failures:
        """Fix the result (lines delivered later stay in the spool); the failures so far."""
        with self._lock:
            self._settled = True
            return dict(self._failures)


def refused_record(error: BaseException) -> bool:
    """Whether ``error`` is about the record sent, not the backend: no retry can deliver it.

    A local file the record names that is gone (``FileNotFoundError``, ``NotADirectoryError``)
    or a payload that lacks a key (a ``LookupError``: a damaged or unserializable record).
    """
    return isinstance(error, LookupError | FileNotFoundError | NotADirectoryError)


def is_permanent(sink: Sink, error: BaseException) -> bool:
    """Whether ``sink`` refused what it was sent for good (:func:`refused_record`, or its own say)."""
    if refused_record(error):
        return True
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
    skip: frozenset[str] = frozenset(),
    limit: int | None = None,
    wait: float | None = 0.0,
) -> tuple[ReplayResult, Failures]:
    """:func:`replay_spool` without its warnings: the result, and the error of each failed target.

    ``only`` (a :func:`target_key`) limits the replay to one target's lines, ``skip`` leaves
    those targets' lines (a live logger's), ``limit`` to the
    spool's first ``limit`` records. Another replay of the spool is waited for at most ``wait``
    seconds (None: as long as it takes), within ``timeout``.

    Raises:
        SpoolNotFoundError: the file does not exist.
        NotASpoolError: the path is not a spool file (nothing is changed).
        SpoolBusyError: another replay held the spool for longer than ``wait``.
    """
    started = time.monotonic()
    if spool.path.exists() or not include_refused:
        spool.check_regular()
    with spool.replaying(wait) as waited_for:
        if waited_for is not None and not spool.path.exists() and not include_refused:
            return ReplayResult(delivered=0, remaining=0, waited_for=waited_for), {}
        if include_refused:
            spool.restore_refused()
        lines = spool.read_lines(limit)
        job = _Replay(lines, sinks or {}, include_refused=include_refused, only=only, skip=skip)
        if timeout is None:
            job.run()
            timed_out = False
        else:
            worker = threading.Thread(target=job.run, name="substrax-tracking-replay", daemon=True)
            worker.start()
            worker.join(max(0.0, timeout - time.monotonic() + started))
            timed_out = worker.is_alive()
        failures = job.settle()
        bad = sorted(job.bad)
        set_aside = [entry for i in sorted(job.refused) for entry in job.refused[i]]
        done = {*job.delivered, *job.refused, *bad}
        if done:
            spool.remove(
                [lines[i].text for i in done],
                refused=[line for line, _ in set_aside],
                bad=[lines[i].text for i in bad],
            )
    result = ReplayResult(
        delivered=len(job.delivered),
        remaining=len(lines) - len(done),
        bad_lines=tuple(lines[i].number for i in bad),
        timed_out=timed_out,
        bad_file=spool.bad_path if bad else None,
        bad_reasons=tuple(job.bad[i] for i in bad),
        refused=len(set_aside),
        refused_file=spool.refused_path if set_aside else None,
        refused_reasons=tuple(error for _, error in set_aside),
        waited_for=waited_for,
    )
    return result, failures


def deliver_in_memory(
    records: Sequence[Record], target: Mapping[str, Any], sink: Sink
) -> tuple[_Replay, BaseException | None]:
    """Send materialized ``records`` of ``target`` to ``sink`` as a replay sends spool lines.

    Returns:
        the replay (its ``delivered`` and ``refused`` are indexes into ``records``) and the
        error that stopped the rest (None: each record was delivered or refused).
    """
    lines = [
        SpoolLine(i + 1, "", {"target": dict(target), "record": record.to_json()})
        for i, record in enumerate(records)
    ]
    job = _Replay(lines, {target_key(target): sink}, include_refused=False, only=None)
    job.run()
    failures = job.settle()
    return job, next(iter(failures.values()))[1] if failures else None


def problems(
    spool: str | os.PathLike[str], result: ReplayResult, failures: Failures, timeout: float | None
) -> list[str]:
    """What went wrong in a replay, most important first; empty when every record was delivered."""
    found: list[str] = []
    if result.timed_out:
        found.append(
            f"stopped after the time limit of {timeout:g} s; the {result.remaining} undelivered "
            f"records stay in {spool}; run the replay again when the backend answers"
        )
    elif result.remaining:
        found.append(f"{result.remaining} records stay in {spool} (a backend did not take them)")
    found.extend(
        f"replay to {dict(target)} failed: {describe_error(error)}"
        for target, error in failures.values()
    )
    if result.bad_lines:
        found.append(
            f"{len(result.bad_lines)} lines of {spool} are not records: "
            f"{result.describe_bad_lines()}"
        )
    if result.refused:
        reasons = " ".join("; ".join(sorted(set(result.refused_reasons))).split())[:2000]
        found.append(
            f"{result.refused} records were refused by their backend ({reasons}); they are kept "
            f"in {result.refused_file}; a replay with --include-refused sends them again"
        )
    return found


def replay_spool(
    path: str | os.PathLike[str],
    *,
    sinks: Mapping[str, Sink] | None = None,
    include_refused: bool = False,
    timeout: float | None = None,
) -> ReplayResult:
    r"""Send the records of a spool file to their backends, keeping only those that still fail.

    Records are sent in order. Lines that are not records (cut short by a crash) go to
    ``<spool>.bad``; records a backend refuses go with their error to ``<spool>.refused``, and
    the rest is still sent; records not confirmed when ``timeout`` runs out stay (one may then
    arrive twice, which MLflow and W&B ignore). A second replay of the same spool waits for the
    first (within its ``timeout``). Each problem is logged as a warning.

    Args:
        path: the spool file.
        sinks: sinks to use, keyed by :func:`target_key` of their target; the others are rebuilt
            from their target data (e.g. an MLflow tracking URI and run id).
        include_refused: first move the records of ``<spool>.refused`` back into the spool,
            and send them again.
        timeout: the most seconds to spend (finite); None waits for every backend.

    Returns:
        How many records were delivered, remain and were refused, the bad lines, and whether the
        time ran out.

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
    spool = SpoolFile(path)
    result, failures = run_replay(
        spool, sinks=sinks, include_refused=include_refused, timeout=timeout, wait=timeout
    )
    for problem in problems(spool.path, result, failures, timeout):
        _logger.warning("%s", problem)
    return result
