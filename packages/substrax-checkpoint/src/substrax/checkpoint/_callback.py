"""``CheckpointCallback``: the training-callback protocol, structurally, saving to a store."""

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from substrax.support import check_int, require

from ._protocol import CheckpointStore, PyTree


_logger = logging.getLogger(__name__)


class Flushable(Protocol):
    """Anything with a ``flush()``: the run's loggers, whose records a checkpoint must not outrun.

    A ``substrax.tracking`` logger's ``flush()`` writes (and fsyncs) or delivers (or spools)
    every record logged so far; this package does not import it, and takes any such object.
    """

    def flush(self) -> object:
        """Make every record so far durable."""
        ...


def flushables(flush: Flushable | Iterable[Flushable] | None) -> tuple[Flushable, ...]:
    """``flush=`` as a tuple: one object with a ``flush()`` method, or several, or none.

    Raises:
        TypeError: something given has no ``flush()`` method.

    Example:
        >>> import io
        >>> from substrax.checkpoint._callback import flushables
        >>> stream = io.StringIO()
        >>> flushables(stream) == (stream,), flushables(None)
        (True, ())
    """
    if flush is None:
        return ()
    if callable(getattr(flush, "flush", None)):
        return (flush,)  # pyright: ignore[reportReturnType]
    if not isinstance(flush, Iterable):
        raise TypeError(
            f"flush= takes objects with a flush() method (the run's loggers), got "
            f"{type(flush).__name__}"
        )
    return tuple(_checked_flushable(item) for item in flush)  # pyright: ignore[reportUnknownVariableType]


def _checked_flushable(item: object) -> Flushable:
    """``item``, checked to have a ``flush()`` method.

    Raises:
        TypeError: it has none.
    """
    if not callable(getattr(item, "flush", None)):
        raise TypeError(
            f"flush= takes objects with a flush() method (the run's loggers), got "
            f"{type(item).__name__} {item!r:.80}"
        )
    return item  # pyright: ignore[reportReturnType]


def flush_before_saving(targets: Sequence[Flushable], step: int, who: str) -> None:
    """Call each target's ``flush()`` before the save of ``step``; a failure never costs the save."""
    for target in targets:
        try:
            target.flush()
        except Exception as error:
            _logger.warning(
                "%s: %r could not flush before the save of step %d (%s: %s); the checkpoint is "
                "saved all the same, and records of steps up to it may be missing after a crash",
                who,
                target,
                step,
                type(error).__name__,
                error,
            )


def _model_items(trainer: object) -> dict[str, PyTree]:
    """``nnx.state(trainer.model)``; flax is optional for substrax-checkpoint (``MissingExtraError``)."""
    nnx = require(
        "flax.nnx",
        who="CheckpointCallback without items= (pass items= to save something else)",
        distribution="substrax-runtime",
        extra="nnx",
    )
    return {"model": nnx.state(getattr(trainer, "model"))}  # noqa: B009 - any trainer with .model


def _last_value(value: object) -> float | None:
    """``value`` as a float: a number, or the last entry of a 1-d array; None for anything else.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._callback import _last_value
        >>> _last_value(np.array([0.5, 0.25])), _last_value(2), _last_value("text")
        (0.25, 2.0, None)
    """
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and len(shape) == 1 and shape[0]:  # pyright: ignore[reportUnknownArgumentType]
        value = np.asarray(value)[-1]
    try:
        return float(value)  # pyright: ignore[reportArgumentType]
    except (TypeError, ValueError):
        return None


