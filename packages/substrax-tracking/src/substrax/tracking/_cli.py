"""``python -m substrax.tracking``: plot a file log, or replay a spool file.

Commands:
    plot LOG_DIR [--out DIR] [--json]     draw the scalar curves of a file log to PNGs and an index.html
    replay SPOOL [--timeout S] [--include-refused] [--json]  send the records of a spool file to their backends

Exit status, as every substrax command line: 0 when the command did its work; 1 when it failed
(``replay``: some records were not delivered: a backend unreachable, the time limit reached,
another replay of the same spool still running when the time limit ran out,
they stay in the spool; records a backend refused, moved to ``SPOOL.refused``; lines that are
not records, moved to ``SPOOL.bad``); 2 for bad usage or input (a spool file that does not
exist or is not a spool file, left untouched; a ``--timeout`` that is not a finite number
>= 0; a directory without a file log; a plot ``--out`` that is a file). Two replays of one
spool never run at once: the second waits for the first (within its ``--timeout``), then sends
what the first left and says so. Errors are one line, ``python -m substrax.tracking:
error: ...``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from substrax.support import (
    CommandFailedError,
    MissingExtraError,
    UsageError,
    add_json_flag,
    check_seconds,
    emit,
    run_command,
)

from ._errors import (
    FileLogValueError,
    NoFileLogError,
    NotASpoolError,
    SpoolBusyError,
    SpoolNotFoundError,
)
from ._plot import plot_log_dir
from ._replay import ReplayResult, run_replay
from ._spool import SpoolFile


__all__ = ["exit_with_main", "main"]

PROG = "python -m substrax.tracking"
_REPLAY_TIMEOUT = 120.0
_REASONS_SHOWN = 2000


class _Exit:
    """Whether a replay left a backend call running (then the process ends without waiting)."""

    stuck = False


def _one_line(text: object) -> str:
    """``text`` with its whitespace runs (an SDK's multi-line message) made single spaces."""
    return " ".join(str(text).split())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Plot a file log, or replay a spool file."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    plot = commands.add_parser("plot", help="draw a file log's scalar curves to PNG and HTML")
    plot.add_argument("log_dir")
    plot.add_argument("--out", default=None, help="output directory (default LOG_DIR/plots)")
    add_json_flag(plot)
    replay = commands.add_parser("replay", help="send spooled records to their backends")
    replay.add_argument("spool")
    replay.add_argument(
        "--timeout",
        type=float,
        default=_REPLAY_TIMEOUT,
        help=f"give up after this many seconds, keeping what is undelivered (default "
        f"{_REPLAY_TIMEOUT:g}; 0 waits as long as the backends take)",
    )
    replay.add_argument(
        "--include-refused",
        action="store_true",
        help="also send again the records a backend refused (kept in SPOOL.refused)",
    )
    add_json_flag(replay)
    return parser


def _plot(args: argparse.Namespace) -> int:
    if args.out is not None:
        out = Path(args.out)
        if not args.out.strip():
            raise UsageError("--out is empty; pass the directory to write the plots into")
        for path in (out, *out.parents):
            if path.exists() and not path.is_dir():
                raise UsageError(
                    f"--out {args.out}: {path} is a file, not a directory; pass a directory to "
                    "write the plots into"
                )
    page = plot_log_dir(args.log_dir, args.out)
    emit({"page": str(page)}, str(page), as_json=args.json)
    return 0


def _summary(
    spool: str,
    result: ReplayResult,
    failures: Mapping[str, tuple[Mapping[str, Any], BaseException]],
) -> dict[str, Any]:
    return {
        "spool": spool,
        "delivered": result.delivered,
        "remaining": result.remaining,
        "refused": result.refused,
        "bad_lines": list(result.bad_lines),
        "timed_out": result.timed_out,
        **({"waited_for": result.waited_for} if result.waited_for is not None else {}),
        "failures": [
            {"target": dict(target), "error": f"{type(error).__name__}: {_one_line(error)}"}
            for target, error in failures.values()
        ],
    }


def _problems(
    spool: str,
    timeout: float,
    result: ReplayResult,
    failures: Mapping[str, tuple[Mapping[str, Any], BaseException]],
) -> list[str]:
    """What went wrong, most important first; empty when every record was delivered."""
    problems: list[str] = []
    if result.timed_out:
        problems.append(
            f"stopped after --timeout {timeout:g} s; the {result.remaining} undelivered records "
            f"stay in {spool}; run the replay again when the backend answers"
        )
    elif result.remaining:
        problems.append(f"{result.remaining} records stay in {spool} (a backend did not take them)")
    problems.extend(
        f"{dict(target)}: {type(failure).__name__}: {_one_line(failure)}"
        for target, failure in failures.values()
    )
    if result.bad_lines:
        problems.append(
            f"{len(result.bad_lines)} lines of {spool} are not records: "
            f"{result.describe_bad_lines()}"
        )
    if result.refused:
        reasons = _one_line("; ".join(sorted(set(result.refused_reasons))))[:_REASONS_SHOWN]
        problems.append(
            f"{result.refused} records were refused by their backend ({reasons}); they are kept "
            f"in {result.refused_file}; --include-refused sends them again"
        )
    return problems


def _replay(args: argparse.Namespace) -> int:
    try:
        timeout = check_seconds("--timeout", args.timeout)
    except ValueError as error:
        raise UsageError(f"{error} (0 waits as long as the backends take)") from None
    if not args.spool.strip():
        raise UsageError(
            "the spool path is empty; pass the <log_dir>/<name>.spool.jsonl path that the "
            "logger's warning named"
        )
    result, failures = run_replay(
        SpoolFile(args.spool),
        include_refused=args.include_refused,
        timeout=timeout or None,
        wait=timeout or None,  # another replay of this spool is waited for within the time
    )
    if result.timed_out:
        _Exit.stuck = True
    summary = f"delivered {result.delivered}, remaining {result.remaining}" + (
        f", refused {result.refused}" if result.refused else ""
    )
    if result.waited_for is not None:
        summary += (
            f" (after waiting for another replay of this spool, pid {result.waited_for}, "
            "which sent what it held)"
        )
    emit(_summary(args.spool, result, failures), summary, as_json=args.json)
    problems = _problems(args.spool, timeout, result, failures)
    if problems:
        raise CommandFailedError("; ".join(problems))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 failed, 2 bad usage or input).

    Example:
        >>> import contextlib, io
        >>> from substrax.tracking._cli import main
        >>> with contextlib.redirect_stderr(io.StringIO()) as err:
        ...     main(["replay", "/no/such/run.spool.jsonl"])
        2
        >>> err.getvalue().startswith("python -m substrax.tracking: error: spool file")
        True
    """
    args = _parser().parse_args(argv)
    command = _plot if args.command == "plot" else _replay
    return run_command(
        PROG,
        lambda: command(args),
        usage=(
            SpoolNotFoundError,
            NotASpoolError,
            NoFileLogError,
            FileLogValueError,
            MissingExtraError,
            PermissionError,
        ),
        failures=(SpoolBusyError, OSError),
    )


def exit_with_main() -> NoReturn:
    """Run :func:`main` on ``sys.argv`` (warnings logged to stderr) and end the process with its status.

    A replay that gave up on a backend call still running ends the process at once: an SDK's
    exit hooks would otherwise wait for that call.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    status = main()
    if _Exit.stuck:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
