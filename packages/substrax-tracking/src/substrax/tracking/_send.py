"""How records reach a sink, live or replayed: in chunks; of a refused chunk, each record alone."""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, cast

from substrax.support import describe_error

from ._errors import NotARecordError
from ._live import LiveState
from ._records import Record, split_scalars
from ._sink import Sink, build_sink
from ._spool import SpoolLine, spool_lines


__all__ = ["Failures", "Sending", "deliver_in_memory", "describe_error", "run_of", "target_key"]

_logger = logging.getLogger(__name__)

_CHUNK = 1000
type Failures = dict[str, tuple[Mapping[str, Any], BaseException]]  # by target_key


def target_key(target: Mapping[str, Any]) -> str:
    """The key that groups spool lines by their run (``json.dumps``, sorted, without ``failed``).

    Example:
        >>> from substrax.tracking._send import target_key
        >>> target_key({"run": "r1", "backend": "mlflow", "failed": True})
        '{"backend": "mlflow", "run": "r1"}'
    """
    return json.dumps({k: v for k, v in target.items() if k != "failed"}, sort_keys=True)


def run_of(target: Mapping[str, Any]) -> str:
    """The run a target sends to, whoever logs it: its key without a resumed logger's step.

    Example:
        >>> from substrax.tracking._send import run_of
        >>> run_of({"backend": "mlflow", "run_id": "r1", "resume_step": 3})
        '{"backend": "mlflow", "run_id": "r1"}'
    """
    return target_key({k: v for k, v in target.items() if k != "resume_step"})


class _Settled(BaseException):  # not an Exception: passes the handlers around backend calls
    """The replay's result was taken (its time ran out): deliver nothing more."""