class CheckpointCallback:
    """Save the trainer's state every N epochs and/or every N steps, with the monitored metrics.

    It implements the training-callback hooks structurally (``on_train_begin`` …
    ``on_validation_end``), so any ``CallbackList`` drives it without this package importing
    ``substrax.callbacks``. Optimizer steps are counted by ``on_batch_end``, ``steps_per_call``
    per call (as ``ThroughputMeter`` counts them); a save is labelled with that count. An
    epoch-end save uses it as its step (or the epoch number before any batch was seen), and
    skips a step already saved.

    A logged value stacked over the ``steps_per_call`` optimizer steps of one call (the loss of
    ``TrainStep(steps_per_call=k)``, shape ``(k,)``) is recorded as its last value, that of the
    step saved. A NaN or infinite metric (a diverged step) never costs the checkpoint: the store
    saves the step and records the metric aside, out of ``best_step`` and ``keep_best``.

    ``flush=`` takes the run's loggers (anything with a ``flush()`` method; ``substrax.tracking``
    loggers write and fsync, or deliver or spool, every record logged so far): each is flushed
    before every save, so that a process killed right after a checkpoint (SIGKILL included)
    leaves every record of the steps it covers, and a run resumed from it finds them all. Put
    this callback after the one that logs a step's metrics, so that the step saved is logged
    before the flush. A flush that raises is warned about and the checkpoint is saved anyway.

    Args:
        store: where checkpoints go.
        items: builds the items to save from the trainer (default:
            ``{"model": nnx.state(trainer.model)}``).
        every_n_epochs: save at the end of every this many epochs (None: never at epoch end).
        every_n_steps: also save every this many optimizer steps (None: never mid-epoch): at
            the first ``on_batch_end`` whose count reaches a multiple of it.
        monitor: the log keys stored as metrics (None: every numeric log value).
        steps_per_call: optimizer steps that each ``on_batch_end`` stands for (>= 1): the
            ``steps_per_call`` of the train step called once per batch end.
        flush: the loggers (one, or several) flushed before each save.

    Raises:
        ValueError: ``every_n_epochs``, ``every_n_steps`` or ``steps_per_call`` is not an
            int >= 1.
        TypeError: something in ``flush`` has no ``flush()`` method.

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> from substrax.checkpoint import OrbaxCheckpointStore, CheckpointCallback
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     with OrbaxCheckpointStore(directory) as store:
        ...         callback = CheckpointCallback(store, items=lambda t: {"model": {"w": np.zeros(2)}})
        ...         callback.on_epoch_end(None, 0, {"val_loss": 0.5})
        ...         callback.on_train_end(None)
        ...         store.read_metadata(0).metrics
        {'val_loss': 0.5}
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        items: Callable[[object], Mapping[str, PyTree]] | None = None,
        every_n_epochs: int | None = 1,
        every_n_steps: int | None = None,
        monitor: Sequence[str] | None = None,
        steps_per_call: int = 1,
        flush: Flushable | Iterable[Flushable] | None = None,
    ) -> None:
        self._flush = flushables(flush)
        for name, value in (("every_n_epochs", every_n_epochs), ("every_n_steps", every_n_steps)):
            if value is not None:
                check_int(name, value, minimum=1)
        check_int("steps_per_call", steps_per_call, minimum=1)
        self._steps_per_call = steps_per_call
        self._store = store
        self._items = items or _model_items
        self._every_n_epochs = every_n_epochs
        self._every_n_steps = every_n_steps
        self._monitor = None if monitor is None else tuple(monitor)
        self._steps = 0
        self._last_saved: int | None = None
        self._last_logs: Mapping[str, Any] = {}

    @property
    def steps(self) -> int:
        """The number of optimizer steps counted so far (``steps_per_call`` per batch end)."""
        return self._steps

    def _metrics(self, logs: Mapping[str, Any] | None) -> dict[str, float]:
        """The numeric log values (a stacked one's last), non-finite ones included."""
        logs = logs or {}
        names = self._monitor if self._monitor is not None else tuple(logs)
        metrics: dict[str, float] = {}
        for name in names:
            if name not in logs:
                continue
            value = _last_value(logs[name])
            if value is not None:
                metrics[name] = value
        return metrics

    def _save(
        self, trainer: object, step: int, epoch: int | None, logs: Mapping[str, Any] | None
    ) -> None:
        if self._last_saved is not None and step <= self._last_saved:
            return
        flush_before_saving(self._flush, step, "CheckpointCallback")
        self._store.save(step, self._items(trainer), epoch=epoch, metrics=self._metrics(logs))
        self._last_saved = step

    def on_train_begin(self, trainer: object, /) -> None:
        """Start counting steps from the store's latest step (a resumed run continues)."""
        del trainer
        latest = self._store.latest_step()
        if latest is not None:
            self._steps = max(self._steps, latest)
            self._last_saved = latest

    def on_train_end(self, trainer: object, /) -> None:
        """Wait for the last background write (its error, if any, is raised here)."""
        del trainer
        wait = getattr(self._store, "wait", None)
        if callable(wait):
            wait()

    def on_epoch_begin(self, trainer: object, epoch: int, /) -> None:
        """Nothing to do at the start of an epoch."""

    def on_epoch_end(self, trainer: object, epoch: int, logs: Mapping[str, Any] | None, /) -> None:
        """Save every ``every_n_epochs`` epochs, with the monitored metrics."""
        if self._every_n_epochs is None or (epoch + 1) % self._every_n_epochs:
            return
        self._save(trainer, self._steps if self._steps else epoch, epoch, logs)

    def on_batch_begin(self, trainer: object, batch: object, /) -> None:
        """Nothing to do before a batch."""

    def on_batch_end(
        self, trainer: object, batch: object, logs: Mapping[str, Any] | None, /
    ) -> None:
        """Count the call's optimizer steps; save when the count reaches a multiple of ``every_n_steps``."""
        del batch
        before, self._steps = self._steps, self._steps + self._steps_per_call
        every = self._every_n_steps
        if every is not None and self._steps // every > before // every:
            self._save(trainer, self._steps, None, logs)

    def on_validation_begin(self, trainer: object, /) -> None:
        """Nothing to do before validation."""

    def on_validation_end(self, trainer: object, logs: Mapping[str, Any] | None, /) -> None:
        """Nothing to do after validation (metrics are taken from ``on_epoch_end``'s logs)."""
