"""What the CLI shows: live task progress while following, tables; rich when installed."""

import re
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TextIO

from .worker import EVENT_PREFIX


if TYPE_CHECKING:
    from rich.console import Console


_STARTED = re.compile(r"task (?P<name>\S+) started \((?P<index>\d+)/(?P<total>\d+)\)")


def _rich_console(stream: TextIO) -> "Console | None":
    try:
        from rich.console import Console  # noqa: PLC0415 - optional, the `rich` extra
    except ImportError:
        return None
    return Console(file=stream, highlight=False, soft_wrap=True)


def progress_line(line: str) -> str | None:
    """A short progress note for a worker event line, or None for ordinary output.

    Example:
        >>> progress_line("[substrax] task a started (1/3)")
        'running a (1/3)'
        >>> progress_line("[a] hello") is None
        True
    """
    if not line.startswith(EVENT_PREFIX):
        return None
    event = line.removeprefix(EVENT_PREFIX)
    if match := _STARTED.fullmatch(event):
        return f"running {match['name']} ({match['index']}/{match['total']})"
    return event


def follow(lines: Iterable[str], *, stream: TextIO | None = None) -> None:
    """Print followed log lines, with a live status line of the current task under rich."""
    out = stream if stream is not None else sys.stdout
    console = _rich_console(out)
    if console is None or not console.is_terminal:
        for line in lines:
            note = progress_line(line)
            out.write(f"{'--- ' + note if note and line.startswith(EVENT_PREFIX) else line}\n")
            out.flush()
        return
    with console.status("starting") as status:
        for line in lines:
            note = progress_line(line)
            if note is None:
                console.print(line, markup=False)
                continue
            status.update(note)
            if not _STARTED.fullmatch(line.removeprefix(EVENT_PREFIX)):
                console.print(note, style="bold", markup=False)


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, stream: TextIO | None = None
) -> None:
    """Print ``rows`` under ``headers``: a rich table on a terminal, aligned plain text otherwise.

    Example:
        >>> import io
        >>> buffer = io.StringIO()
        >>> table(["id", "state"], [["a", "running"]], stream=buffer)
        >>> print(buffer.getvalue().rstrip())
        id  state
        a   running
    """
    out = stream if stream is not None else sys.stdout
    console = _rich_console(out)
    if console is not None and console.is_terminal:
        from rich.table import Table  # noqa: PLC0415

        rich_table = Table(*headers)
        for row in rows:
            rich_table.add_row(*row)
        console.print(rich_table)
        return
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]
    for row in [headers, *rows]:
        out.write(
            "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() + "\n"
        )
