"""An opt-in preemption handler: on SIGTERM (or jax's preemption notice) save, close, exit 0."""

import contextlib
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any, Self

from ._protocol import CheckpointStore, PyTree


type Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _jax_preemption_notice(step: int) -> bool:
    """Whether jax's preemption sync point is reached (False where jax offers no such notice)."""
    import jax  # noqa: PLC0415 - jax is loaded by the store already

    if jax.process_count() == 1:
        return False
    from jax.experimental import multihost_utils  # noqa: PLC0415 - multi-process only

    try:
        return bool(multihost_utils.reached_preemption_sync_point(step))
    except RuntimeError:  # the preemption sync manager is not initialised
        return False


class PreemptionHandler:
    """Save a last checkpoint and exit cleanly when the process is told it will be preempted.

    Inside ``with PreemptionHandler(store):`` a SIGTERM only sets a flag; the training loop calls
    ``check(step, items)`` at a step boundary (where the state is consistent), which saves the
    step, waits for the write, closes the store and raises ``SystemExit(exit_code)``. With
    several processes, jax's preemption sync point is honoured too, so every process stops at the
    same step.

    Args:
        store: where the last checkpoint goes.
        signals: the signals that mean "preempted" (SIGTERM by default).
        exit_code: the status the process exits with after the save.

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> from substrax.checkpoint import OrbaxCheckpointStore
        >>> store = OrbaxCheckpointStore(tempfile.mkdtemp())
        >>> with PreemptionHandler(store) as preemption:
        ...     for step in range(3):
        ...         preemption.check(step, lambda: {"model": {"w": np.zeros(2)}})
        >>> preemption.requested
        False
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        signals: Sequence[signal.Signals] = (signal.SIGTERM,),
        exit_code: int = 0,
    ) -> None:
        self._store = store
        self._signals = tuple(signals)
        self._exit_code = exit_code
        self._requested = False
        self._previous: dict[signal.Signals, Handler] = {}

    @property
    def requested(self) -> bool:
        """Whether a preemption signal arrived."""
        return self._requested

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self._requested = True

    def __enter__(self) -> Self:
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, previous)
        self._previous.clear()

    def check(
        self,
        step: int,
        items: Callable[[], Mapping[str, PyTree]],
        *,
        epoch: int | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> None:
        """At a step boundary: when preempted, save ``items()`` as ``step`` and exit."""
        if not (self._requested or _jax_preemption_notice(step)):
            return
        latest = self._store.latest_step()
        if latest is None or step > latest:
            self._store.save(step, items(), epoch=epoch, metrics=metrics, extra={"preempted": True})
        self._store.close()
        sys.stdout.flush()
        raise SystemExit(self._exit_code)
