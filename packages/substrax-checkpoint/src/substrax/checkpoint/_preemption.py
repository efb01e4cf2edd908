"""An opt-in preemption handler: on SIGTERM (or jax's preemption notice) save, close, exit 0.

With several ``jax.distributed`` processes each one gets its own signal at its own moment; the
handler makes them agree, through ``jax.distributed``'s key-value store, on one step at which
all of them save together.
"""

import contextlib
import ctypes
import itertools
import logging
import signal
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import Any, Final, Self

import jax

from substrax.runtime import distributed_state
from substrax.support import check_int

from ._callback import Flushable, flush_before_saving, flushables
from ._errors import DistributedNotInitializedError
from ._protocol import CheckpointStore, PyTree


type Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_TIMEOUT_MS: Final = 300_000
_logger = logging.getLogger(__name__)
_sessions = itertools.count()


def _jax_preemption_notice(step: int) -> bool:
    """Whether jax's preemption sync point is reached (False where jax offers no such notice)."""
    if jax.process_count() == 1:
        return False
    from jax.experimental import multihost_utils  # noqa: PLC0415 - multi-process only

    try:
        return bool(multihost_utils.reached_preemption_sync_point(step))
    except RuntimeError:  # the preemption sync manager is not initialised
        return False


def _disposition(sig: signal.Signals) -> ctypes.Array[ctypes.c_char] | None:
    """The C-level ``struct sigaction`` of ``sig`` as opaque bytes (None where unavailable).

    Python's ``signal.signal`` returns the handler Python knows about; a handler installed from
    C (jax's preemption notifier) reads as ``SIG_DFL``, and putting that back would drop it.
    """
    buffer = ctypes.create_string_buffer(512)  # larger than any platform's struct sigaction
    try:
        sigaction = ctypes.CDLL(None).sigaction
    except (OSError, AttributeError):  # no POSIX sigaction (Windows)
        return None
    return buffer if sigaction(int(sig), None, buffer) == 0 else None


