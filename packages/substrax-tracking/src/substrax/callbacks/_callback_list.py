"""CallbackList: call each hook on several callbacks in order, and gather their state."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from substrax.typing import Checkpointable, CheckpointState

from ._errors import CallbackStateMismatchError
from ._protocol import Logs, TrainingCallback


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

    __slots__ = ("_callbacks",)

    def __init__(self, callbacks: Iterable[TrainingCallback] | None = None) -> None:
        self._callbacks: list[TrainingCallback] = list(callbacks or ())

    def add(self, callback: TrainingCallback) -> None:
        """Append ``callback``; its hooks run after those already in the list."""
        self._callbacks.append(callback)

    def remove(self, callback: TrainingCallback) -> None:
        """Remove ``callback``.

        Raises:
            ValueError: ``callback`` is not in the list.
        """
        try:
            self._callbacks.remove(callback)
        except ValueError:
            raise ValueError(
                f"{callback!r} is not in this CallbackList; it holds {self._callbacks!r}"
            ) from None

    def __len__(self) -> int:
        return len(self._callbacks)

    def __iter__(self) -> Iterator[TrainingCallback]:
        return iter(tuple(self._callbacks))

    def __repr__(self) -> str:
        return f"CallbackList({self._callbacks!r})"

    def on_train_begin(self, trainer: object, /) -> None:
        """Call ``on_train_begin`` on every callback."""
        for callback in self._callbacks:
            callback.on_train_begin(trainer)

    def on_train_end(self, trainer: object, /) -> None:
        """Call ``on_train_end`` on every callback."""
        for callback in self._callbacks:
            callback.on_train_end(trainer)

    def on_epoch_begin(self, trainer: object, epoch: int, /) -> None:
        """Call ``on_epoch_begin`` on every callback."""
        for callback in self._callbacks:
            callback.on_epoch_begin(trainer, epoch)

    def on_epoch_end(self, trainer: object, epoch: int, logs: Logs, /) -> None:
        """Call ``on_epoch_end`` on every callback."""
        for callback in self._callbacks:
            callback.on_epoch_end(trainer, epoch, logs)

    def on_batch_begin(self, trainer: object, batch: int, /) -> None:
        """Call ``on_batch_begin`` on every callback."""
        for callback in self._callbacks:
            callback.on_batch_begin(trainer, batch)

    def on_batch_end(self, trainer: object, batch: int, logs: Logs, /) -> None:
        """Call ``on_batch_end`` on every callback."""
        for callback in self._callbacks:
            callback.on_batch_end(trainer, batch, logs)

    def on_validation_begin(self, trainer: object, /) -> None:
        """Call ``on_validation_begin`` on every callback."""
        for callback in self._callbacks:
            callback.on_validation_begin(trainer)

    def on_validation_end(self, trainer: object, logs: Logs, /) -> None:
        """Call ``on_validation_end`` on every callback."""
        for callback in self._callbacks:
            callback.on_validation_end(trainer, logs)

    def _stateful(self) -> dict[str, Checkpointable]:
        return {
            str(i): cb for i, cb in enumerate(self._callbacks) if isinstance(cb, Checkpointable)
        }

    def get_state(self) -> dict[str, CheckpointState]:
        """The states of the checkpointable callbacks, keyed by their position as a string."""
        return {key: cb.get_state() for key, cb in self._stateful().items()}

    def set_state(self, state: dict[str, CheckpointState], /) -> None:
        """Give each checkpointable callback its saved state back.

        Raises:
            CallbackStateMismatchError: the saved positions differ from this list's stateful ones.
        """
        stateful = self._stateful()
        if set(state) != set(stateful):
            raise CallbackStateMismatchError(tuple(stateful), tuple(sorted(state)))
        for key, callback in stateful.items():
            callback.set_state(state[key])
