"""FileLogger: metrics as JSONL and CSV, hyperparameters as JSON, text, images and histograms."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import operator
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

from substrax.support import check_int, check_seconds, install_hint, optional, write_atomically

from ._base import (
    Logger,
    check_metric_name,
    drain_at_exit,
    histogram_summary,
    prefetch,
    read_scalar,
    safe_name,
    unread_scalar,
    value_ready,
)
from ._errors import FileLogBusyError, FileLogWriteError
from ._media import save_image


__all__ = ["NON_FINITE", "FileLogger", "decode_number", "json_ready", "strict_json"]

#: How the file log writes a float that JSON cannot hold (strict JSON has no NaN or infinity).
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

_logger = logging.getLogger(__name__)


def json_ready(value: Any) -> Any:
    """``value`` as JSON data: numbers, strings, bools, None, lists and dicts; anything else as ``str``.

    Example:
        >>> from substrax.tracking._file import json_ready
        >>> json_ready({"lr": 1e-3, "layers": (2, 3), "act": print})
        {'lr': 0.001, 'layers': [2, 3], 'act': '<built-in function print>'}
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):  # a subclass (np.float64) becomes the builtin number
        return float(value) if isinstance(value, float) else int(value)
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_ready(v) for v in value]
    if getattr(value, "size", None) == 1 and hasattr(value, "item"):
        return json_ready(value.item())
    return str(value)


def _encode_float(number: float) -> float | str:
    if math.isfinite(number):
        return number
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


def strict_json(value: Any) -> Any:
    """JSON data with every NaN or infinite float written as ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``.

    Example:
        >>> import json
        >>> from substrax.tracking._file import strict_json
        >>> json.dumps(strict_json({"min": float("nan"), "edges": [0.0, float("inf")]}))
        '{"min": "NaN", "edges": [0.0, "Infinity"]}'
    """
    if isinstance(value, float):
        return _encode_float(value)
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in cast("dict[str, Any]", value).items()}
    if isinstance(value, list):
        return [strict_json(v) for v in cast("list[Any]", value)]
    return value


