"""RemoteLogger: the base of the W&B and MLflow loggers, whose calls go through AsyncDelivery."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import atexit
import copy
import multiprocessing.util
import operator
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from substrax.support import check_int, check_seconds, is_device_array

from ._background import AsyncDelivery
from ._base import Logger, check_resume_step, histogram_of
from ._errors import ResumeWithoutRunIdError, UploadNotFoundError
from ._failure import failed_by
from ._log_files import json_ready
from ._paths import check_spool_path, log_stem, resolve_log_dir
from ._records import Record
from ._sink import Sink
from ._values import checked_scalar, checked_scalars


__all__ = ["RemoteLogger", "check_resume"]


_OPEN: dict[int, RemoteLogger] = {}  # held strongly: a logger dropped unclosed is closed at exit
_AT_EXIT_TIMEOUT = 10.0
_FLUSH_TIMEOUT = 10.0  # the most seconds flush() waits by default
_EXIT_PRIORITY = 100  # multiprocessing finalizers: before pools and queues shut down
_FINALIZED_PIDS: set[int] = set()  # the processes whose multiprocessing finalizer is registered


def _close_open_loggers() -> None:
    """At exit, close the loggers never closed; the exception the process dies of marks them failed."""
    error = sys.exc_info()[1] or _died_of()
    for logger in list(_OPEN.values()):
        if failed_by(error):
            logger.mark_failed()
        logger.close_timeout = min(logger.close_timeout, _AT_EXIT_TIMEOUT)
        logger.close()


def _died_of() -> BaseException | None:
    """The uncaught exception a script dies of, outside interactive sessions: ``sys.last_exc``, if it left ``__main__``'s top level (pytest sets it too)."""
    if sys.flags.interactive or hasattr(sys, "ps1") or "IPython" in sys.modules:
        return None
    error: BaseException | None = getattr(sys, "last_exc", None)
    traceback = None if error is None else error.__traceback__
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            return error
        traceback = traceback.tb_next
    return None


# A forked child does not own its parent's runs: it must not close (end) them at its exit.
os.register_at_fork(after_in_child=_OPEN.clear)


def check_resume(logger: str, resume_step: int | None, run_id: str | None) -> None:
    """Refuse a ``resume_step`` that is not an int >= 0, or one without the ``run_id`` it resumes.

    Example:
        >>> from substrax.tracking._remote import check_resume
        >>> check_resume("MLFlowLogger", 3, None)
        Traceback (most recent call last):
        ...
        substrax.tracking.ResumeWithoutRunIdError: MLFlowLogger got resume_step=3 without run_id; ...
    """
    if check_resume_step(resume_step) is not None and run_id is None:
        raise ResumeWithoutRunIdError(logger, resume_step)


