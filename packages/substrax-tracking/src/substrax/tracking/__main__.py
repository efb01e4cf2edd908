"""``python -m substrax.tracking``: plot a file log, or replay a spool file.

Commands:
    plot LOG_DIR [--out DIR]     draw the scalar curves of a file log to PNGs and an index.html
    replay SPOOL [--include-refused]  send the records of a spool file to their backends
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._plot import plot_log_dir
from ._spool import replay_spool


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
        "--include-refused", action="store_true", help="also retry records a backend refused"
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
    result = replay_spool(args.spool, include_refused=args.include_refused)
    sys.stdout.write(f"delivered {result.delivered}, remaining {result.remaining}\n")
    return 0 if result.remaining == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
