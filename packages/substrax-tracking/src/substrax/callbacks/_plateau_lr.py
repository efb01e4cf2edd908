"""ReduceLROnPlateauCallback: scale the learning rate down when a metric stops improving."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, cast

from substrax.support import Mode, check_float, check_int

from ._errors import NoLearningRateFoundError
from ._metrics import check_monitor, metric_value, monitored
from ._protocol import BaseCallback, Logs
from ._tracker import LARGEST, BestMetricTracker, check_state, state_number


_logger = logging.getLogger(__name__)


def _is_plateau_state(node: object) -> bool:
    """Whether ``node`` is an ``optax.contrib.reduce_on_plateau`` state (a named tuple)."""
    fields = getattr(type(node), "_fields", ())
    return isinstance(node, tuple) and "scale" in fields and "plateau_count" in fields


def _is_variable(leaf: Any) -> bool:
    return callable(getattr(leaf, "get_value", None)) and callable(getattr(leaf, "set_value", None))


def _set(leaf: Any, value: float) -> Any:
    """``leaf`` set to ``value``: in place for a flax nnx Variable, else a new array of its dtype."""
    if _is_variable(leaf):
        leaf.set_value(_set(leaf.get_value(), value))
        return leaf
    if getattr(leaf, "dtype", None) is None:
        return value
    import jax.numpy as jnp  # noqa: PLC0415  (only reached with a jax optimizer state)

    return jnp.asarray(value, dtype=leaf.dtype)


class ReduceLROnPlateauCallback(BaseCallback):
    """Multiply the learning rate by ``factor`` when ``monitor`` has not improved for ``patience`` checks.

    It sets the ``scale`` of a chained ``optax.contrib.reduce_on_plateau`` state (built with a
    large ``patience``), or each ``optax.inject_hyperparams`` group's ``hyperparams[hyperparam]``
    to its first value times ``scale``. A flax ``nnx.Optimizer`` (``optimizer=`` or
    ``trainer.optimizer``) is changed in place; a plain optax state goes through :meth:`apply`.
    ``substrax.spmd.TrainStep`` passes no ``value=`` to the update: use ``inject_hyperparams``
    there. A NaN or infinite metric counts as a plateau at once. It warns once when what it set
    was changed by the next epoch end (a schedule, the chained transformation's own plateaus),
    and when a scale it lowered was written nowhere (no optimizer, no :meth:`apply` call).

    Args:
        monitor: the metric name in the epoch-end logs.
        factor: the multiplier on each plateau, in (0, 1).
        patience: checks without improvement before reducing (>= 1).
        min_delta: the improvement margin.
        mode: ``"min"`` or ``"max"``.
        cooldown: checks to wait after a reduction before counting again.
        min_scale: the smallest scale.
        hyperparam: the injected hyperparameter to drive.
        optimizer: an object with ``opt_state``; else ``trainer.optimizer`` is used if present.
        strict: raise :class:`MissingMetricError` when ``monitor`` is absent.

    Example:
        >>> from substrax.callbacks import ReduceLROnPlateauCallback
        >>> callback = ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1)
        >>> for epoch, loss in enumerate([1.0, 1.0, 1.0]):
        ...     callback.on_epoch_end(None, epoch, {"loss": loss})
        >>> callback.scale
        0.25
    """

    def __init__(
        self,
        *,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        min_delta: float = 0.0,
        mode: Mode | str = Mode.MIN,
        cooldown: int = 0,
        min_scale: float = 0.0,
        hyperparam: str = "learning_rate",
        optimizer: Any = None,
        strict: bool = True,
    ) -> None:
        self.factor = check_float(
            "factor", factor, minimum=0, maximum=1, exclusive_minimum=True, exclusive_maximum=True
        )
        self.patience = check_int("patience", patience, minimum=1)
        self.cooldown = check_int("cooldown", cooldown, minimum=0)
        self.min_scale = check_float("min_scale", min_scale, minimum=0, maximum=1)
        self.monitor = check_monitor(monitor)
        if not isinstance(hyperparam, str) or not hyperparam:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"hyperparam={hyperparam!r} must name an injected hyperparameter")
        self.hyperparam = hyperparam
        self.optimizer = optimizer
        self.strict = strict
        self._tracker = BestMetricTracker(mode=mode, min_delta=min_delta)
        self._scale = 1.0
        self._cooldown_left = 0
        self._bases: list[float] = []  # each injected group's value before any scaling
        self._written: list[float] = []  # the value each was last given
        self._applied = 1.0  # the scale apply() last wrote
        self._plateau_written: float | None = None  # the reduce_on_plateau scale it wrote
        self._warned: set[str] = set()  # the kinds of warning given, once each

    @property
    def scale(self) -> float:
        """The current multiplier on the learning rate (1.0 before any plateau)."""
        return self._scale

    def on_epoch_end(self, trainer: object, epoch: int, logs: Logs, /) -> None:
        """Register the metric, reduce the scale on a plateau, and write it into the optimizer."""
        self._check_applied()
        if not monitored(self.monitor, logs, "on_epoch_end", strict=self.strict):
            return
        value = metric_value(self.monitor, logs[self.monitor], who=type(self).__name__)
        finite = math.isfinite(value)
        if finite:  # an infinity is no best to beat (PSNR on a perfect batch): a plateau at once
            self._tracker.register(value)
        if self._cooldown_left > 0:
            self._cooldown_left -= 1
            self._tracker.set_state({"best": self._tracker.best, "num_bad_epochs": 0})
            return
        if self._tracker.num_bad_epochs >= self.patience or not finite:
            old, self._scale = self._scale, max(self._scale * self.factor, self.min_scale)
            if self._scale < old:
                message = "%s plateaued at epoch %d: learning-rate scale %g -> %g"
                _logger.info(message, self.monitor, epoch, old, self._scale)
            self._cooldown_left = self.cooldown
            self._tracker.set_state({"best": self._tracker.best, "num_bad_epochs": 0})
        optimizer = (
            self.optimizer if self.optimizer is not None else getattr(trainer, "optimizer", None)
        )
        if optimizer is not None and hasattr(optimizer, "opt_state"):
            state = self.apply(optimizer.opt_state)
            if state is not optimizer.opt_state:  # a plain optax state: new tuples, not changed
                optimizer.opt_state = state

    def on_train_end(self, _trainer: object, /) -> None:
        """Warn if the last scale lowered was written nowhere."""
        self._check_applied()

    def _check_applied(self) -> None:
        """Warn once if a scale lowered at an epoch end was not written by the next hook."""
        if self._scale == self._applied or "nowhere" in self._warned:
            return
        self._warned.add("nowhere")
        message = (
            "ReduceLROnPlateauCallback lowered its learning-rate scale to %g, but wrote it "
            "nowhere: it found no optimizer (pass optimizer=, an object with opt_state, or give "
            "the trainer an .optimizer), and apply(opt_state) was not called; the learning rate "
            "is unchanged"
        )
        _logger.warning(message, self._scale)

    def apply(self, opt_state: Any) -> Any:
        """Write the current scale into ``opt_state``; return the (possibly new) state.

        Raises:
            NoLearningRateFoundError: the state holds neither kind of learning-rate knob.
        """
        found = 0  # the knobs found: the injected groups count in order

        def visit(node: Any) -> Any:
            nonlocal found
            if _is_plateau_state(node):
                found += 1
                self._check_written("plateau", node.scale, self._plateau_written)
                scale = _set(node.scale, self._scale)
                return node if scale is node.scale else node._replace(scale=scale)
            hyperparams = getattr(node, "hyperparams", None)
            if isinstance(hyperparams, Mapping) and self.hyperparam in hyperparams:
                found += 1
                return self._inject(node, cast("Mapping[str, Any]", hyperparams), found - 1)
            if isinstance(node, tuple | list | dict):  # rebuilt only where a child is new
                items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
                new = [(key, visit(child)) for key, child in items]
                if all(a is b for (_, a), (_, b) in zip(new, items, strict=True)):
                    return node  # an nnx state set in place stays the object a TrainStep holds
                if isinstance(node, dict):
                    return dict(new)
                values = [value for _, value in new]
                return type(node)(*values) if hasattr(type(node), "_fields") else type(node)(values)
            if isinstance(node, Mapping):  # e.g. nnx.State: mutate children in place
                for child in node.values():
                    visit(child)
            return node

        result = visit(opt_state)
        if not found:
            raise NoLearningRateFoundError(self.hyperparam)
        self._applied = self._plateau_written = self._scale
        return result

    def _check_written(self, kind: str, leaf: Any, written: float | None) -> None:
        """Warn once per ``kind`` if ``leaf`` no longer holds the value ``written`` into it."""
        if written is None or kind in self._warned:
            return
        current = float(leaf.get_value() if _is_variable(leaf) else leaf)
        if math.isclose(current, written, rel_tol=1e-5):
            return
        self._warned.add(kind)
        if kind == "plateau":
            message = (
                "ReduceLROnPlateauCallback: the chained reduce_on_plateau's scale is %g, not the "
                "%g it was set to: the transformation lowers it itself (its own patience ran "
                "out), and this callback sets it back, so the run trains at another rate than "
                "it reports; build reduce_on_plateau with a patience it never reaches (e.g. "
                "patience=10**9) and leave the plateaus to this callback"
            )
            _logger.warning(message, current, written)
            return
        message = (
            "ReduceLROnPlateauCallback: the injected %s is %g, not the %g it was set to: "
            "something else sets it at every update (an optax schedule given to "
            "inject_hyperparams is recomputed each step), so this callback's scale does "
            "not last; inject a constant, or chain optax.contrib.reduce_on_plateau. Or, after "
            "a resume, the optimizer's state was not restored with this callback's: restore "
            "both from one checkpoint"
        )
        _logger.warning(message, self.hyperparam, current, written)

    def _inject(self, node: Any, hyperparams: Mapping[str, Any], group: int) -> Any:
        """``node`` (an ``inject_hyperparams`` state, ``group``) scaled; an nnx one in place."""
        leaf = hyperparams[self.hyperparam]
        if group == len(self._bases):  # its base is its first value seen
            self._bases.append(float(leaf.get_value() if _is_variable(leaf) else leaf))
            self._written.append(self._bases[group])
        self._check_written("schedule", leaf, self._written[group])
        self._written[group] = self._bases[group] * self._scale
        new_leaf = _set(leaf, self._written[group])
        if _is_variable(leaf) or not hasattr(node, "_replace"):
            if isinstance(hyperparams, dict):
                hyperparams[self.hyperparam] = new_leaf
            return node
        return node._replace(hyperparams={**hyperparams, self.hyperparam: new_leaf})

    def get_state(self) -> dict[str, Any]:
        """The state to checkpoint, strict JSON."""
        return {
            "tracker": self._tracker.get_state(),
            "scale": self._scale,
            "cooldown_left": self._cooldown_left,
            "base_lr": self._bases[0] if len(self._bases) == 1 else (self._bases or None),
            "monitor": self.monitor,
            "mode": self._tracker.mode.value,
        }

    def set_state(self, state: dict[str, Any], /) -> None:
        """Restore a state from :meth:`get_state` (``monitor`` and ``mode`` may be absent).

        Raises:
            ValueError: a key is missing or unknown, or a value is malformed (the message names it).
            MonitorMismatchError: the state was saved for another monitor or mode.
        """
        who, required = type(self).__name__, {"tracker", "scale", "cooldown_left", "base_lr"}
        checked = check_state(who, state, required, monitor=self.monitor, mode=self._tracker.mode)
        scale = state_number(who, checked, "scale", "a number in [0, 1]", low=0, high=1)
        cooldown = state_number(
            who, checked, "cooldown_left", "an integer >= 0", integer=True, low=0
        )
        wanted = "None, a finite number, or a list of them (one per injected group)"
        bases = checked["base_lr"] if isinstance(checked["base_lr"], list) else [checked["base_lr"]]
        values = [
            state_number(
                who, {"base_lr": b}, "base_lr", wanted, low=-LARGEST, high=LARGEST, none=True
            )
            for b in bases
        ]
        self._tracker.set_state(checked["tracker"])
        self._scale, self._cooldown_left = scale, cooldown
        self._applied, self._plateau_written = scale, None  # the optimizer's state is restored too
        self._bases = [float(v) for v in values if v is not None]
        self._written = [b * scale for b in self._bases]
