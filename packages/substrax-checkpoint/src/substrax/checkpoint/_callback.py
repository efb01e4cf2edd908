"""``CheckpointCallback``: the training-callback protocol, structurally, saving to a store."""

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np

from substrax.support import check_int, require

from ._protocol import CheckpointStore, PyTree


_logger = logging.getLogger(__name__)


class Flushable(Protocol):
    """Anything with a ``flush()``: the run's loggers, whose records a checkpoint must not outrun."""

    def flush(self) -> object:
        """Make every record so far durable."""
        ...


def flushables(flush: Flushable | Iterable[Flushable] | None) -> tuple[Flushable, ...]:
    """``flush=`` as a tuple (one object with a ``flush()`` method, several, or none); TypeError if not."""
    if flush is None:
        return ()
    many = isinstance(flush, Iterable) and not callable(getattr(flush, "flush", None))
    found: tuple[object, ...] = tuple(cast("Iterable[object]", flush)) if many else (flush,)
    for item in found:
        if not callable(getattr(item, "flush", None)):
            raise TypeError(
                "flush= takes objects with a flush() method (the run's loggers), got "
                f"{type(item).__name__}"
            )
    return cast("tuple[Flushable, ...]", found)


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
    """``value`` as a float: a number, or the last entry of a 1-d array; None for anything else."""
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and len(shape) == 1 and shape[0]:  # pyright: ignore[reportUnknownArgumentType]
        value = np.asarray(value)[-1]
    try:
        return float(value)  # pyright: ignore[reportArgumentType]
    except OverflowError:  # an int past float's range
        return math.inf if value > 0 else -math.inf  # pyright: ignore[reportOperatorIssue]
    except (TypeError, ValueError):
        return None


