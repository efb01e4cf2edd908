"""FileLogger: a run's metrics as JSONL and CSV; its hyperparameters, text, images, histograms."""

# ruff: noqa: ANN401  (logged values and SDK objects are typed Any on purpose)

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from substrax.support import check_seconds, install_hint, optional, write_atomically

from ._base import Logger, check_resume_step, histogram_of
from ._due_writer import DueWriter
from ._errors import FileLogWriteError
from ._hparams import merge_params
from ._log_files import (
    CSV_HEADER,
    Appender,
    RunLogHandler,
    complete_metric_logs,
    csv_field,
    csv_step,
    drop_past,
    hold_log,
    json_ready,
    jsonl_step,
    let_go,
    metric_lines,
    strict_json,
    warn_of_earlier_run,
)
from ._media import ImageWriter, media_written, save_image, save_plot, take_media_name
from ._paths import ensure_writable_dir, file_part, log_stem
from ._values import (
    checked_scalar,
    checked_scalars,
    drain_at_exit,
    prefetch,
    read_scalar,
    value_ready,
)


__all__ = ["FileLogger", "json_ready"]

_logger = logging.getLogger(__name__)
_Pending = tuple[float, int | None, str, Any]  # (time, step, name, value: a float or a jax array)


class FileLogger(Logger):
    """Write a run's log under ``log_dir``, in files of stable names that a resumed run appends to.

    Files: ``<name>.metrics.jsonl`` (strict JSON: NaN as ``"NaN"``) and ``<name>.metrics.csv``
    (:attr:`metrics_file`), ``<name>.hparams.json``, ``<name>.text.jsonl``,
    ``<name>.histograms.jsonl``, PNGs in ``images/`` and ``histograms/`` (images as ``.npy``
    without matplotlib, the ``plots`` extra), and :attr:`log_file` (``<name>.log``, the messages
    of :meth:`info` & co.). ``resume_step=S`` first drops the records of steps after ``S``, which
    the resumed run logs again (:attr:`dropped_records` counts them). On a full disk no call
    raises: the lines wait in memory until there is room. It has no ``log_artifact``.

    Args:
        name: the logger name, used in the file names.
        log_dir: the directory (created).
        flush_every: seconds between flushes of the metric files (0 flushes every call); what
            no later call wrote is written that long after it was logged, on a timer's thread.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: write on every process (each into its own ``<name>.p<index>.*`` files).
        resume_step: the step of the checkpoint a resumed run restored (None: a new run, added
            after any records there, with a warning).

    Raises:
        TypeError: ``resume_step`` is not an int.
        ValueError: ``resume_step`` is negative.
        FileLogBusyError: another open logger holds this file log.
        LogDirNotWritableError: ``log_dir`` cannot be created or written.

    Example:
        >>> import tempfile, pathlib
        >>> from substrax.tracking import FileLogger, read_scalars
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     log_dir = pathlib.Path(directory)
        ...     with FileLogger("demo", log_dir) as logger:
        ...         logger.log_scalar("loss", 0.5, step=1)
        ...     (log_dir / "demo.metrics.csv").read_text().splitlines()[1].split(",")[1:]
        ...     with FileLogger("demo", log_dir, resume_step=1) as logger:  # then a preemption
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
        self.resume_step = check_resume_step(resume_step)
        self.dropped_records = 0
        self.log_dir = Path(log_dir).resolve()
        self.stem = log_stem(name, self.process_index, all_processes=all_processes)
        self.flush_every = check_seconds("flush_every", flush_every)
        # one tuple: with over 30 attributes, each lookup of the per-step call is slower
        self._files = tuple(
            Appender(self.log_dir / f"{self.stem}.{kind}")
            for kind in ("metrics.jsonl", "metrics.csv", "text.jsonl", "histograms.jsonl")
        )
        self.metrics_jsonl, self.metrics_csv, self.text_jsonl, self.histograms_jsonl = (
            file.path for file in self._files
        )
        self.hparams_json = self.log_dir / f"{self.stem}.hparams.json"
        self.lock_path = self.log_dir / f"{self.stem}.log.lock"
        self.log_file = self.log_dir / f"{self.stem}.log"
        self.metrics_file = self.metrics_csv
        self._handler: logging.Handler | None = None
        self._failing: dict[Path, str] = {}  # the files whose last write failed, and why
        self._warned_unwritten = self._warned_plots = False
        self._warned_unreadable: set[str] = set()
        self._last_flush = time.time()
        self._names: dict[str, tuple[str, str]] = {}  # a metric name, as JSON and as CSV
        # a deque's append is atomic, so threads log without a lock; a flush pops under _lock
        self._pending: deque[_Pending] = deque()
        self._lock = threading.RLock()
        self._writer: DueWriter | None = None  # writes what waits, though no call comes
        self._unread = 0  # how many values of _pending are jax arrays
        self._images = ImageWriter(f"FileLogger({name!r}) images")
        self._held: BinaryIO | None = None
        if self.active:
            ensure_writable_dir(self.log_dir, "FileLogger")
            self._held = hold_log(self.lock_path, self.log_dir, self.stem)
            try:
                self._open(resume_step)
            except BaseException:
                self._release()
                raise
            drain_at_exit(self)  # what waits for the next flush is written at exit too
            if self.flush_every:
                thread = f"substrax-file-log-{name}"
                self._writer = DueWriter(self._write_due, self.flush_every, thread)
            self._handler = RunLogHandler(self.log_file, encoding="utf-8", delay=True)
            self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            self.python_logger.addHandler(self._handler)

    def _open(self, resume_step: int | None) -> None:
        logs = (self.metrics_jsonl, self.text_jsonl, self.histograms_jsonl)
        warn_of_earlier_run(f"FileLogger({self.name!r})", logs, resumed=resume_step is not None)
        if resume_step is not None:
            found = [drop_past(path, resume_step, jsonl_step) for path in logs]
            drop_past(self.metrics_csv, resume_step, csv_step)
            self.dropped_records = sum(dropped for dropped, _ in found)
            highest = max(at for _, at in found)
            if highest < resume_step:
                held = f"steps only up to {highest}" if highest >= 0 else "no step"
                _logger.warning(
                    f"FileLogger({self.name!r}): resume_step={resume_step}, but the file log "
                    f"{self.metrics_jsonl} holds {held}; check that name and log_dir are the "
                    "first attempt's"
                )
        for file in self._files:  # the metric files are made now, the others when written
            if (file in self._files[:2] or file.path.exists()) and file.drop_torn_line():
                _logger.warning(
                    f"{file.path} ended in a line cut short (a killed process); it was dropped"
                )
        if os.fstat(self._files[1].open()).st_size == 0:
            self._files[1].add(CSV_HEADER)
        complete_metric_logs(*self._files[:2])  # a kill between the two files' writes
        self._write_files()

    def _release(self) -> None:
        for file in self._files:
            file.close()
        held, self._held = self._held, None
        if held is not None:
            let_go(self.lock_path, held)

    def _write_scalar(self, name: str, value: Any, step: int | None) -> None:
        self._keep(name, checked_scalar(name, value, step), step, time.time())

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        now = time.time()
        for key, value in checked_scalars(metrics, step):  # a call that raises writes nothing
            self._keep(key, value, step, now)

    def _keep(self, key: str, value: Any, step: int | None, now: float) -> None:
        """Keep one checked scalar: the flush formats its lines, off the step's path."""
        if type(value) is not float:
            if not self._unread:
                drain_at_exit(self, again=True)
            self._unread += 1
        if key not in self._names:
            self._names[key] = (json.dumps(key), csv_field(key))
        self._pending.append((now, step, key, value))
        if now - self._last_flush >= self.flush_every:
            self._flush(wait=False)
        elif self._writer is not None:
            self._writer.due()

    def _write_due(self) -> bool:
        """Write what waits (on the writer's thread); whether a jax value still computed waits."""
        with self._lock:
            self._flush(wait=False)
            return bool(self._pending)

    def _forget_after_fork(self) -> None:
        """In a forked child: what waits is its parent's to write; no writer, a lock not held."""
        self._pending.clear()
        self._unread, self._writer, self._lock = 0, None, threading.RLock()

    def _flush(self, *, wait: bool) -> None:
        """Write the logged scalars; without ``wait``, only up to a jax value still computed."""
        with self._lock:
            self._last_flush = time.time()
            if self._files[0].fd is None:  # not this process's log, or closed
                return
            pending, taken, check = self._pending, list[_Pending](), self._unread and not wait
            for _ in range(len(pending)):  # threads append meanwhile
                if check and not value_ready(pending[0][3]):
                    break
                taken.append(pending.popleft())
            if self._unread:
                unread = [entry[3] for entry in taken if type(entry[3]) is not float]
                self._unread -= len(unread)
                prefetch(unread)
            self._write_lines(taken)

    def _write_lines(self, taken: list[_Pending]) -> None:
        """Format the lines of ``taken`` and write them; on an error, what is left waits again."""
        metrics, rows = self._files[:2]
        done = 0
        try:
            for now, step, key, value in taken:
                number = value
                if type(value) is not float:  # None: deleted (a donated buffer), with a warning
                    number = read_scalar(repr(self), key, value, step, self._warned_unreadable)
                if number is not None:
                    line, row = metric_lines(now, step, self._names[key], number)
                    metrics.add(line)
                    rows.add(row)
                done += 1
        finally:
            if done < len(taken):  # an interrupt: the rest waits for the next flush
                self._pending.extendleft(reversed(taken[done:]))
                self._unread += sum(type(entry[3]) is not float for entry in taken[done:])
            self._write_files()

    def _write_files(self) -> None:
        """Write the lines waiting; a file that cannot be written keeps them (warned about once)."""
        failed: dict[Path, str] = {}
        for file in self._files:
            error = file.write() if file.waiting else None
            if error is not None:
                failed[file.path] = f"{type(error).__name__}: {error.strerror or error}"
        if failed and not self._warned_unwritten:
            self._warned_unwritten = True
            _logger.warning(
                f"FileLogger({self.name!r}): {' and '.join(map(str, failed))} cannot be written "
                f"({'; '.join(sorted(set(failed.values())))}); its lines wait in memory, in order, "
                "and are written once there is room (this is reported once; close() raises "
                "FileLogWriteError if they still cannot be written then)"
            )
        elif self._failing and not failed:
            _logger.info(f"FileLogger({self.name!r}): the lines that waited are written")
        self._failing = failed

    def _append(self, file: Appender, record: dict[str, Any]) -> None:
        line = json.dumps(strict_json({"time": time.time(), **record}), allow_nan=False) + "\n"
        with self._lock:
            file.add(line)
            self._write_files()

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        merged: dict[str, Any] = {}
        if self.hparams_json.exists():
            merged = json.loads(self.hparams_json.read_text(encoding="utf-8"))
        merge_params(merged, strict_json(json_ready(params)))  # mappings key by key
        text = json.dumps(merged, indent=2, sort_keys=True, allow_nan=False)
        write_atomically(self.hparams_json, text + "\n")

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._append(self._files[2], {"step": step, "name": name, "text": text})

    def _media_path(self, kind: str, name: str, step: int | None, index: int, suffix: str) -> Path:
        folder = self.log_dir / kind
        with contextlib.suppress(OSError):  # a full disk: the write warns that the file is lost
            folder.mkdir(exist_ok=True)

        def path(index: int) -> Path:
            parts = ("" if step is None else f"_step{step}") + (f"_{index}" if index else "")
            safe = file_part(name, 251 - len(f"{self.stem}.{parts}".encode()))  # and a suffix
            return folder / f"{self.stem}.{safe}{parts}{suffix}"

        return take_media_name(path, index, suffix)

    def _pyplot_missing(self) -> bool:
        """Whether matplotlib is missing (warned about once)."""
        missing = optional("matplotlib") is None
        if missing and not self._warned_plots:
            self._warned_plots = True
            _logger.warning(
                f"matplotlib is not installed, so images are saved as .npy and "
                f"histogram plots are skipped; {install_hint('substrax-tracking', 'plots')}"
            )
        return missing

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        self._pyplot_missing()
        for index, image in enumerate(images):
            stem = self._media_path("images", name, step, index, "")
            self._images.submit(functools.partial(self._save_image, stem), image)

    def _save_image(self, stem: Path, image: Any) -> None:
        """Save ``image`` (in the image thread); one a full disk refuses is lost, with a warning."""
        try:
            save_image(stem, image)
        except OSError as error:
            _logger.warning(
                f"FileLogger({self.name!r}): image {stem} could not be written "
                f"({error}); it is lost"
            )
        finally:
            media_written(stem)

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        summary = histogram_of(name, values)
        self._append(self._files[3], {"step": step, "name": name, **summary})
        if self._pyplot_missing() or not summary["counts"]:
            return
        plot = self._media_path("histograms", name, step, 0, ".png")
        title = name + ("" if step is None else f" (step {step})")
        try:  # a full disk loses the plot alone (the line above keeps the counts)
            save_plot(plot, summary["counts"], summary["edges"], title)
        except (ValueError, OverflowError, OSError) as error:
            _logger.warning("%r: no PNG of histogram %r at step %s: %s", self, name, step, error)
        finally:
            media_written(plot)

    def flush(self) -> None:
        """Write every line and image logged so far and ``fsync`` the lines, waiting for jax values.

        On a full disk it does not raise: the next flush writes the lines.
        """
        with self._lock:
            self._flush(wait=True)
            if not self._failing:
                self._sync()
        self._images.wait()

    def _sync(self) -> None:
        for file in self._files:
            try:
                if file.fd is not None:
                    os.fsync(file.fd)
            except OSError as error:
                _logger.warning(f"FileLogger({self.name!r}): fsync of {file.path} failed: {error}")

    def _close(self) -> None:
        if self._handler is not None:
            self.python_logger.removeHandler(self._handler)
            self._handler.close()
        if self._writer is not None:
            self._writer.close()
        try:
            self._images.wait()
        finally:
            with self._lock:
                try:
                    self._flush(wait=True)
                    self._sync()
                    left = [file for file in self._files if file.waiting]
                    for file in left:  # the file ends with its last whole line
                        with contextlib.suppress(OSError):
                            file.drop_torn_line()
                finally:
                    self._release()
        if left:
            counts = [(file.path, file.waiting.count(b"\n")) for file in left]
            (path, lines), others = counts[0], counts[1:]
            reason = self._failing.get(path, "it could not be written")
            if others:
                reason += "; " + ", ".join(f"{n} lines of {str(p)!r}" for p, n in others)
                reason += " were not written either"
            raise FileLogWriteError(path, lines, reason)
