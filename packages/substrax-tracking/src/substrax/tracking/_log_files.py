"""The files of a file log: lines appended whole and in order, the log's lock, a resume's rewrite.

The metric JSONL and CSV get one line per scalar each, the JSONL's first: a kill between the two
writes leaves one a few records ahead, which :func:`complete_metric_logs` mends on open.
"""

# ruff: noqa: ANN401  (logged values of any framework are typed Any on purpose)

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

from substrax.support import optional, write_atomically

from ._errors import FileLogBusyError


#: How the file log writes the floats that strict JSON cannot hold.
NON_FINITE = ("NaN", "Infinity", "-Infinity")
#: The first line of the metric CSV.
CSV_HEADER = "time,step,name,value\n"

_logger = logging.getLogger(__name__)
_opened: set[Path] = set()  # the metric logs this process opened (a reopen is no new run)


class RunLogHandler(logging.FileHandler):
    """A FileLogger's ``<name>.log`` handler, which a ConsoleLogger does not count as foreign."""


def json_ready(value: Any, _within: tuple[int, ...] = ()) -> Any:
    """``value`` as JSON data (numbers, strings, bools, None, lists, dicts); anything else as str.

    Example:
        >>> from substrax.tracking._log_files import json_ready
        >>> json_ready({"lr": 1e-3, "layers": (2, 3), "act": print})
        {'lr': 0.001, 'layers': [2, 3], 'act': '<built-in function print>'}
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):  # a subclass (np.float64) becomes the builtin number
        return float(value) if isinstance(value, float) else int(value)
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        if id(value) in _within:
            what = type(value).__name__
            raise ValueError(f"a {what} holds itself (a cycle); log a copy without the cycle")
        _within = (*_within, id(value))
        if not isinstance(value, Mapping):
            return [json_ready(v, _within) for v in value]
        ready = {str(k): json_ready(v, _within) for k, v in value.items()}
        if len(ready) < len(value):  # {1: 2, "1": 3}
            keys = [k for k in value if list(map(str, value)).count(str(k)) > 1]
            raise ValueError(f"the keys {keys!r} are one name once written; rename one of them")
        return ready
    if getattr(value, "size", None) == 1 and hasattr(value, "item"):
        return json_ready(value.item())
    return str(value)


def strict_json(value: Any) -> Any:
    """JSON data with each NaN or infinite float as one of the strings of :data:`NON_FINITE`."""
    return json.loads(json.dumps(value), parse_constant=str)


def decode_number(value: Any) -> float:
    """A file log's value as a float: a number, or one of :data:`NON_FINITE` (else ValueError)."""
    if (isinstance(value, int | float) and not isinstance(value, bool)) or value in NON_FINITE:
        return float(value)
    raise ValueError(f"{value!r} is neither a number nor one of {sorted(NON_FINITE)}")


def jsonl_step(line: str) -> int | None:
    """The integer ``step`` of a JSONL record; None for any other line."""
    try:
        record: object = json.loads(line)
    except ValueError:
        return None
    step = cast("dict[str, object]", record).get("step") if isinstance(record, dict) else None
    return step if type(step) is int else None


def csv_step(line: str) -> int | None:
    """The step of a CSV metric row; None for the header or a damaged line."""
    try:
        row = next(csv.reader([line]), [])
    except csv.Error:
        return None
    return int(row[1]) if len(row) > 1 and row[1].isdigit() else None


def drop_past(path: Path, step: int, step_of: Callable[[str], int | None]) -> tuple[int, int]:
    r"""Rewrite a log without its lines of steps after ``step`` and a cut-short last line.

    Returns how many lines it dropped, and the highest step it held (-1: none).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.tracking._log_files import drop_past, jsonl_step
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     log = Path(directory) / "run.metrics.jsonl"
        ...     _ = log.write_text('{"step": 1}\n{"step": null}\n{"step": 5}\n{"ste')
        ...     drop_past(log, 2, jsonl_step), log.read_text()
        ((2, 5), '{"step": 1}\n{"step": null}\n')
    """
    if not path.exists():
        return 0, -1
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    lines = [line + "\n" for line in data[:end].decode("utf-8").split("\n")[:-1]]  # not \u2028
    steps = [step_of(line) for line in lines]
    kept = [line for line, at in zip(lines, steps, strict=True) if at is None or at <= step]
    dropped = len(lines) - len(kept) + (end < len(data))
    if dropped:
        write_atomically(path, "".join(kept))
    return dropped, max((at for at in steps if at is not None), default=-1)


