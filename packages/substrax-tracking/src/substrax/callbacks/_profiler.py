"""ProfilerWindow: trace steps N to N+M with ``jax.profiler``, for TensorBoard and Perfetto."""

from __future__ import annotations

import atexit
import logging
import time
from pathlib import Path

from substrax.support import Closeable, check_int

from ._metrics import wait_for
from ._protocol import BaseCallback, Logs


_logger = logging.getLogger(__name__)


def _wait_for_a_new_second(runs: Path) -> None:
    """Wait until no trace in ``runs`` was written this second: jax names its folder by it."""
    written = [run.stat().st_mtime for run in runs.iterdir()] if runs.is_dir() else []
    now = time.time()
    if written and int(max(written)) >= int(now):
        time.sleep(int(max(written)) + 1 - now)


class ProfilerWindow(BaseCallback, Closeable):
    """Trace ``num_steps`` steps from ``start_step`` with ``jax.profiler`` into ``log_dir``.

    The trace goes into ``log_dir/plugins/profile/<run>/`` (``*.xplane.pb``; also
    ``perfetto_trace.json.gz`` with ``perfetto=True``). ``on_train_end``, leaving a ``with``
    block or the interpreter's exit stops a trace the run ended inside of. A trace already
    running, or a window already past at the first step seen, is skipped with a warning. The
    trace stops once the last traced step's outputs, the jax arrays among its batch-end logs,
    are computed: logs holding none stop it when the loop handed them over (after a read such as
    ``float(loss)``, which waited; empty logs, warned about, at the step's dispatch).

    Args:
        start_step: the first traced step (the ``batch`` index the loop passes), >= 0.
        num_steps: how many steps to trace, >= 1.
        log_dir: where the trace goes, e.g. the run's output directory / ``"profile"``.
        perfetto: also write a Perfetto trace.

    Raises:
        ValueError: ``log_dir`` (or a folder above it) is an existing file.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> import jax.numpy as jnp
        >>> from substrax.callbacks import ProfilerWindow
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     with ProfilerWindow(start_step=1, num_steps=2, log_dir=tmp) as profiler:
        ...         for step in range(4):
        ...             profiler.on_batch_begin(None, step)
        ...             loss = jnp.sum(jnp.ones(8) * step)
        ...             profiler.on_batch_end(None, step, {"loss": loss})
        ...     any(Path(tmp).rglob("*.xplane.pb"))
        True
    """

    def __init__(
        self, *, start_step: int, num_steps: int, log_dir: str | Path, perfetto: bool = False
    ) -> None:
        self.start_step = check_int("start_step", start_step, minimum=0)
        self.num_steps = check_int("num_steps", num_steps, minimum=1)
        self.log_dir = Path(log_dir)
        paths = (self.log_dir, *self.log_dir.parents)
        if file := next((path for path in paths if path.exists() and not path.is_dir()), None):
            raise ValueError(
                f"log_dir={str(log_dir)!r} must be a directory for the trace, but "
                f"{str(file)!r} is a file"
            )
        self.perfetto = perfetto
        self._tracing = False
        self._done = False

    @property
    def tracing(self) -> bool:
        """Whether this window's trace is running now."""
        return self._tracing

    @property
    def done(self) -> bool:
        """Whether the window has been traced (or given up on)."""
        return self._done

    @property
    def last_step(self) -> int:
        """The last traced step."""
        return self.start_step + self.num_steps - 1

    def on_train_begin(self, _trainer: object, /) -> None:
        """Start the trace when the window begins at step 0."""
        if self.start_step == 0:
            self._start()

    def on_batch_begin(self, _trainer: object, batch: int, /) -> None:
        """Start the trace before the window's first step."""
        if self.start_step <= batch <= self.last_step:
            self._start()
        self._skip_past(batch)

    def on_batch_end(self, _trainer: object, batch: int, logs: Logs, /) -> None:
        """Stop the trace once the window's last step is computed; start it for the next step."""
        if self._tracing and batch >= self.last_step:
            if not logs:  # a value read to the host (float(loss)) waited for the step
                message = (
                    "ProfilerWindow: the batch-end logs of step %d, its last traced step, are "
                    "empty: nothing to wait for, so the trace stops when the step was dispatched and "
                    "may lack its compute; log the step's output (its loss, as the jax array it "
                    "returned)"
                )
                _logger.warning(message, batch)
            self._stop(logs)
        elif batch + 1 == self.start_step:
            self._start()
        self._skip_past(batch)

    def on_train_end(self, _trainer: object, /) -> None:
        """Stop a trace the run ended inside of; warn of a window the run never reached."""
        if not (self._tracing or self._done):
            message = "ProfilerWindow: the run ended before step %d; steps %d-%d are not traced"
            _logger.warning(message, self.start_step, self.start_step, self.last_step)
        self.close()

    def close(self) -> None:
        """Stop the trace if it runs (idempotent)."""
        if self._tracing:
            self._stop({})

    def _start(self) -> None:
        if self._tracing or self._done:
            return
        import jax  # noqa: PLC0415  (a run that profiles has jax loaded)

        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            jax.profiler.start_trace(self.log_dir, create_perfetto_trace=self.perfetto)
        except RuntimeError as error:
            self._done = True
            message = (
                "ProfilerWindow could not start its trace (%s); steps %d-%d are not traced. "
                "Stop the other trace (jax.profiler.stop_trace) or drop this window"
            )
            _logger.warning(message, error, self.start_step, self.last_step)
            return
        self._tracing = True
        atexit.register(self.close)
        _logger.info("profiling steps %d-%d into %s", self.start_step, self.last_step, self.log_dir)

    def _skip_past(self, batch: int) -> None:
        if batch > self.last_step and not (self._done or self._tracing):
            self._done = True
            message = (
                "ProfilerWindow skips steps %d-%d, already past at step %d (a resumed run?): "
                "nothing is traced; choose a window after the run's first step"
            )
            _logger.warning(message, self.start_step, self.last_step, batch)

    def _stop(self, logs: Logs) -> None:
        import jax  # noqa: PLC0415  (only reached after a trace started, with jax loaded)

        wait_for(logs.values())  # the step's values, to trace it whole
        self._tracing = False
        self._done = True
        atexit.unregister(self.close)
        _wait_for_a_new_second(self.log_dir / "plugins" / "profile")
        jax.profiler.stop_trace()
