"""An opt-in preemption handler: on SIGTERM (or jax's preemption notice) save, close, exit 0."""

import contextlib
import ctypes
import itertools
import logging
import math
import signal
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import Any, NoReturn, Self

import jax

from substrax.support import check_int

from ._callback import Flushable, flush_before_saving, flushables
from ._lock import TIMEOUT_MS, coordination_client
from ._protocol import CheckpointStore, PyTree
from ._write_errors import CheckpointNotWrittenError, NotWrittenReason


type Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

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
    """The C-level ``struct sigaction`` of ``sig`` (None where unavailable): jax's reads as SIG_DFL."""
    buffer = ctypes.create_string_buffer(512)  # larger than any platform's struct sigaction
    try:
        sigaction = ctypes.CDLL(None).sigaction
    except (OSError, AttributeError):  # no POSIX sigaction (Windows)
        return None
    return buffer if sigaction(int(sig), None, buffer) == 0 else None


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` as floats (NaN and infinities kept); a value that is no number is left out."""
    numbers: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            numbers[name] = float(value)
        except OverflowError:  # an int past float's range: an infinity, set aside as one
            numbers[name] = math.inf if value > 0 else -math.inf
        except (TypeError, ValueError):
            _logger.warning(
                "the preemption save leaves out the metric %r: %r is not a number", name, value
            )
    return numbers


class _Agreement:
    """The logical OR of every process's flag: written by flagged processes, read after a barrier."""

    def __init__(self, session: int) -> None:
        self._client = coordination_client("the PreemptionHandler")
        self._prefix = f"substrax_preemption/{session}"
        self._process = jax.process_index()
        self._round = 0

    def any_flagged(self, flagged: bool) -> bool:
        round_, self._round = self._round, self._round + 1
        if flagged:
            self._client.key_value_set(f"{self._prefix}/{round_}/{self._process}", "1")
        self._client.wait_at_barrier(f"{self._prefix}/barrier", TIMEOUT_MS)
        return bool(self._client.key_value_dir_get(f"{self._prefix}/{round_}/"))


class PreemptionHandler:
    """Save a last checkpoint and exit cleanly when the process is told it will be preempted.

    Inside ``with PreemptionHandler(store):`` a SIGTERM only sets a flag; the training loop calls
    ``check(step, items)`` at every step boundary, which then saves the step, closes the store
    and raises ``SystemExit(exit_code)``. Later signals are absorbed. A step below the store's
    latest is never saved, so ``check`` raises ``CheckpointNotWrittenError`` for it, never exits.
    A signal after the last ``check`` is not lost: leaving the block raises ``SystemExit`` then,
    with a warning that nothing was saved for it.

    With several processes (``jax.distributed``) every process stops at the same step: ``check``
    exchanges the flags through ``jax.distributed``'s key-value store, a round trip per step;
    ``check_every=K`` exchanges only at steps divisible by ``K``. Every process must call
    ``check`` with the same steps. ``check`` also asks jax's own preemption service at every
    step; jax's C-level SIGTERM handler is put back exactly on leaving the block.

    Args:
        store: where the last checkpoint goes.
        signals: the signals that mean "preempted" (SIGTERM by default).
        exit_code: the status the process exits with after the save.
        check_every: with several processes, exchange the flags only at steps divisible by this.
        flush: the run's loggers (anything with a ``flush()``), flushed before the save (a
            failed flush is warned about, and the checkpoint saved anyway).

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

    def __exit__(self, error_type: object, *_exc_info: object) -> None:
        self._agreement = None
        if self._stopping:  # on the way out after a preemption save: keep absorbing signals
            return
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, previous)
            if (disposition := self._dispositions.get(sig)) is not None:
                ctypes.CDLL(None).sigaction(int(sig), disposition, None)  # a C handler included
        self._previous.clear()
        self._dispositions.clear()
        if self._requested and error_type is None:  # after the last check(): exit all the same
            _logger.warning(
                "PreemptionHandler: the process was told to stop after the last check() (in "
                "the loop's end, a final evaluation); nothing was saved for it, and it exits "
                "with %d as check() would",
                self._exit_code,
            )
            raise SystemExit(self._exit_code)

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

        Call it at every step, on every process, with the same ``step``: the run's global step,
        counting on from a restored one. ``items`` (a function, refused at once otherwise) is
        called only to save; ``epoch`` and
        ``metrics`` are recorded with the save (a non-finite metric aside, one that is no number
        left out with a warning). Then ``SystemExit(exit_code)`` is raised. A ``step`` that is
        the store's latest already is saved again (``overwrite``), keeping its epoch and metrics
        unless given: what changed after that save (an epoch end's callbacks) is kept too. One
        below the latest cannot be saved, and raises ``CheckpointNotWrittenError``
        (``below_latest``) instead of exiting as if the state were saved.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore, PreemptionHandler
            >>> with tempfile.TemporaryDirectory() as directory:
            ...     with OrbaxCheckpointStore(directory) as store, PreemptionHandler(store) as preemption:
            ...         preemption.check(0, lambda: {"model": {}})
        """
        if not callable(items):  # refused at every step, not first at the preemption
            raise TypeError(
                f"items must be a function returning the items to save, such as lambda: "
                f"{{'model': nnx.state(model)}}, not {type(items).__name__}"
            )
        if not self._should_stop(step):
            return
        latest = self._store.latest_step()
        if latest is not None and step < latest:
            self._refuse(step, latest)
        flush_before_saving(self._flush, step, "PreemptionHandler")
        recorded = _numbers(metrics or {})
        saved = items()
        if latest == step:  # saved at this boundary already: again, with what changed since
            earlier = self._store.read_metadata(step)  # (an epoch end's learning-rate cut)
            epoch = earlier.epoch if epoch is None else epoch
            recorded = {**earlier.metrics, **earlier.nonfinite_metrics, **recorded}
            if dropped := sorted(set(earlier.items) - set(saved)):
                _logger.warning(
                    "PreemptionHandler: step %d is saved again without the items %s its earlier "
                    "save held (a CheckpointCallback's?); give them in items= to keep them",
                    step,
                    dropped,
                )
        self._store.save(
            step,
            saved,
            epoch=epoch,
            metrics=recorded,
            extra={"preempted": True},
            overwrite=latest == step,
        )
        self._stopping = True
        self._store.close()
        sys.stdout.flush()
        raise SystemExit(self._exit_code)

    def _refuse(self, step: int, latest: int) -> NoReturn:
        """Raise ``CheckpointNotWrittenError``: ``step`` is below the store's latest step."""
        error = CheckpointNotWrittenError(
            step=step, latest_step=latest, reason=NotWrittenReason.BELOW_LATEST
        )
        error.add_note(
            f"PreemptionHandler.check({step}): the process was preempted and its state is NOT "
            f"saved, so it does not exit {self._exit_code}: the store holds step {latest}. "
            "Pass check() the run's global step, counting on from the restored step (a loop "
            "that counts from 0 again after a resume passes steps below the latest)."
        )
        raise error
