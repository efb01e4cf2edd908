"""CallbackList: call each hook on several callbacks in order, and gather their state."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping

from substrax.support import check_type
from substrax.typing import Checkpointable, CheckpointState

from ._errors import CallbackStateMismatchError
from ._protocol import Logs, TrainingCallback


_logger = logging.getLogger(__name__)


def is_checkpointable(obj: object) -> bool:
    """Whether ``obj`` has ``get_state()`` and ``set_state(state, /)`` (``substrax.typing.Checkpointable``).

    Example:
        >>> from substrax.callbacks import EarlyStopping, is_checkpointable
        >>> is_checkpointable(EarlyStopping(patience=1)), is_checkpointable(object())
        (True, False)
    """
    return isinstance(obj, Checkpointable)


class CallbackList:
    """Several callbacks driven as one: each hook is called on every callback, in order.

    A ``CheckpointCallback`` that saves :meth:`get_state` goes after the callbacks with state,
    so that a save holds the update of the hook it runs in: :meth:`get_state` called from a
    callback's hook before callbacks with state have run it is warned about (once).

    Args:
        callbacks: the callbacks, in the order their hooks run.

    Example:
        >>> from substrax.callbacks import EarlyStoppingCallback, EarlyStoppingConfig, CallbackList
        >>> stopper = EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=1))
        >>> callbacks = CallbackList([stopper])
        >>> callbacks.on_epoch_end(None, 0, {"loss": 1.0})
        >>> callbacks.on_epoch_end(None, 1, {"loss": 2.0})
        >>> stopper.should_stop
        True
        >>> sorted(callbacks.get_state())
        ['0']
    """

    __slots__ = ("_callbacks", "_running", "_warned")

    def __init__(self, callbacks: Iterable[TrainingCallback] | None = None) -> None:
        self._callbacks: list[TrainingCallback] = []
        self._running: tuple[str, int] | None = None  # the hook running, and on which callback
        self._warned = False
        for callback in callbacks or ():
            self.add(callback)

    def add(self, callback: TrainingCallback) -> None:
        """Append ``callback`` (its hooks run last); a TypeError if it lacks a hook."""
        if not isinstance(callback, TrainingCallback):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(
                f"CallbackList takes callbacks with every TrainingCallback hook, got "
                f"{callback!r} ({type(callback).__name__}); subclass BaseCallback and override "
                "the hooks you need"
            )
        self._callbacks.append(callback)

    def remove(self, callback: TrainingCallback) -> None:
        """Remove ``callback``; a ValueError if it is not in the list."""
        if callback not in self._callbacks:
            raise ValueError(
                f"{callback!r} is not in this CallbackList; it holds {self._callbacks!r}"
            )
        self._callbacks.remove(callback)

    def __len__(self) -> int:
        return len(self._callbacks)

    def __iter__(self) -> Iterator[TrainingCallback]:
        return iter(tuple(self._callbacks))

    def __repr__(self) -> str:
        return f"CallbackList({self._callbacks!r})"

    def on_train_begin(self, trainer: object, /) -> None:
        """Call ``on_train_begin`` on every callback."""
        self._each("on_train_begin", trainer)

    def on_train_end(self, trainer: object, /) -> None:
        """Call ``on_train_end`` on each callback, even after one raised; then raise the first.

        The others are noted on it.
        """
        self._each("on_train_end", trainer, every=True)

    def on_epoch_begin(self, trainer: object, epoch: int, /) -> None:
        """Call ``on_epoch_begin`` on every callback."""
        self._each("on_epoch_begin", trainer, epoch)

    def on_epoch_end(self, trainer: object, epoch: int, logs: Logs, /) -> None:
        """Call ``on_epoch_end`` on every callback."""
        self._each("on_epoch_end", trainer, epoch, logs)

    def on_batch_begin(self, trainer: object, batch: int, /) -> None:
        """Call ``on_batch_begin`` on every callback."""
        self._each("on_batch_begin", trainer, batch)

    def on_batch_end(self, trainer: object, batch: int, logs: Logs, /) -> None:
        """Call ``on_batch_end`` on every callback."""
        self._each("on_batch_end", trainer, batch, logs)

    def on_validation_begin(self, trainer: object, /) -> None:
        """Call ``on_validation_begin`` on every callback."""
        self._each("on_validation_begin", trainer)

    def on_validation_end(self, trainer: object, logs: Logs, /) -> None:
        """Call ``on_validation_end`` on every callback."""
        self._each("on_validation_end", trainer, logs)

    def _each(self, hook: str, *args: object, every: bool = False) -> None:
        """Call ``hook`` on each callback, naming one that raised; ``every`` goes on past errors."""
        first: Exception | None = None
        for index, callback in enumerate(tuple(self._callbacks)):
            self._running = (hook, index)
            try:
                getattr(callback, hook)(*args)
            except Exception as error:
                where = f"in {callback!r}.{hook} (callback {index} of this CallbackList)"
                if first is None:
                    error.add_note(where)
                    if not every:
                        raise
                    first = error
                else:
                    first.add_note(f"{where}, after it, also: {type(error).__name__}: {error}")
            finally:
                self._running = None
        if first is not None:
            raise first

    def _stateful(self) -> dict[str, Checkpointable]:
        return {
            str(i): cb for i, cb in enumerate(self._callbacks) if isinstance(cb, Checkpointable)
        }

    def get_state(self) -> dict[str, CheckpointState]:
        """The states of the checkpointable callbacks, keyed by their position as a string."""
        stateful = self._stateful()
        later = [key for key in stateful if self._running and int(key) > self._running[1]]
        if later and not self._warned and self._running and self._running[0].endswith("_end"):
            self._warned = True
            message = (
                "CallbackList.get_state() was called from callback %d's %s (a CheckpointCallback "
                "saving it, most likely) before callbacks %s, which have state, ran that hook: "
                "the save holds their state before its update, and a run resumed from it loses "
                "it (the epoch's best value, the step's spike); put the saving callback after "
                "the callbacks with state"
            )
            _logger.warning(message, self._running[1], self._running[0], ", ".join(later))
        return {key: cb.get_state() for key, cb in stateful.items()}

    def set_state(self, state: dict[str, CheckpointState], /) -> None:
        """Give each checkpointable callback its saved state back.

        Raises:
            TypeError: ``state`` is not a mapping (a dict from :meth:`get_state`).
            CallbackStateMismatchError: the saved positions differ from this list's stateful ones.
        """
        check_type("state", state, Mapping, "a dict from CallbackList.get_state()")
        stateful = self._stateful()
        if set(state) != set(stateful):
            raise CallbackStateMismatchError(tuple(stateful), tuple(sorted(state)))
        for key, callback in stateful.items():
            callback.set_state(state[key])