class Sending:
    """Sends spool lines target by target; :meth:`settle` fixes the result at any time.

    Of a refused batch, each record is sent alone (of a record of scalars, each scalar): only
    refused values are set aside. A run ``live`` says a logger sends is left to it, unless ``own``.
    """

    def __init__(
        self,
        lines: list[SpoolLine],
        sinks: Mapping[str, Sink],
        *,
        include_refused: bool = False,
        only: Collection[str] | None = None,
        live: Callable[[str], LiveState] | None = None,
        attempt: Callable[[str], str] | None = None,
        ended: Callable[[str], object] | None = None,
        own: Collection[str] = (),
        stop: Callable[[], bool] | None = None,
        on_refused: Callable[[Record, str], None] | None = None,
    ) -> None:
        self.data = {i: line.data for i, line in enumerate(lines) if line.data is not None}
        self._records = {i: line.record for i, line in enumerate(lines) if line.record is not None}
        self.delivered: set[int] = set()
        self.refused: dict[int, list[tuple[str, str]]] = {}  # spool lines set aside, and why
        self.bad = {i: line.reason for i, line in enumerate(lines) if line.data is None}
        self._sinks = dict(sinks)
        self._include_refused = include_refused
        self._only = only
        self._live_state = live or (lambda _run: "none")
        self._attempt = attempt or (lambda _run: "")  # the attempt a died run's lock names
        self._ended = ended or (lambda _run: None)  # told each died run once it is ended
        self._died: set[str] = set()  # the runs whose logger's process died before close
        self._own, self._stop = own, stop or (lambda: False)
        self._on_refused = on_refused or (lambda _record, _reason: None)
        self._built: dict[str, tuple[Sink, str]] = {}  # the sinks this replay made, and runs
        self._failures: Failures = {}
        self._keys: dict[int, str] = {}
        target, key = None, ""
        for i, data in self.data.items():  # lines appended together share their target
            if data["target"] is not target:
                target, key = data["target"], target_key(data["target"])
            self._keys[i] = key
        self._failed = {  # the runs a line of marks failed: they end so
            self._keys[i] for i, d in self.data.items() if d["target"].get("failed") is True
        }
        self._settled = False
        self._lock = threading.Lock()
        self.left_live = 0  # lines of runs a logger still sends, left to it

    def run(self) -> None:
        """Deliver every line, then finish the runs of the sinks it made."""
        failed: set[str] = set()
        failed_runs: set[str] = set()  # a later group of such a run waits: it is sent in order
        keyed = ((key, i) for i, key in self._keys.items())
        try:
            for key, group in itertools.groupby(keyed, key=lambda pair: pair[0]):
                indexes = [i for _, i in group]
                run = run_of(self.data[indexes[0]]["target"])
                if key in failed or run in failed_runs or run not in (self._only or (run,)):
                    continue
                if run not in self._own and self._live(run):
                    self.left_live += len(indexes)
                    continue
                self._send(key, indexes, failed)
                if key in failed:
                    failed_runs.add(run)
                    sink = self._sinks.get(key)
                    if sink is not None:  # and the run it became (MLflow's, made from its spec)
                        failed_runs.add(run_of(sink.target()))
        except _Settled:
            return
        for key, (sink, run) in self._built.items():
            if run not in failed_runs and run not in self._own and not self._live(run):
                try:
                    died = run in self._died
                    if died:
                        _logger.warning(
                            "the run %s was never closed: the process that logged it ended "
                            "first (killed); its records replayed, it ends FAILED (unless a "
                            "later attempt resumed and ended it)",
                            key,
                        )
                        cast("Any", sink).died = True
                        cast("Any", sink).died_attempt = self._attempt(run)
                    if key in self._failed or died:
                        cast("Any", sink).failed = True
                    sink.finish()
                    if died:
                        self._ended(run)
                except Exception as error:
                    _logger.warning("could not finish the replayed run %s: %s", key, error)

    def _live(self, run: str) -> bool:
        """Whether a logger sends ``run`` now (asked again before the run is ended)."""
        state = self._live_state(run)
        if state == "died":
            self._died.add(run)
        return state == "live"

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
                    self._built[key] = (sink, run_of(target))
            for start in range(0, len(todo), _CHUNK):
                self._deliver(sink, todo[start : start + _CHUNK])
        except Exception as error:
            failed.add(key)
            with self._lock:
                self._failures[key] = (target, error)

    def _deliver(self, sink: Sink, chunk: list[int]) -> None:
        if self._stop():
            raise _Settled
        try:
            sink.deliver([self._record(i) for i in chunk])
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

    def _record(self, index: int) -> Record:
        found = self._records.get(index)
        return Record.from_json(self.data[index]["record"]) if found is None else found

    def _refuse(self, sink: Sink, index: int, error: str) -> None:
        """Set a refused line aside; of several scalars, only those refused one at a time."""
        record, whole = self.data[index]["record"], self._record(index)
        parts = split_scalars(whole)
        refused: list[tuple[Record, str]] = []
        for part in parts:
            try:
                sink.deliver([part])
            except Exception as failure:
                if not is_permanent(sink, failure):
                    raise
                refused.append((part, describe_error(failure)))
        if len(refused) == len(parts):  # all of it (or a record of one part): the line as it is
            self._note([index], refused=[(record, refused[0][1] if refused else error)])
        else:
            parts_refused = [(part.to_json(), reason) for part, reason in refused]
            self._note([index], delivered=True, refused=parts_refused)
        for part, reason in refused if parts else [(whole, error)]:
            self._on_refused(part, reason)

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
                        (spool_lines(target, [record], error)[0], error)
                        for record, error in refused
                    ]
                if bad is not None:
                    self.bad[i] = bad

    def settle(self) -> Failures:
        """Fix the result (lines delivered later stay in the spool); the failures so far."""
        with self._lock:
            self._settled = True
            return dict(self._failures)


def is_permanent(sink: Sink, error: BaseException) -> bool:
    """Whether ``sink`` refused what it was sent for good (always: a file gone, a payload lacking a key)."""
    if isinstance(error, LookupError | FileNotFoundError | NotADirectoryError):
        return True
    try:
        return bool(sink.is_permanent(error))
    except Exception:
        return False


def deliver_in_memory(
    records: Sequence[Record],
    target: Mapping[str, Any],
    sink: Sink,
    on_refused: Callable[[Record, str], None] | None = None,
) -> tuple[Sending, BaseException | None]:
    """Send ``records`` of ``target`` as a replay sends spool lines: the job (indexes into ``records``), and the error that stopped the rest."""
    lines = [
        SpoolLine(i + 1, "", {"target": dict(target), "record": record.to_json()}, record=record)
        for i, record in enumerate(records)
    ]
    job = Sending(lines, {target_key(target): sink}, on_refused=on_refused)
    job.run()
    failures = job.settle()
    return job, next(iter(failures.values()))[1] if failures else None
