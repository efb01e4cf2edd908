"""The training-callback protocol and its no-op base class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


type Logs = Mapping[str, Any]
"""The metrics a trainer hands to a hook, by name (``{"loss": 0.3, "val_loss": 0.4}``)."""


@runtime_checkable
class TrainerLike(Protocol):
    """What a callback may assume about the trainer that drives it: it has a ``model``.

    Example:
        >>> from substrax.callbacks import TrainerLike
        >>> class Trainer:
        ...     model = None
        >>> isinstance(Trainer(), TrainerLike)
        True
    """

    @property
    def model(self) -> Any:  # noqa: ANN401  (any model type)
        """The model being trained."""


@runtime_checkable
class TrainingCallback(Protocol):
    """The hooks a trainer calls during training; every parameter is positional-only.

    Example:
        >>> from substrax.callbacks import BaseCallback, TrainingCallback
        >>> isinstance(BaseCallback(), TrainingCallback)
        True
    """

    __slots__ = ()

    def on_train_begin(self, trainer: object, /) -> None:
        """Called once before the first epoch."""

    def on_train_end(self, trainer: object, /) -> None:
        """Called once after the last epoch."""

    def on_epoch_begin(self, trainer: object, epoch: int, /) -> None:
        """Called at the start of each epoch."""

    def on_epoch_end(self, trainer: object, epoch: int, logs: Logs, /) -> None:
        """Called at the end of each epoch with that epoch's metrics."""

    def on_batch_begin(self, trainer: object, batch: int, /) -> None:
        """Called before each training step."""

    def on_batch_end(self, trainer: object, batch: int, logs: Logs, /) -> None:
        """Called after each training step with its metrics."""

    def on_validation_begin(self, trainer: object, /) -> None:
        """Called before a validation pass."""

    def on_validation_end(self, trainer: object, logs: Logs, /) -> None:
        """Called after a validation pass with its metrics."""


class BaseCallback(TrainingCallback):
    """A callback whose every hook does nothing; subclass it and override the hooks you need.

    Example:
        >>> from substrax.callbacks import BaseCallback
        >>> class CountSteps(BaseCallback):
        ...     def __init__(self) -> None:
        ...         self.steps = 0
        ...
        ...     def on_batch_end(self, trainer, batch, logs, /) -> None:
        ...         self.steps += 1
        >>> counter = CountSteps()
        >>> counter.on_batch_end(None, 0, {})
        >>> counter.steps
        1
    """

    __slots__ = ()