def hold_log(
    lock_path: Path, log_dir: Path, name: str, logger: str = "FileLogger", what: str = "file log"
) -> BinaryIO | None:
    """Hold an exclusive ``flock`` on ``lock_path`` until the file returned (None: no locks) closes.

    Raises FileLogBusyError when another ``logger`` (of any process) holds it.
    """
    fcntl = optional("fcntl")  # None on Windows
    if fcntl is None:
        return None
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            pid = int(holder) if holder.isdigit() else None
            raise FileLogBusyError(log_dir, name, pid, logger, what) from None
        except OSError as error:  # a file system without locks (some network mounts)
            os.close(fd)
            _logger.debug("%s cannot be locked (%s); the log is not guarded", lock_path, error)
            return None
        with contextlib.suppress(FileNotFoundError):
            if lock_path.stat().st_ino == os.fstat(fd).st_ino:
                held = os.fdopen(fd, "r+b", buffering=0)
                with contextlib.suppress(OSError):  # only names the holder (a full disk: none)
                    held.truncate(0)
                    held.write(str(os.getpid()).encode())
                return held
        os.close(fd)  # a logger closing meanwhile removed the file we locked: lock the new one


def let_go(lock_path: Path, held: BinaryIO) -> None:
    """Remove the lock file while still holding it (never another's), then let go of it."""
    lock_path.unlink(missing_ok=True)
    held.close()