def _reinstall(sig: signal.Signals, disposition: ctypes.Array[ctypes.c_char]) -> None:
    ctypes.CDLL(None).sigaction(int(sig), disposition, None)


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` as floats (NaN and infinities kept); a value that is no number is left out.

    Example:
        >>> from substrax.checkpoint._preemption import _numbers
        >>> _numbers({"loss": float("inf"), "note": "diverged", "acc": 1})
        {'loss': inf, 'acc': 1.0}
    """
    numbers: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            numbers[name] = float(value)
        except (TypeError, ValueError):
            _logger.warning(
                "the preemption save leaves out the metric %r: %r is not a number", name, value
            )
    return numbers


class _Agreement:
    """The logical OR of every process's flag, exchanged through the coordination service.

    Round ``r``: a flagged process writes ``<prefix>/<r>/<process>``, every process waits at one
    reused barrier, then lists ``<prefix>/<r>/``. Every write of round ``r`` happens before the
    barrier and every listing after it, so all processes read the same answer. Two RPCs per
    process and round whatever the number of processes; a key is written only by a flagged
    process, so the coordinator's memory does not grow with the number of rounds.
    """

    def __init__(self, session: int) -> None:
        client = distributed_state().client
        if client is None:
            raise DistributedNotInitializedError(
                process_count=jax.process_count(), needed_by="the PreemptionHandler"
            )
        self._client = client
        self._prefix = f"substrax_preemption/{session}"
        self._process = jax.process_index()
        self._round = 0

    def any_flagged(self, flagged: bool) -> bool:
        round_, self._round = self._round, self._round + 1
        if flagged:
            self._client.key_value_set(f"{self._prefix}/{round_}/{self._process}", "1")
        self._client.wait_at_barrier(f"{self._prefix}/barrier", _TIMEOUT_MS)
        return bool(self._client.key_value_dir_get(f"{self._prefix}/{round_}/"))


class PreemptionHandler:
    """Save a last checkpoint and exit cleanly when the process is told it will be preempted.

    Inside ``with PreemptionHandler(store):`` a SIGTERM only sets a flag; the training loop calls
    ``check(step, items)`` at every step boundary (where the state is consistent), which saves
    the step, waits for the write, closes the store and raises ``SystemExit(exit_code)``.
    Signals that arrive after that (a scheduler signalling every host, a second SIGTERM) are
    absorbed until the process has exited.

    Several processes (``jax.distributed``): each process's signal arrives at its own moment, yet
    every process stops at the same step. ``check`` exchanges the local flags through
    ``jax.distributed``'s key-value store (a flag write by a signalled process, one barrier, one
    directory read; no device collective, so the accelerator queue is not drained), and all
    processes stop at the first exchange where any process was signalled. The exchange costs a
    round trip to the coordinator: about 0.6 ms per step for two processes on one host, more
    across a network. ``check_every=K`` runs it only at steps divisible by ``K``: K times less
    overhead, but a signalled run trains up to ``K - 1`` more steps before saving, which must fit
    in the grace period between the signal and the kill. Every process must call ``check`` with
    the same steps (a process that stops calling it leaves the others waiting at the exchange).

    jax's own preemption service (``jax_enable_preemption_service``, on by default in jax 0.12)
    starts with ``jax.distributed.initialize``: it installs a C-level SIGTERM handler that
    swallows the signal and starts a sync protocol that ``reached_preemption_sync_point(step)``
    reports. ``check`` calls it at every step, so a notice jax received (e.g. a SIGTERM before
    the ``with`` block) also stops every process at jax's agreed step. Inside the block the
    Python handler receives the signals instead of jax's notifier (so jax's sync point does not
    fire for them; this handler's own exchange stops the processes); on leaving the block the
    previous C-level handlers are reinstalled exactly, jax's notifier included.

    ``flush=`` takes the run's loggers (anything with a ``flush()`` method): they are flushed
    before the save (``substrax.tracking`` loggers write, fsync, deliver or spool every record
    logged so far), so that the records of every step the checkpoint covers outlive the
    process, even if the grace period ends in a SIGKILL before the loggers are closed. A flush
    that raises is warned about and the checkpoint is saved anyway.

    Args:
        store: where the last checkpoint goes.
        signals: the signals that mean "preempted" (SIGTERM by default).
        exit_code: the status the process exits with after the save.
        check_every: with several processes, exchange the flags only at steps divisible by this.
        flush: the loggers (one, or several) flushed before the save.

    Raises:
        ValueError: ``check_every`` is not an int >= 1.
        TypeError: something in ``flush`` has no ``flush()`` method.

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> from substrax.checkpoint import OrbaxCheckpointStore, PreemptionHandler
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     store = OrbaxCheckpointStore(directory)
        ...     with PreemptionHandler(store) as preemption:
        ...         for step in range(3):
        ...             preemption.check(step, lambda: {"model": {"w": np.zeros(2)}})
        ...     store.close()
        >>> preemption.requested
        False
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        signals: Sequence[signal.Signals] = (signal.SIGTERM,),
        exit_code: int = 0,
        check_every: int = 1,
        flush: Flushable | Iterable[Flushable] | None = None,
    ) -> None:
        check_int("check_every", check_every, minimum=1)
        self._flush = flushables(flush)
        self._store = store
        self._signals = tuple(signals)
        self._exit_code = exit_code
        self._check_every = check_every
        self._requested = False
        self._stopping = False
        self._agreement: _Agreement | None = None
        self._previous: dict[signal.Signals, Handler] = {}
        self._dispositions: dict[signal.Signals, ctypes.Array[ctypes.c_char] | None] = {}

    @property
    def requested(self) -> bool:
        """Whether a preemption signal arrived at this process."""
        return self._requested

    @property
    def check_every(self) -> int:
        """With several processes, the flags are exchanged at steps divisible by this."""
        return self._check_every

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self._requested = True

    def __enter__(self) -> Self:
        session = next(_sessions)
        if jax.process_count() > 1:
            self._agreement = _Agreement(session)
        for sig in self._signals:
            self._dispositions[sig] = _disposition(sig)
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self._agreement = None
        if self._stopping:  # on the way out after a preemption save: keep absorbing signals
            return
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, previous)
            if (disposition := self._dispositions.get(sig)) is not None:
                _reinstall(sig, disposition)  # exactly what was there, a C handler included
        self._previous.clear()
        self._dispositions.clear()

    def _should_stop(self, step: int) -> bool:
        # jax's sync point wants a call at every step on every process, exchange or not
        notice = _jax_preemption_notice(step)
        if self._agreement is None:
            return self._requested or notice
        if notice or step % self._check_every:
            return notice  # the same answer on every process: nobody enters the exchange
        return self._agreement.any_flagged(self._requested)

    def check(
        self,
        step: int,
        items: Callable[[], Mapping[str, PyTree]],
        *,
        epoch: int | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> None:
        """At a step boundary: when any process was preempted, save ``items()`` as ``step`` and exit.

        Call it at every step, on every process, with the same ``step``.

        Args:
            step: the step just finished.
            items: builds the items to save (called only when saving).
            epoch: the epoch recorded with the save.
            metrics: the metrics recorded with the save. None of them can fail the save: a NaN
                or infinite one is recorded aside by the store (never ranked), and one that is
                not a number is left out with a warning.

        Raises:
            SystemExit: after the save, with ``exit_code``.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore, PreemptionHandler
            >>> with tempfile.TemporaryDirectory() as directory:
            ...     with OrbaxCheckpointStore(directory) as store, PreemptionHandler(store) as preemption:
            ...         preemption.check(0, lambda: {"model": {}})
        """
        if not self._should_stop(step):
            return
        self._stopping = True
        flush_before_saving(self._flush, step, "PreemptionHandler")
        latest = self._store.latest_step()
        if latest is None or step > latest:
            recorded = _numbers(metrics or {})
            self._store.save(
                step, items(), epoch=epoch, metrics=recorded, extra={"preempted": True}
            )
        self._store.close()
        sys.stdout.flush()
        raise SystemExit(self._exit_code)
