"""MLflow's metric writes to a database store, from a helper process at a lower CPU priority.

MLflow's SQL store spends about 0.2 ms of CPU per metric value in SQLAlchemy, holding the GIL.
Inside the training process that time is taken from the training loop's own Python: each time
the loop needs the GIL back it waits for the delivery thread to give it up. A run that has
logged ``SPAWN_AFTER`` metric values to a database store (``sqlite:``, ``postgresql:``, ...)
moves these writes to a child process, ``python -m substrax.tracking._mlflow_child URI NICE``
(the training process's interpreter, 10 nicer than it): the delivery thread hands it each batch
over a pipe and waits for its answer without holding the GIL. Short runs never start one.
Everything else (the run, params, artifacts, ending the run) stays in the logger's process.
In a SQLite store, the child inserts the values of keys MLflow already wrote for the run
straight into MLflow's tables (``substrax.tracking._mlflow_sqlite``: about a tenth of the CPU
of MLflow's ORM); a key's first batch, and anything that path leaves, goes through MLflow.

The child writes nothing but the batches it is sent, answers each with one line, and ends when
its input closes: when the logger closes, or the training process dies (kill -9 included). A
child that dies is started again for the next batch; the batch it held is retried by the
logger's delivery, like any failed delivery (MLflow skips the rows of it it already holds). The logger never waits for a child to start: until it says it is ready, the
batches are written in the logger's process. A child that fails to start three times in a row
(it exits, or is not ready within two minutes) is given up, with one warning, and the writes
stay in the logger's process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Final


__all__ = ["SPAWN_AFTER", "MetricWriter", "MetricWriterError", "refused_for_good", "uses_child"]

_logger = logging.getLogger(__name__)

SPAWN_AFTER = 1000
"""Metric values a sink writes in its own process before it moves the writes to a child."""
_MODULE: Final = "substrax.tracking._mlflow_child"
_READY: Final = "ready"
_START_TIMEOUT: Final = 120.0  # seconds a child may take to import MLflow and open the store
_EXIT_GRACE: Final = 5.0  # seconds a closing child has to finish its batch before it is killed
_NICE: Final = 10
_LOWEST: Final = 19  # the highest nice value there is
_STARTS: Final = 3  # failed starts in a row before the writes go back into the logger's process
_DATABASES: Final = frozenset({"sqlite", "postgresql", "mysql", "mssql"})

type MetricRow = tuple[str, float, int, int]
"""One metric value as sent: key, value, timestamp (ms) and step."""


def uses_child(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` is a database store, whose writes a child process takes over.

    Example:
        >>> from substrax.tracking._mlflow_child import uses_child
        >>> uses_child("sqlite:////runs/mlflow.db"), uses_child("http://127.0.0.1:5000")
        (True, False)
    """
    scheme = tracking_uri.partition(":")[0].partition("+")[0].lower()
    return scheme in _DATABASES


def refused_for_good(error: BaseException) -> bool:
    """Whether MLflow refused what it was sent, so that no retry can store it.

    MLflow's ``INVALID_PARAMETER_VALUE`` (a metric name it does not accept, a param logged
    again with another value); a value its store cannot hold (an ``OverflowError`` behind the
    error: "Python int too large to convert to SQLite INTEGER"); a value the client refused
    before sending (a ``ValueError`` or ``TypeError`` of its own: protobuf's "Value out of
    range"); a batch the writer child found refused. A server that cannot be reached, does not
    answer, or answers something that is not JSON is none of these: that is retried.

    Example:
        >>> from substrax.tracking._mlflow_child import refused_for_good
        >>> refused_for_good(ValueError("Value out of range: 9223372036854775808"))
        True
        >>> refused_for_good(ConnectionRefusedError(111, "Connection refused"))
        False
    """
    if getattr(error, "error_code", None) == "INVALID_PARAMETER_VALUE":
        return True
    if getattr(error, "refused", None) is True:  # the writer child's answer said so
        return True
    if isinstance(error, ValueError | TypeError | OverflowError) and not isinstance(
        error, json.JSONDecodeError | UnicodeError
    ):
        return True
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OverflowError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