class CheckpointCallback:
    """Save the trainer's state every N epochs and/or every N steps, with the monitored metrics.

    It implements the training-callback hooks structurally (any ``CallbackList`` drives it).
    A save is labelled with the optimizer steps counted, from the store's latest step on a
    resumed run (``on_train_begin``). Before any ``on_batch_end`` it is labelled with the epoch
    number, or one past the latest step saved where the epoch is not above it (a resumed run
    driven by epochs alone, its epochs counted on or from 0 again), so labels keep increasing.
    An epoch end at the step its last batch just saved (``every_n_steps`` landing on the epoch
    end) saves that step again, ``overwrite=True``, with the epoch and the epoch's metrics over
    the batch's: the epoch's metrics (``val_loss``) reach the store. Any other save at or below
    the latest step saved is skipped with a warning naming both.
    A logged value stacked over the steps of one call is recorded as its last value; a NaN or
    infinite one is recorded aside by the store.

    Args:
        store: where checkpoints go.
        items: builds the items to save from the trainer (``{"model": nnx.state(trainer.model)}``).
        every_n_epochs: save at the end of every this many epochs (None: never at epoch end).
        every_n_steps: also save every this many optimizer steps (None: never mid-epoch).
        monitor: the log key (a string) or keys stored as metrics (None: every numeric log
            value); a key an epoch end's logs lack is warned about once.
        steps_per_call: optimizer steps that each ``on_batch_end`` stands for (>= 1).
        flush: the run's loggers (anything with a ``flush()``), flushed before every save (put
            this callback after the one that logs); a failed flush is warned about.

    Raises:
        ValueError: ``every_n_epochs``, ``every_n_steps`` or ``steps_per_call`` is not >= 1.
        TypeError: something in ``flush`` has no ``flush()`` method, or a ``monitor`` key is no
            string.

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
        monitor: str | Sequence[str] | None = None,
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
        self._monitor = (monitor,) if isinstance(monitor, str) else monitor
        if self._monitor is not None:
            self._monitor = tuple(self._monitor)
            if not all(isinstance(name, str) and name for name in self._monitor):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise TypeError(f"monitor={monitor!r} must be a log key or keys (strings)")
        self._missing: set[str] = set()  # monitored keys warned about, once each
        self._steps = 0
        self._counted = False  # whether on_batch_end has counted any step
        self._last_saved: int | None = None  # the latest step the store holds, to our knowledge
        # the step the latest batch end saved, and the metrics it recorded, until the next save
        self._batch_saved: tuple[int, dict[str, float]] | None = None

    @property
    def steps(self) -> int:
        """The number of optimizer steps counted so far (``steps_per_call`` per batch end)."""
        return self._steps

    def _metrics(self, logs: Mapping[str, Any]) -> dict[str, float]:
        """The numeric log values (a stacked one's last), non-finite ones included."""
        names = self._monitor if self._monitor is not None else tuple(logs)
        values = {name: _last_value(logs[name]) for name in names if name in logs}
        return {name: value for name, value in values.items() if value is not None}

    def _warn_missing(self, logs: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        """Warn once of each monitored key an epoch end's save records no value for."""
        for name in sorted(set(self._monitor or ()) - set(metrics) - set(logs) - self._missing):
            self._missing.add(name)
            _logger.warning(
                "CheckpointCallback: monitored key %r is not in the logs of this epoch's end "
                "(they hold %s); its save records no value for it (a misspelt key?)",
                name,
                sorted(logs),
            )

    def _save(
        self, trainer: object, step: int, epoch: int | None, logs: Mapping[str, Any] | None
    ) -> None:
        metrics = self._metrics(logs or {})
        batch_saved, self._batch_saved = self._batch_saved, None
        overwrite = False
        if epoch is not None and batch_saved is not None and batch_saved[0] == step:
            # every_n_steps landed on the epoch end: the step again, with the epoch's metrics
            overwrite = True
            metrics = {**batch_saved[1], **metrics}
        elif self._last_saved is not None and step <= self._last_saved:
            _logger.warning(
                "CheckpointCallback: the save of step %d (epoch %s) is skipped: the store's "
                "latest step is %d, and a store takes only steps above its latest; no optimizer "
                "step was counted (on_batch_end) since that one was saved",
                step,
                epoch,
                self._last_saved,
            )
            return
        if epoch is not None:  # a step's logs may lack the validation metrics: not warned
            self._warn_missing(logs or {}, metrics)
        flush_before_saving(self._flush, step, "CheckpointCallback")
        self._store.save(
            step, self._items(trainer), epoch=epoch, metrics=metrics, overwrite=overwrite
        )
        self._last_saved = step
        if epoch is None:
            self._batch_saved = (step, metrics)

    def on_train_begin(self, trainer: object, /) -> None:
        """Start counting steps from the store's latest step (a resumed run continues)."""
        del trainer
        self._batch_saved = None  # a second fit: its first epoch end is not that batch's
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
        if self._counted:
            step = self._steps
        elif self._last_saved is not None and epoch <= self._last_saved:
            step = self._last_saved + 1  # a resumed run whose epochs are no steps above the latest
        else:
            step = epoch
        self._save(trainer, step, epoch, logs)

    def on_batch_begin(self, trainer: object, batch: object, /) -> None:
        """Nothing to do before a batch."""

    def on_batch_end(
        self, trainer: object, batch: object, logs: Mapping[str, Any] | None, /
    ) -> None:
        """Count the call's optimizer steps; save when the count reaches a multiple of ``every_n_steps``."""
        del batch
        before, self._steps = self._steps, self._steps + self._steps_per_call
        self._counted = True
        self._batch_saved = None  # the state moved on from the step a batch end saved
        every = self._every_n_steps
        if every is not None and self._steps // every > before // every:
            self._save(trainer, self._steps, None, logs)

    def on_validation_begin(self, trainer: object, /) -> None:
        """Nothing to do before validation."""

    def on_validation_end(self, trainer: object, logs: Mapping[str, Any] | None, /) -> None:
        """Nothing to do after validation (metrics are taken from ``on_epoch_end``'s logs)."""
