"""Following a run's log: task progress as it happens, a live status line under rich."""

import re
import sys
from collections.abc import Iterable
from typing import TextIO

from substrax.support import optional

from ._environment import EVENT_PREFIX


_STARTED = re.compile(r"task (?P<name>\S+) started \((?P<index>\d+)/(?P<total>\d+)\)")


def progress_line(line: str) -> str | None:
    """A short progress note for a worker event line, or None for ordinary output.

    Example:
        >>> from substrax.compute._display import progress_line
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
    """Print followed log lines, with a live status line of the current task under rich.

    Example:
        >>> from substrax.compute._display import follow
        >>> follow(["[substrax] task a started (1/1)", "[a] hi"])
        --- running a (1/1)
        [a] hi
    """
    out = stream if stream is not None else sys.stdout
    console_module = optional("rich.console")
    console = (
        None
        if console_module is None
        else console_module.Console(file=out, highlight=False, soft_wrap=True)
    )
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
