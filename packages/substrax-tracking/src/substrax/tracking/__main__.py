"""``python -m substrax.tracking``: plot a file log, or replay a spool file.

Commands:
    plot LOG_DIR [--out DIR]     draw the scalar curves of a file log to PNGs and an index.html
    replay SPOOL [--timeout S] [--include-refused]  send the records of a spool file to their backends

``replay`` exits 0 when every record was delivered, 1 when some were not (a backend
unreachable, the time limit reached: they stay in the spool; records a backend refused: moved to
``SPOOL.refused``; lines that are not records: moved to ``SPOOL.bad``), and 2 when the spool file
does not exist or is not a spool file (a directory, a device, a file of other lines: left
untouched) or ``--timeout`` is not a finite number >= 0.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Sequence

from ._plot import plot_log_dir
from ._replay import run_replay
from ._spool import NotASpoolError, SpoolFile, SpoolNotFoundError


_REPLAY_TIMEOUT = 120.0


class _Exit:
    """Whether a replay left a backend call running (then the process ends without waiting)."""

    stuck = False


def _replay(spool: str, *, timeout: float, include_refused: bool) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        result, failures = run_replay(
            SpoolFile(spool), include_refused=include_refused, timeout=timeout or None
        )
    except (SpoolNotFoundError, NotASpoolError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    sys.stdout.write(
        f"delivered {result.delivered}, remaining {result.remaining}"
        + (f", refused {result.refused}" if result.refused else "")
        + "\n"
    )
    for target, failure in failures.values():
        sys.stderr.write(f"error: {dict(target)}: {type(failure).__name__}: {failure}\n")
    if result.bad_lines:
        sys.stderr.write(
            f"error: {len(result.bad_lines)} lines of {spool} are not records: "
            f"{result.describe_bad_lines()}\n"
        )
    if result.refused:
        reasons = "; ".join(sorted(set(result.refused_reasons)))[:2000]
        sys.stderr.write(
            f"error: {result.refused} records were refused by their backend ({reasons}); they "
            f"are kept in {result.refused_file}; --include-refused sends them again\n"
        )
    if result.timed_out:
        _Exit.stuck = True
        sys.stderr.write(
            f"error: stopped after --timeout {timeout:g} s; the {result.remaining} undelivered "
            f"records stay in {spool}; run the replay again when the backend answers\n"
        )
    elif result.remaining:
        sys.stderr.write(
            f"error: {result.remaining} records stay in {spool} (a backend did not take them)\n"
        )
    return 0 if result.remaining == 0 and not result.bad_lines and not result.refused else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m substrax.tracking", description=(__doc__ or "").splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    plot = commands.add_parser("plot", help="draw a file log's scalar curves to PNG and HTML")
    plot.add_argument("log_dir")
    plot.add_argument("--out", default=None, help="output directory (default LOG_DIR/plots)")
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
    args = parser.parse_args(argv)
    if args.command == "plot":
        try:
            page = plot_log_dir(args.log_dir, args.out)
        except (FileNotFoundError, ImportError) as error:
            sys.stderr.write(f"error: {error}\n")
            return 2
        sys.stdout.write(f"{page}\n")
        return 0
    if not math.isfinite(args.timeout) or args.timeout < 0:
        parser.error(
            f"--timeout {args.timeout:g} must be a finite number of seconds >= 0 (0 waits as "
            "long as the backends take)"
        )
    return _replay(args.spool, timeout=args.timeout, include_refused=args.include_refused)


if __name__ == "__main__":
    status = main()
    if _Exit.stuck:  # an SDK's exit hooks would wait for the call the timeout gave up on
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
