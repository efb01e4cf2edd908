"""Tables on a terminal and in a pipe: aligned plain text, rich when it is installed."""

import sys
from collections.abc import Sequence
from typing import TextIO

from ._optional import optional


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``rows`` under ``headers`` as aligned plain text, a rule under the headers; None is ``-``.

    Example:
        >>> from substrax.support import format_table
        >>> print(format_table(["step", "loss"], [[1, 0.5], [20, None]]))
        step  loss
        ----  ----
        1     0.5
        20    -
    """
    cells = [
        [str(cell) for cell in headers],
        *[["-" if cell is None else str(cell) for cell in row] for row in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, stream: TextIO | None = None
) -> None:
    """Print a table: rich's on a terminal when rich is installed, :func:`format_table`'s else.

    Example:
        >>> from substrax.support import print_table
        >>> print_table(["id", "state"], [["a", "running"]])
        id  state
        --  -------
        a   running
    """
    out = stream if stream is not None else sys.stdout
    console_module = optional("rich.console")
    if console_module is not None:
        console = console_module.Console(file=out, highlight=False, soft_wrap=True)
        if console.is_terminal:
            table = optional("rich.table").Table(*headers)  # pyright: ignore[reportOptionalMemberAccess]
            for row in rows:
                table.add_row(*("-" if cell is None else str(cell) for cell in row))
            console.print(table)
            return
    out.write(format_table(headers, rows) + "\n")
