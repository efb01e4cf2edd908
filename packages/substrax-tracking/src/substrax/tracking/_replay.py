"""replay_spool: send a spool file's records to their backends, within a time limit."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from substrax.support import check_seconds

from ._live import is_live, live_attempt, live_state
from ._records import Record
from ._send import Failures, Sending, describe_error
from ._sink import Sink
from ._spool import SpoolFile, SpoolLine


__all__ = ["ReplayResult", "problems", "replay_spool", "run_replay"]

_logger = logging.getLogger(__name__)


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
        refused: records their backend refused, moved with their error to ``<spool>.refused``.
        refused_file: where the refused records went.
        refused_reasons: each refused record's error.
        waited_for: the pid of another replay of the spool this one waited for, or None.
        live: of the remaining records, those of runs a logger still sends, left to it.
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
    live: int = dataclasses.field(default=0, repr=False)

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


def run_replay(
    spool: SpoolFile,
    *,
    sinks: Mapping[str, Sink] | None = None,
    include_refused: bool = False,
    timeout: float | None = None,
    only: Collection[str] | None = None,
    own: Collection[str] = (),
    stop: Callable[[], bool] | None = None,
    limit: int | None = None,
    wait: float | None = 0.0,
    on_refused: Callable[[Record, str], None] | None = None,
    read: Callable[[int | None], list[SpoolLine]] | None = None,
) -> tuple[ReplayResult, Failures]:
    """:func:`replay_spool` without its warnings: the result, and the error of each failed target.

    ``only`` limits it to those runs, ``limit`` to the first records; a run a logger still sends is
    left to it, unless one of ``own``. ``read`` gives the lines to send once the spool is held.
    """
    started = time.monotonic()
    if spool.path.exists() or not include_refused:
        spool.check_regular()
    with spool.replaying(wait) as waited_for:
        if waited_for is not None and not spool.path.exists() and not include_refused:
            return ReplayResult(delivered=0, remaining=0, waited_for=waited_for), {}
        if include_refused:
            spool.restore_refused()
        lines = (read or spool.read_lines)(limit)
        job = Sending(
            lines,
            sinks or {},
            include_refused=include_refused,
            only=only,
            live=functools.partial(live_state, spool.path, remove=False),
            attempt=functools.partial(live_attempt, spool.path),
            ended=functools.partial(is_live, spool.path),  # a dead logger's file, once ended
            own=own,
            stop=stop,
            on_refused=on_refused,
        )
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
        if done and not spool.remove(
            [lines[i].text for i in done],
            refused=[line for line, _ in set_aside],
            bad=[lines[i].text for i in bad],
            aside=[lines[i].text for i in {*job.refused, *bad}],
        ):  # a full disk: what was set aside stays in the spool
            set_aside, bad = [], []
            done = set(job.delivered) - set(job.refused)
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
        live=job.left_live,
    )
    return result, failures


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
    elif result.remaining > result.live:
        found.append(
            f"{result.remaining - result.live} records stay in {spool} (a backend did not take them)"
        )
    if result.live:
        found.append(
            f"{result.live} records stay in {spool} for a logger that still sends their run (it "
            "delivers them, or its close names them); replay again once it has closed"
        )
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
    ``<spool>.bad``, records a backend refuses to ``<spool>.refused`` with their error; records
    not confirmed when ``timeout`` runs out stay. A second replay of the spool waits for the first.
    Each problem is logged as a warning.

    Args:
        path: the spool file.
        sinks: sinks to use, keyed by their target's ``target_key``; the others are rebuilt.
        include_refused: first move the records of ``<spool>.refused`` back, to send them again.
        timeout: the most seconds to spend (finite); None waits for every backend.

    Returns:
        What was delivered, remains and was refused, the bad lines, and whether the time ran out.

    Raises:
        SpoolNotFoundError: the file does not exist (a ``FileNotFoundError``).
        SpoolBusyError: another replay still held the spool when ``timeout`` ran out.
        NotASpoolError: the path is no file, or none of its lines is a spool record; it is unchanged.
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
