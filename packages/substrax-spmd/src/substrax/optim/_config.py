"""The optimizer configuration, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import optax
from flax import nnx

from substrax.support import check_float

from ._errors import OptimizerConfigError


type OptimizerType = Literal["adam", "adamw", "sgd", "rmsprop", "adagrad", "lamb", "radam", "nadam"]
OPTIMIZER_TYPES: tuple[str, ...] = get_args(OptimizerType.__value__)
DECOUPLED_DECAY_TYPES: frozenset[str] = frozenset({"adamw", "lamb"})
MOMENTUM_TYPES: frozenset[str] = frozenset({"sgd", "rmsprop"})


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerConfig:
    """What optimizer to build, validated on construction.

    Attributes:
        optimizer_type: One of :data:`OPTIMIZER_TYPES`.
        learning_rate: A positive constant or an ``optax`` schedule.
        b1: First-moment decay (adam family, lamb).
        b2: Second-moment decay.
        eps: Numerical epsilon.
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
        if not callable(self.learning_rate):
            try:
                check_float("learning_rate", self.learning_rate, minimum=0, exclusive_minimum=True)
            except TypeError as error:
                raise TypeError(f"{error}; or pass an optax schedule") from None
            except ValueError as error:
                msg = str(error)
                raise OptimizerConfigError(
                    msg, field="learning_rate", value=self.learning_rate
                ) from None
        if self.gradient_clip_norm is not None and self.gradient_clip_value is not None:
            msg = (
                f"set gradient_clip_norm ({self.gradient_clip_norm}) or gradient_clip_value "
                f"({self.gradient_clip_value}), not both"
            )
            raise OptimizerConfigError(
                msg, field="gradient_clip_norm", value=self.gradient_clip_norm
            )
        for name in ("gradient_clip_norm", "gradient_clip_value"):
            clip = getattr(self, name)
            if clip is not None and clip <= 0:
                msg = f"{name} must be > 0; got {clip}"
                raise OptimizerConfigError(msg, field=name, value=clip)
        if self.weight_decay < 0:
            msg = f"weight_decay must be >= 0; got {self.weight_decay}"
            raise OptimizerConfigError(msg, field="weight_decay", value=self.weight_decay)
        if self.weight_decay > 0 and self.optimizer_type not in DECOUPLED_DECAY_TYPES:
            msg = (
                f"weight_decay={self.weight_decay} needs decoupled decay; {self.optimizer_type!r} has "
                f"none, use one of {sorted(DECOUPLED_DECAY_TYPES)}"
            )
            raise OptimizerConfigError(msg, field="weight_decay", value=self.weight_decay)
        if self.momentum is not None and self.optimizer_type not in MOMENTUM_TYPES:
            msg = f"momentum is for {sorted(MOMENTUM_TYPES)}; {self.optimizer_type!r} does not take it"
            raise OptimizerConfigError(msg, field="momentum", value=self.momentum)
        if isinstance(self.weight_decay_filter, str):
            msg = (
                f"weight_decay_filter {self.weight_decay_filter!r} is a string, which nnx reads as a "
                "tag; use nnx.PathContains(...) or a callable (path, value) -> bool"
            )
            raise TypeError(msg)