class MetricWriterError(ConnectionError):
    """A batch the child could not write: it died, or MLflow raised there.

    Attributes:
        error_code: MLflow's error code of what the child raised (None when it died).
        refused: whether MLflow refused the batch for good (see :func:`refused_for_good`).
    """

    def __init__(
        self, message: str, error_code: str | None = None, *, refused: bool = False
    ) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.refused = refused


class MetricWriter:
    """The parent's side: counts the values written, starts the child, sends it batches.

    A child is started without waiting for it: until it says it is ready, the batches are
    written in the logger's process as before, so a start (MLflow's import, seconds on a busy
    machine) never holds the delivery, a flush or a close.

    Args:
        tracking_uri: the database store.
        label: the name used in log messages.
    """

    def __init__(self, tracking_uri: str, *, label: str) -> None:
        self.tracking_uri = tracking_uri
        self.cwd = Path.cwd()  # a relative sqlite path names a file from here, not a later cwd
        self.label = label
        self.written = 0  # values written in this process before the child took over
        self.given_up = not uses_child(tracking_uri)
        self._child: subprocess.Popen[bytes] | None = None  # ready: it takes batches
        self._starting: subprocess.Popen[bytes] | None = None  # not ready yet
        self._started_at = 0.0
        self._failed_starts = 0
        self.closed = False
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The process id of the child taking batches (None when there is none)."""
        child = self._child
        return None if child is None or child.poll() is not None else child.pid

    def log_batch(self, run_id: str, rows: Sequence[MetricRow]) -> bool:
        """Write ``rows`` through the child; False when the caller writes them itself.

        Raises:
            MetricWriterError: the child died with the batch, or MLflow refused it there.
        """
        with self._lock:
            if self.closed:
                raise MetricWriterError("the MLflow logger is closed; the batch is kept")
            if self.given_up or self.written < SPAWN_AFTER:
                self.written += len(rows)
                return False
            child = self._ready_child(wait=0.0)
            if child is None:
                return False
            return self._send(child, {"run_id": run_id, "metrics": list(rows)})

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a child being started; whether one takes batches."""
        with self._lock:
            if self._starting is not None:
                self._ready_child(wait=timeout)
            return self.pid is not None

    def close(self) -> None:
        """End the child for good: its input closes, it finishes its batch and exits (or is killed).

        A batch sent afterwards raises ``MetricWriterError`` (and is kept by the spool).
        """
        self.closed = True
        idle = self._lock.acquire(blocking=False)
        try:  # a batch still in flight (close_timeout ran out) is kept by the spool: no grace
            self._stop(grace=_EXIT_GRACE if idle else 0.0)
        finally:
            if idle:
                self._lock.release()

    def _stop(self, grace: float = _EXIT_GRACE) -> None:
        starting, self._starting = self._starting, None
        if starting is not None:
            _end(starting, 0.0)
        child, self._child = self._child, None
        if child is not None:
            _end(child, grace)

    def _ready_child(self, wait: float) -> subprocess.Popen[bytes] | None:
        """The child taking batches; None while one starts (waiting up to ``wait`` s for it)."""
        child = self._child
        if child is not None and child.poll() is None:
            return child
        if child is not None:  # died between batches: its pipes, and a new one
            self._child = None
            _end(child, 0.0)
        if self._starting is None:
            try:
                self._starting = _spawn(self.tracking_uri, self.cwd)
            except OSError as error:
                self._failed_start(str(error))
                return None
            self._started_at = time.monotonic()
        starting = self._starting
        assert starting.stdout is not None  # noqa: S101
        line = _readline(starting.stdout, wait)
        if line.strip() == _READY.encode():
            self._child, self._starting = starting, None
            self._failed_starts = 0
            return starting
        waited = time.monotonic() - self._started_at
        if line == b"":
            if starting.poll() is None and waited < _START_TIMEOUT:
                return None  # still importing MLflow and opening the store
            why = (
                f"it did not become ready within {_START_TIMEOUT:g} s"
                if starting.poll() is None
                else f"it exited with code {starting.returncode} before it was ready"
            )
        else:
            why = f"it wrote {line[:200]!r} instead of {_READY!r}"
        self._starting = None
        _end(starting, 0.0)
        self._failed_start(why)
        return None

    def _failed_start(self, why: str) -> None:
        self._failed_starts += 1
        if self._failed_starts < _STARTS:
            _logger.info(
                "%s: the MLflow writer process could not start (%s); writing from this process "
                "and trying again",
                self.label,
                why,
            )
            return
        self.given_up = True
        _logger.warning(
            "%s: the MLflow writer process could not start %d times (%s); metrics are "
            "written from this process",
            self.label,
            _STARTS,
            why,
        )

    def _send(self, child: subprocess.Popen[bytes], request: dict[str, Any]) -> bool:
        assert child.stdin is not None  # noqa: S101
        assert child.stdout is not None  # noqa: S101
        try:
            child.stdin.write(json.dumps(request).encode() + b"\n")
            child.stdin.flush()
            line = child.stdout.readline()
        except (OSError, ValueError):  # a closed pipe: the child died, or close() ended it
            line = b""
        if not line:
            self._stop()
            code = child.returncode
            raise MetricWriterError(
                f"the MLflow writer process (pid {child.pid}) ended with the batch "
                f"(exit code {code}); it is retried"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise MetricWriterError(
                f"{answer['error']}: {answer['message']}",
                error_code=answer.get("error_code"),
                refused=answer.get("refused") is True,
            )
        return True


def _spawn(tracking_uri: str, cwd: Path) -> subprocess.Popen[bytes]:
    """Start a child for ``tracking_uri`` in ``cwd``; it writes ``ready`` once it takes batches."""
    nice = min(os.getpriority(os.PRIO_PROCESS, os.getpid()) + _NICE, _LOWEST)
    return subprocess.Popen(
        [sys.executable, "-m", _MODULE, tracking_uri, str(nice)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=cwd,
        start_new_session=True,  # a Ctrl-C for the training process must not cut a batch
    )


def _readline(stream: IO[bytes], timeout: float) -> bytes:
    """One line from ``stream``, or b"" if none came within ``timeout`` seconds (or it closed)."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else b""


def _end(child: subprocess.Popen[bytes], grace: float = _EXIT_GRACE) -> None:
    """Close the child's input and give it ``grace`` seconds to finish its batch, then kill it."""
    with contextlib.suppress(OSError, ValueError):
        if child.stdin is not None:
            child.stdin.close()
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    if child.stdout is not None:
        child.stdout.close()


def _serve(tracking_uri: str, requests: IO[bytes], answers: IO[bytes]) -> None:
    """The child's loop: write each batch read from ``requests``, answer it on ``answers``."""
    from mlflow.entities import Metric  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    from ._mlflow_sqlite import SqliteMetricRows  # noqa: PLC0415
    from ._store_lock import store_lock  # noqa: PLC0415

    with store_lock(tracking_uri):  # a store another job is still creating
        client = MlflowClient(tracking_uri=tracking_uri)
    direct = SqliteMetricRows.open(tracking_uri)
    answers.write(_READY.encode() + b"\n")
    answers.flush()
    try:
        for line in requests:
            request = json.loads(line)
            run_id, rows = request["run_id"], [tuple(row) for row in request["metrics"]]
            try:
                if direct is None or not direct.write(run_id, rows):
                    client.log_batch(
                        run_id,
                        metrics=[Metric(key, value, t, step) for key, value, t, step in rows],
                    )
                    if direct is not None:
                        direct.learn(run_id, rows)
                answer: dict[str, Any] = {"ok": True}
            except Exception as error:
                answer = {
                    "error": type(error).__name__,
                    "message": str(error),
                    "error_code": getattr(error, "error_code", None),
                    "refused": refused_for_good(error),
                }
            answers.write(json.dumps(answer).encode() + b"\n")
            answers.flush()
    finally:
        if direct is not None:
            direct.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run a child for a tracking URI at a nice value (the two arguments)."""
    args = sys.argv[1:] if argv is None else list(argv)
    match args:
        case [tracking_uri, nice] if nice.isdigit():
            pass
        case _:
            sys.stderr.write(f"usage: python -m {_MODULE} TRACKING_URI NICE\n")
            return 2
    with contextlib.suppress(OSError):  # inherited from a thread already lowered: keep that
        os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), int(nice)))
    # the answers get the pipe to themselves: anything else written to stdout goes to stderr
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=logging.WARNING)
    with answers:
        _serve(tracking_uri, sys.stdin.buffer, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