class RemoteLogger(Logger):
    """A logger whose backend is reached from worker threads: a call queues a record and returns.

    Subclasses build their sink (the backend run) and call :meth:`_start`. Records are written
    ahead to :attr:`spool_path` and sent from it in order; a failing backend is warned about once
    and retried with backoff. :meth:`close` returns within ``close_timeout`` (plus about a
    second), leaving what is undelivered in the spool for ``python -m substrax.tracking replay``.
    A call without a step uses the last step given (0 before any). A logger never closed is
    closed at interpreter exit (waiting at most 10 s for the backend).
    """

    _delivery: AsyncDelivery | None = None

    def __init__(
        self,
        name: str,
        *,
        log_dir: str | os.PathLike[str] | None,
        spool_path: str | os.PathLike[str] | None,
        close_timeout: float,
        max_queue: int,
        process_index: int | None,
        all_processes: bool,
    ) -> None:
        super().__init__(name, process_index=process_index, all_processes=all_processes)
        self.close_timeout = float(check_seconds("close_timeout", close_timeout))
        self._max_queue = check_int("max_queue", max_queue, minimum=1)
        self._last_step = 0
        self.log_dir = (
            resolve_log_dir(name, log_dir) if self.active else Path(log_dir or ".").resolve()
        )
        stem = log_stem(name, self.process_index, all_processes=all_processes)
        default = self.log_dir / f"{stem}.spool.jsonl"
        self.spool_path = default if spool_path is None else Path(spool_path).resolve()
        self.media_dir = self.log_dir / f"{stem}.media"
        if spool_path is not None and self.active:  # the default one is in the checked log_dir
            check_spool_path(self.spool_path, type(self).__name__)

    def _start(self, sink: Sink, label: str, *, reached: bool = True) -> None:
        """Deliver to ``sink`` from now on; ``reached=False``: its backend did not answer yet."""
        _OPEN[id(self)] = self
        # last registered, first run: before W&B's own hook finishes its run
        atexit.unregister(_close_open_loggers)
        atexit.register(_close_open_loggers)
        if os.getpid() not in _FINALIZED_PIDS:  # a forked child has none of its parent's finalizers
            _FINALIZED_PIDS.add(os.getpid())
            multiprocessing.util.Finalize(None, _close_open_loggers, exitpriority=_EXIT_PRIORITY)
        self._delivery = AsyncDelivery(
            sink,
            spool_path=self.spool_path,
            media_dir=self.media_dir,
            label=label,
            max_queue=self._max_queue,
            reached=reached,
        )

    @property
    def delivered(self) -> int:
        """How many records reached the backend so far."""
        return 0 if self._delivery is None else self._delivery.delivered

    @property
    def spooled(self) -> int:
        """How many of this run's records the spool file holds, not delivered yet."""
        return 0 if self._delivery is None else self._delivery.spooled

    def _step(self, step: int | None) -> int:
        """The step of a call: ``step`` as a plain int, or the last one given (0 before any)."""
        if step is None:
            return self._last_step
        if type(step) is not int:
            step = operator.index(step)  # np.int64: a plain int, as the spool writes JSON
        self._last_step = step
        return step

    def _submit(
        self, kind: Any, step: int | None, payload: dict[str, Any], *, materialized: bool = False
    ) -> None:
        assert self._delivery is not None  # noqa: S101
        step = self._step(step)
        self._delivery.submit(
            Record(
                kind=kind, step=step, time=time.time(), payload=payload, materialized=materialized
            )
        )

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        values = dict(checked_scalars(metrics, self._last_step if step is None else step))
        self._submit("scalars", step, {"values": values})

    def _write_scalar(self, name: str, value: Any, step: int | None) -> None:
        value = checked_scalar(name, value, self._last_step if step is None else step)
        assert self._delivery is not None  # noqa: S101
        self._delivery.submit((name, value, self._step(step), time.time()))

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        # as JSON data now: the worker would read the caller's dicts after they changed
        self._submit("hyperparams", None, {"params": json_ready(dict(params))}, materialized=True)

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._submit("text", step, {"name": name, "text": text})

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        # a host array copied now (the caller may fill it again); a jax array cannot change
        kept = [image if is_device_array(image) else copy.copy(image) for image in images]
        self._submit("image", step, {"name": name, "images": kept})

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        if is_device_array(values):  # summarised by the worker, once computed
            self._submit("histogram", step, {"name": name, "values": values})
        else:  # a host array the caller may change: summarised now, as the file log does
            summary = {"name": name, **histogram_of(name, values)}
            self._submit("histogram", step, summary, materialized=True)

    def log_artifact(
        self, local_path: str | os.PathLike[str], artifact_path: str | None = None
    ) -> None:
        """Upload a file (or a directory's files) to the run, under ``artifact_path``.

        Raises:
            UploadNotFoundError: ``local_path`` does not exist.
            ValueError: ``artifact_path`` is absolute or climbs out of the run (``..``).
        """
        inside = PurePosixPath(artifact_path or ".")
        if inside.is_absolute() or ".." in inside.parts:
            raise ValueError(
                f"artifact_path={artifact_path!r} must be a relative path inside the run, such "
                "as 'checkpoints' or 'eval/plots'"
            )
        self._submit_file("artifact", local_path, artifact_path=artifact_path)

    def _submit_file(self, what: str, local_path: str | os.PathLike[str], **payload: Any) -> None:
        """Queue an ``artifact`` record for an existing path (``what`` names it in errors)."""
        self._check_open()
        path = Path(local_path).absolute()  # a link keeps its own name
        if not path.exists():
            raise UploadNotFoundError(what, path)
        if self.active:  # JSON data now (a Path, a datetime in metadata): as the spool holds it
            self._submit("artifact", None, {"path": str(path), **json_ready(payload)})

    def flush(self, timeout: float | None = None) -> None:
        """Write every call so far to the spool file (fsynced), then deliver it, within a bound.

        A kill right after loses nothing logged before. The backend is then waited for what is
        left of ``timeout`` seconds (None: ``close_timeout``, at most 10 s); a backend known to
        be failing, or not reached since the start, gets one more try, not its retries. Call it before saving a checkpoint
        (``CheckpointCallback(flush=...)`` does); :meth:`wait_delivered` waits for the backend.

        Raises:
            ValueError: ``timeout`` is NaN, infinite or negative.
        """
        if self._delivery is not None and not self.closed:
            bound = check_seconds("timeout", timeout) if timeout is not None else None
            bound = min(self.close_timeout, _FLUSH_TIMEOUT) if bound is None else bound
            deadline = time.monotonic() + bound
            self._delivery.persist(bound)  # on disk (a full disk: sent from memory), then sent
            # a backend failing (or never reached) gets one more try: the records are durable
            once = self._delivery.failing
            self._delivery.flush(max(0.0, deadline - time.monotonic()), once=once, brief=True)

    def wait_delivered(self, timeout: float | None = None) -> bool:
        """Wait until every call so far reached the backend; return whether all did."""
        if self._delivery is None or self.closed:
            return True
        return self._delivery.flush(timeout)

    def _close(self) -> None:
        _OPEN.pop(id(self), None)
        if self._delivery is not None:
            self._delivery.close(self.close_timeout)
