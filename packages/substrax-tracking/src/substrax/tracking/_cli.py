"""``python -m substrax.tracking``: ``plot`` a file log, or ``replay`` a spool file (or a log dir's).

Exit status: 0 done; 1 failed (``replay``: some records not delivered); 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from substrax.support import (
    CommandFailedError,
    MissingExtraError,
    UsageError,
    add_json_flag,
    check_seconds,
    emit,
    escape_unshowable_output,
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
from ._replay import problems, run_replay
from ._send import describe_error
from ._spool import SpoolFile


__all__ = ["exit_with_main", "main"]

PROG = "python -m substrax.tracking"
_REPLAY_TIMEOUT = 120.0
_SUMMARY = ("delivered", "remaining", "refused", "bad_lines", "timed_out")  # ReplayResult's

_STUCK: list[bool] = []  # a replay left a backend call running: the process ends without waiting
_LEAST = 0.001  # the time a log directory's later spool gets once the timeout ran out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Plot a file log, or replay a spool.")
    commands = parser.add_subparsers(dest="command", required=True)
    plot = commands.add_parser("plot", help="draw a file log's scalar curves to PNG and HTML")
    plot.add_argument("log_dir")
    plot.add_argument("--out", default=None, help="output directory (default LOG_DIR/plots)")
    replay = commands.add_parser(
        "replay", aliases=["sync"], help="send spooled records to their backends (alias: sync)"
    )
    spool_help = "a spool file, or a log directory: every <name>.spool.jsonl in it, in turn"
    replay.add_argument("spool", help=spool_help)
    timeout_help = (
        f"give up after this many seconds, keeping what is undelivered (default "
        f"{_REPLAY_TIMEOUT:g}; 0 waits as long as the backends take)"
    )
    replay.add_argument("--timeout", type=float, default=_REPLAY_TIMEOUT, help=timeout_help)
    refused_help = "also send again the records a backend refused (kept in SPOOL.refused)"
    replay.add_argument("--include-refused", action="store_true", help=refused_help)
    for command in (plot, replay):
        add_json_flag(command)
    return parser


def _plot(args: argparse.Namespace) -> int:
    if not args.log_dir.strip():
        raise UsageError("LOG_DIR is empty; pass the directory a FileLogger wrote")
    if args.out is not None:
        if not args.out.strip():
            raise UsageError("--out is empty; pass the directory to write the plots into")
        out = Path(args.out)
        for path in (out, *out.parents):
            if path.exists() and not path.is_dir():
                raise UsageError(
                    f"--out {args.out}: {path} is a file, not a directory; pass a directory to "
                    "write the plots into"
                )
    page = plot_log_dir(args.log_dir, args.out)
    emit({"page": str(page)}, str(page), as_json=args.json)
    return 0


def _replay(args: argparse.Namespace) -> int:
    try:
        timeout = check_seconds("--timeout", args.timeout)
    except ValueError as error:
        raise UsageError(f"{error} (0 waits as long as the backends take)") from None
    if timeout > threading.TIMEOUT_MAX:  # a thread's join would raise OverflowError
        raise UsageError(
            f"--timeout={args.timeout} is past the longest wait, {threading.TIMEOUT_MAX:.0f} "
            "seconds; pass 0 to wait as long as the backends take"
        )
    if not args.spool.strip():
        raise UsageError(
            "the spool path is empty; pass the <log_dir>/<name>.spool.jsonl path that the "
            "logger's warning named, or the log directory"
        )
    _STUCK.clear()
    given = Path(args.spool)
    if not given.exists() and not given.with_name(f"{given.name}.refused").exists():
        raise UsageError(
            f"{args.spool!r} does not exist; pass a spool file (the <log_dir>/<name>.spool.jsonl "
            "path that the logger's warning named) or a log directory"
        )
    if not given.is_dir():
        data, summary, found = _replay_one(args.spool, args, timeout)
        emit(data, summary, as_json=args.json)
    else:  # each spool in it, within what is left of the one timeout
        spools = sorted(str(p) for p in Path(args.spool).glob("*.spool.jsonl") if p.is_file())
        deadline = time.monotonic() + timeout
        done: list[dict[str, object]] = []
        lines: list[str] = []
        found: list[str] = []
        for spool in spools:
            left = max(deadline - time.monotonic(), _LEAST) if timeout else 0.0
            data, summary, problems_of = _replay_one(spool, args, left)
            done.append(data)
            lines.append(f"{Path(spool).name}: {summary}")
            found.extend(problems_of)
        below: list[str] = []
        if not spools:  # a folder of runs? each run's log directory is replayed alone
            root = Path(args.spool)
            found_below = {p.parent for p in root.glob("*/**/*.spool.jsonl") if p.is_file()}
            below = sorted(str(p.relative_to(root)) for p in found_below)
        if below:
            lines.append(
                f"no spool in {args.spool}: nothing to replay here; these directories below it "
                f"hold spools: {below}; replay each run's log directory"
            )
        elif not spools:
            lines.append(
                f"no spool in {args.spool}: nothing to replay (every record was delivered)"
            )
        data = {"log_dir": args.spool, "spools": done} | ({"spools_below": below} if below else {})
        emit(data, "\n".join(lines), as_json=args.json)
    if found:
        raise CommandFailedError("; ".join(found))
    return 0


def _replay_one(
    spool: str, args: argparse.Namespace, timeout: float
) -> tuple[dict[str, object], str, list[str]]:
    """Replay ``spool``: what the JSON output holds of it, its summary line and its problems."""
    # with --json, stdout holds the one JSON object: what a backend prints goes to stderr
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        result, failures = run_replay(  # within the time, another replay of the spool is waited for
            SpoolFile(spool),
            include_refused=args.include_refused,
            timeout=timeout or None,
            wait=timeout or None,
        )
    _STUCK.append(result.timed_out)
    summary = f"delivered {result.delivered}, remaining {result.remaining}"
    summary += f", refused {result.refused}" if result.refused else ""
    if result.live:
        summary += f" ({result.live} of them left to the logger that still sends their run)"
    data: dict[str, object] = {"spool": spool}
    data |= {name: getattr(result, name) for name in (*_SUMMARY, "live")}
    if result.waited_for is not None:
        data["waited_for"] = result.waited_for
        summary += (
            f" (after waiting for another replay of this spool, pid {result.waited_for}, "
            "which sent what it held)"
        )
    data["failures"] = [
        {"target": dict(target), "error": describe_error(error)}
        for target, error in failures.values()
    ]
    return data, summary, problems(spool, result, failures, timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 failed, 2 bad usage or input).

    Example:
        >>> import contextlib, io
        >>> from substrax.tracking._cli import main
        >>> with contextlib.redirect_stderr(io.StringIO()) as err:
        ...     main(["replay", "/no/such/run.spool.jsonl"])
        2
        >>> err.getvalue().startswith("python -m substrax.tracking: error: '/no/such/run.spool.jsonl'")
        True
    """
    args = _parser().parse_args(argv)
    command = _plot if args.command == "plot" else _replay  # "replay" or its alias "sync"
    usage = (SpoolNotFoundError, NotASpoolError, NoFileLogError, FileLogValueError)
    usage += (MissingExtraError, PermissionError)
    return run_command(PROG, lambda: command(args), usage=usage, failures=(SpoolBusyError, OSError))


def exit_with_main() -> NoReturn:
    """Run :func:`main` on ``sys.argv`` (warnings logged to stderr) and exit with its status.

    After a replay that gave up on a backend call, it exits at once: an SDK's exit hooks would wait.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    escape_unshowable_output()  # a path an ASCII terminal cannot show fails no replay
    status = main()
    if any(_STUCK):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