class Appender:
    """One append-only file: lines wait here until written; a write that stops keeps the rest."""

    __slots__ = ("fd", "path", "waiting")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.waiting = bytearray()

    def open(self) -> int:
        """The file's descriptor, opened (and the file created) on the first call."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self.fd

    def add(self, text: str) -> None:
        """Add lines to write (a lone surrogate, which UTF-8 cannot hold, written escaped)."""
        self.waiting += text.encode("utf-8", "backslashreplace")

    def write(self) -> OSError | None:
        """Write what waits; the error that stopped it, or None."""
        written = 0
        try:
            fd = self.open()
            with memoryview(self.waiting) as view:
                while written < len(view):
                    written += os.write(fd, view[written:])
        except OSError as error:
            return error
        finally:
            del self.waiting[:written]
        return None

    def drop_torn_line(self) -> bool:
        """Cut off a last line written in part (no newline); whether there was one."""
        fd = self.open()
        size = os.fstat(fd).st_size
        if not size or os.pread(fd, 1, size - 1) == b"\n":
            return False
        os.ftruncate(fd, os.pread(fd, size, 0).rfind(b"\n") + 1)
        return True

    def close(self) -> None:
        """Close the file; a later write opens it again."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def csv_field(name: str) -> str:
    """``name`` as a CSV field (quoted when it holds a comma or a quote)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow([name])
    return buffer.getvalue()


def metric_lines(
    now: float, step: int | None, names: tuple[str, str], number: float
) -> tuple[str, str]:
    r"""The JSONL line and the CSV row of a scalar; ``names``: its name as JSON and as CSV field.

    Example:
        >>> from substrax.tracking._log_files import metric_lines
        >>> metric_lines(1.5, 3, ('"loss"', "loss"), float("nan"))
        ('{"time":1.5,"step":3,"name":"loss","value":"NaN"}\n', '1.5,3,loss,nan\n')
    """
    json_name, csv_name = names
    text = repr(number) if math.isfinite(number) else f'"{json.dumps(number)}"'
    shown = "null" if step is None else str(step)
    line = f'{{"time":{now!r},"step":{shown},"name":{json_name},"value":{text}}}\n'
    row = f"{now!r},{'' if step is None else step},{csv_name},{number!r}\n"
    return line, row


def _row_of(line: str) -> str | None:
    """The CSV row of a JSONL metric line; None for another line."""
    try:
        record = json.loads(line)
        now, step, name = record["time"], record["step"], record["name"]
        number = decode_number(record["value"])
    except (ValueError, KeyError, TypeError):  # not JSON, not a dict, a key or value missing
        return None
    if type(now) is not float or type(name) is not str or not (step is None or type(step) is int):
        return None
    return metric_lines(now, step, (json.dumps(name), csv_field(name)), number)[1]


def _line_of(row: str) -> str | None:
    """The JSONL line of a CSV metric row; None for the header or another line."""
    try:
        now, step, name, value = next(csv.reader([row]), [])
        number, at = float(value), int(step) if step else None
        return metric_lines(float(now), at, (json.dumps(name), csv_field(name)), number)[0]
    except (csv.Error, ValueError):  # another number of fields, or one not a number
        return None


def warn_of_earlier_run(owner: str, logs: tuple[Path, ...], *, resumed: bool) -> None:
    """Warn if the JSONL ``logs`` (metrics first) hold records a new run's are added after.

    Not for a resumed run, nor for logs this process opened before (a script that closes its
    log after training and opens it again for the test metrics), nor in a forked child.
    """
    if logs[0] in _opened:
        return
    _opened.add(logs[0])
    if resumed or not any(path.exists() and path.stat().st_size for path in logs):
        return
    found = next(_backwards(logs[0], jsonl_step), None)  # the last record with a step
    last = "" if found is None else f" (the last at step {found[1]})"
    _logger.warning(
        f"{owner}: {logs[0].parent} holds an earlier run's records{last}; this run's are added "
        "after them. Pass resume_step= to resume it, or give a new run its own name or log_dir"
    )


def _backwards[T](path: Path, convert: Callable[[str], T | None]) -> Iterator[tuple[str, T]]:
    """``(line, convert(line))`` for each line of ``path`` it converts, the last line first."""
    with contextlib.suppress(FileNotFoundError), path.open("rb") as file:
        end, head = file.seek(0, os.SEEK_END), b""  # head: a line begun in an earlier block
        while end:
            start = max(0, end - (1 << 16))
            file.seek(start)
            pieces = (file.read(end - start) + head).split(b"\n")
            head, end = (pieces.pop(0) if start else b""), start
            for piece in reversed(pieces[:-1] if pieces[-1] == b"" else pieces):
                line = piece.decode("utf-8", "replace") + "\n"
                converted = convert(line)
                if converted is not None:
                    yield line, converted


def _missing(jsonl: Path, table: Path) -> tuple[list[str], list[str]] | None:
    """The CSV rows ``table`` lacks and the JSONL lines ``jsonl`` lacks (one list empty).

    Each file is read from its end, in turns. None: neither holds the other's last record.
    """
    scans = [_backwards(jsonl, _row_of), _backwards(table, _line_of)]
    records = [next(scan, None) for scan in scans]  # the record each scan is at
    # what each scan looks for: the other file's last record, written as this file writes it
    wanted = [None if record is None else record[0] for record in reversed(records)]
    past: tuple[list[str], list[str]] = ([], [])  # each scan's records, converted, last first
    open_scans = [0, 1]
    while open_scans:
        for side in list(open_scans):
            record = records[side]
            if record is None:
                open_scans.remove(side)
                if wanted[side] is not None:
                    continue  # this file does not hold the other's last record
            if record is None or record[1] == wanted[side]:  # all of this file, or its part past
                lacking = past[side][::-1]
                return (lacking, []) if side == 0 else ([], lacking)
            past[side].append(record[1])
            records[side] = next(scans[side], None)
    return None


def complete_metric_logs(jsonl: Appender, table: Appender) -> int:
    """Add to the metric JSONL and CSV what the other holds past its last record; how many records.

    The records wait in the appenders for the next write. Files that do not end alike (edited by
    hand) get a CSV rewritten from the JSONL, with a warning.
    """
    missing = _missing(jsonl.path, table.path)
    if missing is None:
        _logger.warning(
            f"{jsonl.path} and {table.path} do not end with the same records; the CSV is "
            "rewritten from the JSONL"
        )
        os.ftruncate(table.open(), 0)
        table.add(CSV_HEADER)
        missing = _missing(jsonl.path, table.path) or ([], [])  # every record of the JSONL
    rows, lines = missing
    for appender, lacking, other in ((jsonl, lines, table), (table, rows, jsonl)):
        if lacking:
            appender.add("".join(lacking))
            _logger.warning(
                f"{appender.path} lacked the last {len(lacking)} records of {other.path} (a kill "
                "between the writes of the two, or a full disk); they are added to it"
            )
    return len(rows) + len(lines)