def decode_number(value: Any) -> float:
    """A value of the file log as a float: a number, or one of the strings of :data:`NON_FINITE`.

    Raises:
        ValueError: ``value`` is neither.

    Example:
        >>> from substrax.tracking._file import decode_number
        >>> decode_number("-Infinity"), decode_number(0.5)
        (-inf, 0.5)
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    raise ValueError(f"{value!r} is neither a number nor one of {sorted(NON_FINITE)}")


def _complete_text(path: Path) -> tuple[str, bool]:
    """The file's text up to its last newline, and whether a cut-short line followed it.

    Cut as bytes, then decoded: a kill may have cut the last line inside a character.
    """
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    return data[:end].decode("utf-8"), end < len(data)


def _drop_jsonl_past(path: Path, step: int) -> tuple[int, int | None]:
    r"""Rewrite a JSONL log without its records of steps after ``step``.

    Returns:
        how many records it dropped, and the highest step it held (None: none).

    A line that is not a JSON object with an integer ``step`` is kept, except a last line with
    no newline (a write cut short), which is dropped.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.tracking._file import _drop_jsonl_past
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     log = Path(directory) / "run.metrics.jsonl"
        ...     _ = log.write_text('{"step": 1}\n{"step": null}\n{"step": 5}\n{"ste')
        ...     _drop_jsonl_past(log, 2), log.read_text()
        ((2, 5), '{"step": 1}\n{"step": null}\n')
    """
    if not path.exists():
        return 0, None
    highest: int | None = None
    text, cut = _complete_text(path)
    kept: list[str] = []
    for line in text.splitlines(keepends=True):
        try:
            record: object = json.loads(line)
        except ValueError:
            kept.append(line)
            continue
        logged = cast("dict[str, object]", record).get("step") if isinstance(record, dict) else None
        if type(logged) is int:
            highest = logged if highest is None else max(highest, logged)
        if not (type(logged) is int and logged > step):
            kept.append(line)
    dropped = len(text.splitlines()) - len(kept) + cut
    if dropped:
        write_atomically(path, "".join(kept))
    return dropped, highest


def _drop_csv_past(path: Path, step: int) -> None:
    """Rewrite the CSV metric log without its rows of steps after ``step`` (and a cut-short last row)."""
    if not path.exists():
        return
    text, cut = _complete_text(path)
    lines = text.splitlines(keepends=True)
    # row by row: a line damaged with an opening quote cannot swallow the lines after it
    kept = [line for index, line in enumerate(lines) if index == 0 or not _csv_past(line, step)]
    if cut or len(kept) < len(lines):
        write_atomically(path, "".join(kept))


def _csv_past(line: str, step: int) -> bool:
    """Whether a CSV metric line is a row of a step after ``step`` (a line not a row is kept)."""
    try:
        row = next(csv.reader([line]), [])
    except csv.Error:
        return False
    logged = row[1:2]
    return bool(logged) and logged[0].isdigit() and int(logged[0]) > step


def _end_torn_line(path: Path) -> None:
    """Drop a last line a killed process cut short (no newline), so appends start a new line."""
    try:
        with path.open("rb+") as file:
            size = file.seek(0, os.SEEK_END)
            if not size:
                return
            file.seek(-1, os.SEEK_END)
            if file.read(1) == b"\n":
                return
            file.seek(0)
            data = file.read()
            file.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        return
    _logger.warning("%s ended in a line cut short (a killed process); it was dropped", path)


def _hold_log(lock_path: Path, log_dir: Path, name: str) -> BinaryIO | None:
    """Hold an exclusive ``flock`` on ``lock_path``: the open file (None where locks are missing).

    Closing the file (or its collection with a logger dropped unclosed) lets it go.

    Raises:
        FileLogBusyError: another logger (of any process) holds it.
    """
    fcntl = optional("fcntl")
    if fcntl is None:  # Windows: the log is not guarded
        return None
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise FileLogBusyError(
                log_dir, name, int(holder) if holder.isdigit() else None
            ) from None
        except OSError as error:  # a file system without locks (some network mounts)
            os.close(fd)
            _logger.debug("%s cannot be locked (%s); the log is not guarded", lock_path, error)
            return None
        try:
            current = lock_path.stat().st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            held = os.fdopen(fd, "r+b", buffering=0)
            held.truncate(0)
            held.write(str(os.getpid()).encode())
            return held
        os.close(fd)  # a logger closing meanwhile removed the file we locked: lock the new one


class _Appender:
    """One append-only file of a file log: its lines wait here until written, and stay on a failure.

    The bytes are written with ``os.write`` on an ``O_APPEND`` descriptor; a write that stops
    (a full disk: ``ENOSPC``, a file size limit: ``EFBIG``) keeps what was not written, to be
    written first by the next :meth:`write`, so the lines reach the file whole and in order.
    """

    __slots__ = ("dirty", "fd", "path", "waiting")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.waiting = bytearray()
        self.dirty = False  # written since the last sync

    def add(self, text: str) -> None:
        self.waiting += text.encode("utf-8")

    @property
    def lines(self) -> int:
        """How many lines wait (a line written in part counts as one)."""
        return self.waiting.count(b"\n")

    def write(self) -> OSError | None:
        """Write what waits; the error that stopped it (what is left still waits), or None."""
        if not self.waiting:
            return None
        written = 0
        try:
            if self.fd is None:
                self.fd = os.open(
                    self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
                )
            with memoryview(self.waiting) as view:
                while written < len(view):
                    written += os.write(self.fd, view[written:])
        except OSError as error:
            return error
        finally:
            if written:
                del self.waiting[:written]
                self.dirty = True
        return None

    def sync(self) -> OSError | None:
        """``fsync`` what was written since the last sync; the error, or None."""
        if self.fd is None or not self.dirty:
            return None
        try:
            os.fsync(self.fd)
        except OSError as error:
            return error
        self.dirty = False
        return None

    def drop_torn_line(self) -> None:
        """Cut off the part of a line written before a failure, so the file ends with a whole line."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            size = os.fstat(self.fd).st_size
            tail = os.pread(self.fd, min(size, 1 << 16), max(0, size - (1 << 16)))
            if tail and not tail.endswith(b"\n"):
                os.ftruncate(self.fd, size - (len(tail) - tail.rfind(b"\n") - 1))

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class FileLogger(Logger):
    """Write a run's log to files under ``log_dir`` with stable names, so that a resumed run appends.

    Files (``<name>`` made file-safe):

    * ``<name>.metrics.jsonl``: one ``{"time", "step", "name", "value"}`` object per scalar,
      strict JSON: a NaN or infinite value is written as the string ``"NaN"``, ``"Infinity"``
      or ``"-Infinity"`` (:func:`read_scalars` reads them back as floats);
    * ``<name>.metrics.csv``: the same in long form, columns ``time,step,name,value``;
    * ``<name>.hparams.json``: every hyperparameter logged, merged;
    * ``<name>.text.jsonl``: one ``{"time", "step", "name", "text"}`` object per text;
    * ``<name>.histograms.jsonl``: counts, bin edges and statistics per histogram;
    * ``images/`` and ``histograms/``: PNGs (needs matplotlib, the ``plots`` extra; without it
      images are saved as ``.npy`` and histogram plots are skipped, the JSONL is still written).

    Resuming a run from a checkpoint of step ``S``: pass ``resume_step=S``. Before appending,
    the logger rewrites its JSONL and CSV files (metrics, text, histograms; each atomically)
    without the records of steps after ``S``, which the interrupted run logged past its
    checkpoint and the resumed run logs again, so every step appears once. Records at or before
    ``S`` and records without a step are kept; a last line cut short by a killed process (no
    newline) is dropped. Image and histogram files of later steps are overwritten when those
    steps are logged again, not deleted. :attr:`dropped_records` counts what was dropped. A
    ``resume_step`` past every step the log holds, or a log that is not there, is warned about
    (a ``name`` or ``log_dir`` other than the first attempt's?). Without ``resume_step``, a last
    line cut short is dropped too, so that the next record starts a line of its own.

    A jax array logged as a scalar is not read by the call, which would wait for the step that
    computes it: the lines are written at the flush (every ``flush_every`` seconds, during a
    logging call), which reads the values computed by then, in order, up to the first one still
    being computed; that one and the records after it wait for the next flush. :meth:`flush`,
    :meth:`close` and the interpreter's exit, with the logger still open, wait for them all.

    One logger at a time holds a file log: while it is open it holds an exclusive ``flock`` on
    ``<name>.log.lock`` (removed at :meth:`close`), and a second :class:`FileLogger` of the same
    ``name`` and ``log_dir``, in any process, raises :class:`FileLogBusyError` instead of
    writing into (or rewriting) the same files. Where the file system has no ``flock``
    (Windows, some network mounts), the log is not guarded.

    Args:
        name: the logger name, used in the file names.
        log_dir: the directory (created).
        flush_every: seconds between flushes of the metric files (0 flushes every call).
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: write on every process (each into its own ``<name>.p<index>.*`` files).
        resume_step: the step of the checkpoint a resumed run restored; records past it are
            dropped from the files (None: keep everything and append).

    Raises:
        TypeError: ``resume_step`` is not an int.
        ValueError: ``resume_step`` is negative.
        FileLogBusyError: another open logger holds this file log.

    Example:
        >>> import tempfile, pathlib
        >>> from substrax.tracking import FileLogger, read_scalars
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     log_dir = pathlib.Path(directory)
        ...     with FileLogger("demo", log_dir) as logger:
        ...         logger.log_scalar("loss", 0.5, step=1)
        ...     (log_dir / "demo.metrics.csv").read_text().splitlines()[1].split(",")[1:]
        ...     with FileLogger("demo", log_dir) as logger:  # steps 2 and 3, then a preemption
        ...         logger.log_scalars({"loss": 0.4}, step=2)
        ...         logger.log_scalars({"loss": 0.3}, step=3)
        ...     with FileLogger("demo", log_dir, resume_step=2) as logger:  # restored step 2
        ...         logger.log_scalars({"loss": 0.25}, step=3)
        ...     logger.dropped_records, read_scalars(log_dir / "demo.metrics.jsonl")["loss"]
        ['1', 'loss', '0.5']
        (1, [(1, 0.5), (2, 0.4), (3, 0.25)])
    """

    def __init__(
        self,
        name: str,
        log_dir: str | os.PathLike[str],
        *,
        flush_every: float = 1.0,
        process_index: int | None = None,
        all_processes: bool = False,
        resume_step: int | None = None,
    ) -> None:
        super().__init__(name, process_index=process_index, all_processes=all_processes)
        if resume_step is not None:
            check_int("resume_step", resume_step, minimum=0)
        self.resume_step = resume_step
        self.dropped_records = 0
        self.log_dir = Path(log_dir).resolve()
        stem = safe_name(name) + (
            f".p{self.process_index}" if all_processes and self.process_index else ""
        )
        self.stem = stem
        self.metrics_jsonl = self.log_dir / f"{stem}.metrics.jsonl"
        self.metrics_csv = self.log_dir / f"{stem}.metrics.csv"
        self.hparams_json = self.log_dir / f"{stem}.hparams.json"
        self.text_jsonl = self.log_dir / f"{stem}.text.jsonl"
        self.histograms_jsonl = self.log_dir / f"{stem}.histograms.jsonl"
        self.flush_every = check_seconds("flush_every", flush_every)
        # the metric files, and the text and histogram logs: their lines wait in these until
        # written (a full disk keeps them there; see _write_files)
        # (An instance holds at most 30 attributes: past that CPython's attribute lookups, of the
        # per-step call too, get slower. The text and histogram logs are _appenders[2:].)
        self._jsonl: _Appender | None = None
        self._csv: _Appender | None = None
        self._appenders: tuple[_Appender, ...] = ()
        self._failing: dict[Path, str] = {}  # the files whose last write failed, and why
        self._warned_unwritten = False
        self._last_flush = time.time()
        self._names: dict[str, tuple[str, str]] = {}
        # (time, step, encoded name, value) of each scalar logged since the last flush: the
        # lines are formatted at the flush, all at once, off the step-to-step critical path. A
        # value is a float, or a jax array read at a flush once its computation has finished.
        self._pending: list[tuple[float, int | None, tuple[str, str], Any]] = []
        self._unread = 0  # how many values of _pending are jax arrays not read yet
        self._warned_unreadable: set[str] = set()
        self._warned_plots = False
        self._held: BinaryIO | None = None
        if self.active:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.lock_path = self.log_dir / f"{stem}.log.lock"
            self._held = _hold_log(self.lock_path, self.log_dir, stem)
            try:
                self._open(resume_step)
            except BaseException:
                self._release()
                raise

    def _open(self, resume_step: int | None) -> None:
        logs = (self.metrics_jsonl, self.text_jsonl, self.histograms_jsonl)
        if resume_step is not None:
            found = [_drop_jsonl_past(path, resume_step) for path in logs]
            self.dropped_records = sum(dropped for dropped, _ in found)
            _drop_csv_past(self.metrics_csv, resume_step)
            steps = [highest for _, highest in found if highest is not None]
            if not any(path.exists() for path in (*logs, self.metrics_csv)):
                _logger.warning(
                    "FileLogger(%r): resume_step=%d, but %s holds no file log %r (%s); check "
                    "that name and log_dir are the first attempt's",
                    self.name,
                    resume_step,
                    self.log_dir,
                    self.stem,
                    self.metrics_jsonl.name,
                )
            elif max(steps, default=-1) < resume_step:
                _logger.warning(
                    "FileLogger(%r): resume_step=%d, but the file log %s holds steps only up to "
                    "%s; the records of the steps after that are missing from it",
                    self.name,
                    resume_step,
                    self.metrics_jsonl,
                    max(steps) if steps else "none",
                )
        else:
            for path in (*logs, self.metrics_csv):
                _end_torn_line(path)
        jsonl, rows = _Appender(self.metrics_jsonl), _Appender(self.metrics_csv)
        self._appenders = (
            jsonl,
            rows,
            _Appender(self.text_jsonl),
            _Appender(self.histograms_jsonl),
        )
        for appender in (jsonl, rows):  # the metric files are made at once, as they always were
            appender.fd = os.open(
                appender.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
        self._jsonl, self._csv = jsonl, rows
        if rows.fd is not None and os.fstat(rows.fd).st_size == 0:
            rows.add("time,step,name,value\n")
            self._write_files()

    def _release(self) -> None:
        """Let the file log go: close its files and remove the lock."""
        for appender in self._appenders:
            appender.close()
        held, self._held = self._held, None
        if held is not None:
            self.lock_path.unlink(missing_ok=True)  # before the lock goes: never another's file
            held.close()

    def _encoded(self, key: str, value: Any) -> tuple[str, str]:
        encoded = self._names.get(key)
        if encoded is None:
            check_metric_name(key, value)
            buffer = io.StringIO()
            csv.writer(buffer, lineterminator="").writerow([key])
            encoded = self._names[key] = (json.dumps(key), buffer.getvalue())
        return encoded

    def _write_scalar(self, name: str, value: Any, step: int | None) -> None:
        self._write_one(name, value, step, time.time())

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        now = time.time()
        for key, value in metrics.items():
            self._write_one(key, value, step, now)

    def _write_one(self, key: str, value: Any, step: int | None, now: float) -> None:
        """Check one scalar and keep it for the next flush, which writes its lines.

        Right after a training step the interpreter runs several times slower than idle (the
        step left the caches cold and XLA's threads on the cores), so the two lines are formatted
        at the flush, with every other record since the last one, rather than here. A jax array
        is kept unread: the flush reads it once its computation has finished.
        """
        if type(value) is not float:
            value = unread_scalar(key, value)
            if type(value) is not float:  # a jax array, read at a flush
                if not self._unread:
                    drain_at_exit(self)
                self._unread += 1
        if step is not None and type(step) is not int:
            step = operator.index(step)  # np.int64, a jax integer: written as a plain integer
        encoded = self._names.get(key) or self._encoded(key, value)
        self._pending.append((now, step, encoded, value))
        if now - self._last_flush >= self.flush_every:
            self._flush(wait=False)

    def _read_pending(self, wait: bool) -> list[tuple[float, int | None, tuple[str, str], Any]]:
        """Take the pending scalars whose values can be written, in order, reading jax arrays.

        Without ``wait``, up to the first jax array whose computation still runs (that one and
        the scalars after it wait for a later flush), so that the training thread never waits
        for a step; with it, all of them. A value that cannot be read (its buffer deleted) is
        skipped with a warning.
        """
        pending = self._pending
        if not self._unread:
            self._pending = []
            return pending
        end = len(pending)
        if not wait:
            end = next(
                (
                    index
                    for index, entry in enumerate(pending)
                    if type(entry[3]) is not float and not value_ready(entry[3])
                ),
                end,
            )
        taken, self._pending = pending[:end], pending[end:]
        self._unread = sum(type(entry[3]) is not float for entry in self._pending)
        prefetch(entry[3] for entry in taken if type(entry[3]) is not float)
        ready: list[tuple[float, int | None, tuple[str, str], Any]] = []
        for entry in taken:
            now, step, encoded, value = entry
            if type(value) is float:
                ready.append(entry)
                continue
            name = json.loads(encoded[0])
            number = read_scalar(repr(self), name, value, step, self._warned_unreadable)
            if number is not None:
                ready.append((now, step, encoded, number))
        return ready

    def _write_pending(self, wait: bool = True) -> None:
        """Format the lines of the scalars logged since the last flush, for the metric files."""
        jsonl, rows = self._jsonl, self._csv
        if jsonl is None or rows is None:
            return
        pending = self._read_pending(wait)
        if not pending:
            return
        json_lines: list[str] = []
        csv_lines: list[str] = []
        for now, step, (json_name, csv_name), number in pending:
            if math.isfinite(number):
                text = repr(number)
            else:
                text = (
                    '"NaN"'
                    if math.isnan(number)
                    else ('"Infinity"' if number > 0 else '"-Infinity"')
                )
            shown = "null" if step is None else f"{step:d}"
            json_lines.append(
                f'{{"time":{now!r},"step":{shown},"name":{json_name},"value":{text}}}\n'
            )
            csv_lines.append(f"{now!r},{'' if step is None else step},{csv_name},{number!r}\n")
        jsonl.add("".join(json_lines))
        rows.add("".join(csv_lines))

    def _write_files(self) -> bool:
        """Write every line waiting, file by file; whether all were written.

        A file that cannot be written (a full disk) keeps its lines waiting, in order, for the
        next write: no logging call raises for it. The first failure is warned about once,
        naming the file; the warning's logger is ``substrax.tracking._file``.
        """
        failed: dict[Path, str] = {}
        for appender in self._appenders:
            if appender.waiting:
                error = appender.write()
                if error is not None:
                    failed[appender.path] = f"{type(error).__name__}: {error.strerror or error}"
        if failed and not self._failing:
            if not self._warned_unwritten:
                self._warned_unwritten = True
                _logger.warning(
                    "FileLogger(%r): %s cannot be written (%s); its lines wait in memory, in "
                    "order, and are written once there is room (this is reported once; close() "
                    "raises FileLogWriteError if they still cannot be written then)",
                    self.name,
                    " and ".join(str(path) for path in failed),
                    "; ".join(sorted(set(failed.values()))),
                )
        elif self._failing and not failed:
            _logger.info("FileLogger(%r): the lines that waited are written", self.name)
        self._failing = failed
        return not failed

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        merged: dict[str, Any] = {}
        if self.hparams_json.exists():
            merged = json.loads(self.hparams_json.read_text(encoding="utf-8"))
        merged.update(strict_json(json_ready(params)))
        text = json.dumps(merged, indent=2, sort_keys=True, allow_nan=False)
        write_atomically(self.hparams_json, text + "\n")

    def _append(self, appender: _Appender, record: dict[str, Any]) -> None:
        appender.add(json.dumps(strict_json(record), allow_nan=False) + "\n")
        self._write_files()

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._append(
            self._appenders[2], {"time": time.time(), "step": step, "name": name, "text": text}
        )

    def _media_path(self, kind: str, name: str, step: int | None, index: int, suffix: str) -> Path:
        folder = self.log_dir / kind
        folder.mkdir(exist_ok=True)
        step_part = "" if step is None else f"_step{step}"
        index_part = f"_{index}" if index else ""
        return folder / f"{self.stem}.{safe_name(name)}{step_part}{index_part}{suffix}"

    def _pyplot_missing(self) -> bool:
        if optional("matplotlib") is None:
            if not self._warned_plots:
                self._warned_plots = True
                _logger.warning(
                    "matplotlib is not installed, so images are saved as .npy and histogram plots "
                    "are skipped; %s",
                    install_hint("substrax-tracking", "plots"),
                )
            return True
        return False

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        self._pyplot_missing()
        for index, image in enumerate(images):
            save_image(self._media_path("images", name, step, index, ""), image)

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        summary = histogram_summary(values)
        self._append(
            self._appenders[3], {"time": time.time(), "step": step, "name": name, **summary}
        )
        if self._pyplot_missing() or not summary["counts"]:
            return
        from matplotlib.figure import Figure  # noqa: PLC0415

        figure = Figure(figsize=(5, 3))
        axes = figure.add_subplot()
        edges = summary["edges"]
        axes.stairs(summary["counts"], edges, fill=True)
        axes.set_title(f"{name}" + ("" if step is None else f" (step {step})"))
        figure.savefig(self._media_path("histograms", name, step, 0, ".png"), dpi=80)

    def flush(self) -> None:
        """Write every line logged so far to disk and ``fsync`` it, waiting for jax values still computed.

        After it returns, a kill of the process (SIGKILL included), or of the machine, loses no
        record logged before the call: call it before saving a checkpoint (see
        ``CheckpointCallback(flush=...)``). On a full disk it does not raise: the lines wait
        in memory (warned about once) and the next flush writes them.
        """
        self._flush(wait=True)
        if not self._failing:
            self._sync()

    def _sync(self) -> None:
        for appender in self._appenders:
            error = appender.sync()
            if error is not None:
                _logger.warning(
                    "FileLogger(%r): fsync of %s failed: %s", self.name, appender.path, error
                )

    def _flush(self, *, wait: bool) -> None:
        """Write the buffered lines; without ``wait``, only up to a jax value still computed."""
        self._last_flush = time.time()
        if self._jsonl is not None and self._jsonl.fd is not None:
            self._write_pending(wait)
            self._write_files()

    def _close(self) -> None:
        try:
            self._flush(wait=True)
            self._sync()
            left = [appender for appender in self._appenders if appender.waiting]
            for appender in left:
                appender.drop_torn_line()
        finally:
            self._release()
        if left:
            first, others = left[0], left[1:]
            reason = self._failing.get(first.path, "it could not be written")
            if others:
                reason += "; " + ", ".join(f"{a.lines} lines of {str(a.path)!r}" for a in others)
                reason += " were not written either"
            raise FileLogWriteError(first.path, first.lines, reason)
