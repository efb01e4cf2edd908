"""The one shape of every substrax command line: exit codes, error lines, ``--json``.

Every entry (``substrax-compute``, ``python -m substrax.checkpoint``, ``python -m
substrax.tracking``, the managed-env CLI) exits 0 when it did its work, 1 when the operation
failed (a broken step, an unreachable server), 2 for bad usage or input (a misspelled path, a
malformed file); argparse's own usage errors are exit 2 too; Ctrl-C exits 130, as a shell
reports SIGINT. Errors are one line on stderr, ``<prog>: error: <message>``, the prefix argparse
uses, and never a traceback.
"""

import argparse
import contextlib
import io
import json
import os
import select
import sys
from collections.abc import Callable
from typing import Final

from ._pickling import PicklableError


EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141  # a shell's code for a writer whose reader went (``| head``)


class UsageError(PicklableError, ValueError):
    """Bad input on a command line that argparse could not catch (exit 2).

    Example:
        >>> from substrax.support import UsageError
        >>> str(UsageError("no job named 'dmeo'; known: demo"))
        "no job named 'dmeo'; known: demo"
    """

    __module__ = "substrax.support"


class CommandFailedError(PicklableError, RuntimeError):
    """The command's operation failed, its input was fine (exit 1).

    Example:
        >>> from substrax.support import CommandFailedError
        >>> str(CommandFailedError("2 steps failed verification"))
        '2 steps failed verification'
    """

    __module__ = "substrax.support"


def error_line(prog: str, error: BaseException | str) -> str:
    """The one line a command prints for ``error``: ``<prog>: error: <message>``.

    A ``KeyError``'s message is its argument, not its quoted repr.

    Example:
        >>> from substrax.support import error_line
        >>> error_line("substrax-compute", KeyError("no job named 'x'"))
        "substrax-compute: error: no job named 'x'"
    """
    if isinstance(error, KeyError) and error.args:
        message = str(error.args[0])
    else:
        message = str(error) or type(error).__name__
    return f"{prog}: error: {message}"


def describe_error(error: BaseException) -> str:
    """``error`` as ``Type: message`` on one line (an SDK's message may span several).

    Example:
        >>> from substrax.support import describe_error
        >>> describe_error(ConnectionError("no server" + chr(10) + "  at 127.0.0.1"))
        'ConnectionError: no server at 127.0.0.1'
    """
    return " ".join(f"{type(error).__name__}: {error}".split())


def run_command(
    prog: str,
    command: Callable[[], int],
    *,
    usage: tuple[type[BaseException], ...] = (),
    failures: tuple[type[BaseException], ...] = (),
) -> int:
    """Run ``command``; a raised error becomes its one line on stderr and its exit code.

    :class:`UsageError` and the ``usage`` types exit 2; :class:`CommandFailedError` and the
    ``failures`` types exit 1; Ctrl-C (``KeyboardInterrupt``) exits 130 with one line; a reader
    that closed the output (``| head``) ends it quietly, 141 as a shell has it. Anything else is
    a bug and keeps its traceback.

    Example:
        >>> from substrax.support import UsageError, run_command
        >>> def broken() -> int:
        ...     raise UsageError("no such directory: /nope")
        >>> import contextlib, io
        >>> with contextlib.redirect_stderr(io.StringIO()) as err:
        ...     run_command("demo", broken)
        2
        >>> print(err.getvalue(), end="")
        demo: error: no such directory: /nope
    """
    try:
        return command()
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return EXIT_INTERRUPTED
    except BaseException as error:
        if isinstance(error, BrokenPipeError) and _stdout_gone():
            with contextlib.suppress(AttributeError, OSError):  # no file under stdout
                # what waits in its buffer then goes nowhere, with no error at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        if not isinstance(error, (UsageError, CommandFailedError, *usage, *failures)):
            raise
        with contextlib.suppress(AttributeError, OSError):  # a stderr that is gone: the code
            sys.stderr.write(error_line(prog, error) + "\n")  # still tells
        return EXIT_USAGE if isinstance(error, (UsageError, *usage)) else EXIT_FAILED


def _stdout_gone() -> bool:
    """Whether stdout's reader went (``| head`` ended): a broken pipe of another file is not."""
    if sys.stdout is None:
        return False
    try:
        sys.stdout.flush()  # what the failed write left in the buffer fails again
        poller, fd = select.poll(), sys.stdout.fileno()
    except BrokenPipeError:
        return True
    except (OSError, ValueError, AttributeError):  # closed, or no file under it (a capture)
        return False
    poller.register(fd, select.POLLOUT)  # a pipe whose reader went reports an error
    return any(event & select.POLLERR for _, event in poller.poll(0))


def int_argument(
    name: str, *, minimum: int = 0, maximum: int | None = None
) -> Callable[[str], int]:
    """An argparse ``type=`` for a whole number from ``minimum`` to ``maximum`` (if given).

    Other text is a usage error naming the bounds.

    Raises:
        ValueError: ``maximum`` is below ``minimum``.

    Example:
        >>> import argparse
        >>> from substrax.support import int_argument
        >>> parser = argparse.ArgumentParser(prog="tool")
        >>> _ = parser.add_argument("step", type=int_argument("step"))
        >>> parser.parse_args(["12"]).step
        12
        >>> int_argument("step")("-1")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: step takes an integer >= 0, not '-1'
        >>> int_argument("seed", maximum=9)("10")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: seed takes an integer from 0 to 9, not '10'
    """
    if maximum is not None and maximum < minimum:
        raise ValueError(f"int_argument({name!r}): maximum={maximum} is below minimum={minimum}")
    bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{name} takes an integer {bounds}, not {text!r}")
        return value

    return parse


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` the ``--json`` flag every table-printing command has.

    Example:
        >>> import argparse
        >>> from substrax.support import add_json_flag
        >>> parser = argparse.ArgumentParser()
        >>> add_json_flag(parser)
        >>> parser.parse_args(["--json"]).json
        True
    """
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def emit(data: object, text: str, *, as_json: bool) -> None:
    """Print ``data`` as indented JSON when ``as_json``, else the human ``text`` (no stdout: nothing).

    The JSON is strict: a NaN or infinite float is its text (``"NaN"``, ``"Infinity"``), as
    the file log writes it, since a strict parser refuses JSON's non-standard constants.

    Example:
        >>> from substrax.support import emit
        >>> emit({"step": 1}, "step 1", as_json=False)
        step 1
        >>> emit({"step": 1, "loss": float("nan")}, "step 1", as_json=True)
        {
          "step": 1,
          "loss": "NaN"
        }
    """
    if sys.stdout is None:  # closed (``>&-``): nowhere to show it; the command's work stands
        return
    if as_json:  # through JSON and back: its non-finite constants become their text
        text = json.dumps(json.loads(json.dumps(data), parse_constant=str), indent=2)
    sys.stdout.write(text + "\n")


def escape_unshowable_output() -> None:
    r"""Make ``sys.stdout`` and ``sys.stderr`` escape what their encoding cannot show.

    A command's entry point calls it: a path an ASCII terminal (``LANG=C``,
    ``PYTHONIOENCODING=ascii``) cannot show is printed as ``\xe9``, never failing a command
    that did its work. A closed stream (None) or one that is no text file is left alone.

    Example:
        >>> from substrax.support import escape_unshowable_output
        >>> escape_unshowable_output()
    """
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
