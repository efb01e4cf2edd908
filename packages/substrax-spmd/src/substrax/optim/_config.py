"""The optimizer configuration, validated on construction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from substrax.support import check_float

from ._errors import OptimizerConfigError


# assignments, not `type` statements: `typing.get_args` reads them, as in 0.1.22
OptimizerType = Literal["adam", "adamw", "sgd", "rmsprop", "adagrad", "lamb", "radam", "nadam"]
OPTIMIZER_TYPES: tuple[str, ...] = get_args(OptimizerType)
DECOUPLED_DECAY_TYPES: frozenset[str] = frozenset({"adamw", "lamb"})
MOMENTUM_TYPES: frozenset[str] = frozenset({"sgd", "rmsprop"})
# Those dividing by ``sqrt(v) + eps`` (or ``rsqrt(v + eps)``): with eps 0, a zero gradient gives
# NaN. sgd has no eps; adagrad divides only where its accumulator is above 0.
_POSITIVE_EPS_TYPES: frozenset[str] = frozenset(
    {"adam", "adamw", "lamb", "radam", "nadam", "rmsprop"}
)
# The optimizer types each moment field reaches; another type refuses it away from its default.
_MOMENT_TYPES: dict[str, tuple[float, frozenset[str]]] = {
    "b1": (0.9, frozenset({"adam", "adamw", "lamb", "radam", "nadam"})),
    "b2": (0.999, frozenset({"adam", "adamw", "lamb", "radam", "nadam"})),
    "eps": (1e-8, _POSITIVE_EPS_TYPES | {"adagrad"}),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerConfig:
    """What optimizer to build, validated on construction.

    Attributes:
        optimizer_type: One of :data:`OPTIMIZER_TYPES`.
        learning_rate: A positive constant or an ``optax`` schedule.
        b1: First-moment decay (adam family, lamb).
        b2: Second-moment decay (adam family, lamb; rmsprop keeps optax's ``decay`` of 0.9).
        eps: Numerical epsilon (all but sgd), 1e-8 for every type, as in 0.1.22 (plain optax's
            ``lamb`` and ``adagrad`` default to 1e-6 and 1e-7: pass those to match them). A
            moment field another type has no use for is refused away from its default, as
            ``momentum`` is.
        momentum: Momentum, for ``sgd`` and ``rmsprop`` only.
        weight_decay: Decoupled weight decay, for ``adamw`` and ``lamb`` only.
        weight_decay_filter: An nnx filter choosing the parameters that decay; all when None.
        gradient_clip_norm: Clip by global norm (exclusive with ``gradient_clip_value``).
        gradient_clip_value: Clip each element to ``[-v, v]``.
        wrt: The nnx filter of the variables the optimizer updates.

    Example:
        >>> from substrax.optim import OptimizerConfig
        >>> OptimizerConfig(optimizer_type="adamw", learning_rate=1e-3, weight_decay=0.01).optimizer_type
        'adamw'
    """

    optimizer_type: OptimizerType = "adam"
    learning_rate: float | optax.Schedule
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    momentum: float | None = None
    weight_decay: float = 0.0
    weight_decay_filter: Any = None
    gradient_clip_norm: float | None = None
    gradient_clip_value: float | None = None
    wrt: Any = nnx.Param

    def __post_init__(self) -> None:
        if self.optimizer_type not in OPTIMIZER_TYPES:
            msg = f"optimizer_type {self.optimizer_type!r} is unknown; use one of {OPTIMIZER_TYPES}"
            raise OptimizerConfigError(msg, field="optimizer_type", value=self.optimizer_type)
        _check_learning_rate(self.learning_rate)
        _check("b1", self.b1, minimum=0, maximum=1, exclusive_maximum=True)
        _check("b2", self.b2, minimum=0, maximum=1, exclusive_maximum=True)
        divides = self.optimizer_type in _POSITIVE_EPS_TYPES
        _check(
            "eps",
            self.eps,
            minimum=0,
            exclusive_minimum=divides,
            why=f" for {self.optimizer_type} (a zero gradient would give 0 / eps = NaN)"
            if divides
            else "",
        )
        _check("weight_decay", self.weight_decay, minimum=0)
        if self.momentum is not None:
            _check("momentum", self.momentum, minimum=0, maximum=1, exclusive_maximum=True)
        for name in ("gradient_clip_norm", "gradient_clip_value"):
            clip = getattr(self, name)
            if clip is not None:
                _check(name, clip, minimum=0, exclusive_minimum=True)
        if self.gradient_clip_norm is not None and self.gradient_clip_value is not None:
            msg = (
                f"set gradient_clip_norm ({self.gradient_clip_norm}) or gradient_clip_value "
                f"({self.gradient_clip_value}), not both"
            )
            raise OptimizerConfigError(
                msg, field="gradient_clip_norm", value=self.gradient_clip_norm
            )
        if self.weight_decay > 0 and self.optimizer_type not in DECOUPLED_DECAY_TYPES:
            msg = (
                f"weight_decay={self.weight_decay} needs decoupled decay; {self.optimizer_type!r} has "
                f"none, use one of {sorted(DECOUPLED_DECAY_TYPES)}"
            )
            raise OptimizerConfigError(msg, field="weight_decay", value=self.weight_decay)
        if self.momentum is not None and self.optimizer_type not in MOMENTUM_TYPES:
            msg = f"momentum is for {sorted(MOMENTUM_TYPES)}; {self.optimizer_type!r} does not take it"
            raise OptimizerConfigError(msg, field="momentum", value=self.momentum)
        for name, (default, types) in _MOMENT_TYPES.items():
            value = getattr(self, name)
            if value != default and self.optimizer_type not in types:
                msg = (
                    f"{name}={value} is for {sorted(types)}; {self.optimizer_type!r} does not take "
                    f"it and would ignore it (for another optax setting, such as rmsprop's "
                    "decay, build the optax optimizer itself and pass it to nnx.Optimizer)"
                )
                raise OptimizerConfigError(msg, field=name, value=value)
        self._check_weight_decay_filter()

    def _check_weight_decay_filter(self) -> None:
        if self.weight_decay_filter is None:
            return
        if isinstance(self.weight_decay_filter, str):
            msg = (
                f"weight_decay_filter {self.weight_decay_filter!r} is a string, which nnx reads as a "
                "tag; use nnx.PathContains(...) or a callable (path, value) -> bool"
            )
            raise TypeError(msg)
        if self.optimizer_type not in DECOUPLED_DECAY_TYPES or self.weight_decay == 0:
            msg = (
                f"weight_decay_filter {self.weight_decay_filter!r} has nothing to choose from: "
                f"{self.optimizer_type!r} with weight_decay={self.weight_decay} decays no "
                f"parameter; set weight_decay > 0 with one of {sorted(DECOUPLED_DECAY_TYPES)}, "
                "or drop the filter"
            )
            raise OptimizerConfigError(
                msg, field="weight_decay_filter", value=self.weight_decay_filter
            )


def _check(
    name: str,
    value: object,
    *,
    minimum: float,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
    why: str = "",
) -> None:
    """Refuse a field that is not a finite number within the bounds, naming it (and ``why``)."""
    if isinstance(value, (np.generic, np.ndarray, jax.Array)):
        msg = f"{name}={value!r} is a {type(value).__name__}; pass a Python number: float({name})"
        raise TypeError(msg)
    try:
        check_float(
            name,
            value,
            minimum=minimum,
            maximum=maximum,
            exclusive_minimum=exclusive_minimum,
            exclusive_maximum=exclusive_maximum,
        )
    except ValueError as error:
        raise OptimizerConfigError(f"{error}{why}", field=name, value=value) from None


# The steps a schedule is checked at: the first two, then one per decade up to a million.
_CHECKED_STEPS: tuple[int, ...] = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)


def _check_learning_rate(learning_rate: object) -> None:
    """Refuse a learning rate that is neither a positive finite number nor a working schedule.

    A schedule is called as optax calls it, on an int32 array (traced under ``jit``): it must
    trace, and return one finite number ``>= 0`` at each of :data:`_CHECKED_STEPS`.
    """
    if not callable(learning_rate) or isinstance(learning_rate, jax.Array):
        try:
            _check("learning_rate", learning_rate, minimum=0, exclusive_minimum=True)
        except TypeError as error:
            raise TypeError(
                f"{error}; or pass an optax schedule (a callable of the step)"
            ) from None
        return
    for step in _CHECKED_STEPS:
        try:
            rate = learning_rate(jnp.asarray(step, jnp.int32))
        except Exception as error:
            msg = (
                f"learning_rate {learning_rate!r} is not a schedule: calling it on step {step} "
                f"raised {type(error).__name__}: {error}; pass a callable of one argument, the "
                "step count (an optax.Schedule such as optax.cosine_decay_schedule(...))"
            )
            raise OptimizerConfigError(msg, field="learning_rate", value=learning_rate) from error
        try:
            value = np.asarray(rate, dtype=np.float64)
        except (TypeError, ValueError):
            value = None
        if value is None or value.shape != () or not np.isfinite(value) or value < 0:
            msg = (
                f"learning_rate schedule {learning_rate!r} returned {rate!r} for step {step}; a "
                "schedule must return one finite number >= 0 for each step"
            )
            raise OptimizerConfigError(msg, field="learning_rate", value=learning_rate)
        if step == 0:
            _check_traceable(learning_rate)


def _check_traceable(learning_rate: Callable[[jax.Array], object]) -> None:
    """Refuse a schedule that cannot run on a traced step, as it does inside a jitted update."""
    try:
        jax.eval_shape(learning_rate, jax.ShapeDtypeStruct((), jnp.int32))
    except Exception as error:
        msg = (
            f"learning_rate schedule {learning_rate!r} fails on a traced step, as in a jitted "
            f"update: {type(error).__name__}: {str(error).splitlines()[0]}; branch with "
            "jnp.where (not Python's if) or build it from optax schedules "
            "(optax.piecewise_constant_schedule, optax.join_schedules, ...)"
        )
        raise OptimizerConfigError(msg, field="learning_rate", value=learning_rate) from error
