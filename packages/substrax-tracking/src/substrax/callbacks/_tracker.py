"""BestMetricTracker and EarlyStopping: the plain, framework-free improvement rules."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from substrax.support import Mode, check_float, check_int, check_mode


PlateauMode = Mode
"""The old name of :class:`substrax.support.Mode` (``PlateauMode.MIN is Mode.MIN``)."""


def check_state_keys(
    who: str, state: Mapping[str, object], required: set[str], optional: Collection[str] = ()
) -> None:
    """Refuse a saved state that lacks a ``required`` key or holds one not known.

    Raises:
        ValueError: naming the missing and the unknown keys.
    """
    missing, unknown = required - set(state), set(state) - required - set(optional)
    if missing or unknown:
        also = f" (and optionally {sorted(optional)})" if optional else ""
        raise ValueError(
            f"{who} state needs exactly the keys {sorted(required)}{also}; "
            f"missing {sorted(missing)}, unknown {sorted(unknown)}"
        )


class BestMetricTracker:
    """Remember the best value of a metric and how many updates in a row did not improve it.

    A value improves when it is below ``best - min_delta`` (``MIN``) or above
    ``best + min_delta`` (``MAX``).

    Args:
        mode: ``"min"`` or ``"max"``.
        min_delta: how much better a value must be to count; must be >= 0.

    Example:
        >>> from substrax.callbacks import BestMetricTracker
        >>> tracker = BestMetricTracker(mode="min", min_delta=0.1)
        >>> [tracker.register(v) for v in (1.0, 0.95, 0.5)]
        [True, False, True]
        >>> tracker.best, tracker.num_bad_epochs
        (0.5, 0)
    """

    __slots__ = ("_best", "_min_delta", "_mode", "_num_bad_epochs")

    def __init__(self, *, mode: Mode | str = Mode.MIN, min_delta: float = 0.0) -> None:
        self._min_delta = check_float("min_delta", min_delta, minimum=0)
        self._mode = check_mode("mode", mode)
        self._best = math.inf if self._mode is Mode.MIN else -math.inf
        self._num_bad_epochs = 0

    @property
    def mode(self) -> Mode:
        """Whether smaller or larger is better."""
        return self._mode

    @property
    def min_delta(self) -> float:
        """The margin a value must beat the best by."""
        return self._min_delta

    @property
    def best(self) -> float:
        """The best value so far (``inf`` for MIN, ``-inf`` for MAX before the first)."""
        return self._best

    @property
    def num_bad_epochs(self) -> int:
        """How many registered values in a row did not improve on the best."""
        return self._num_bad_epochs

    def is_improvement(self, value: float) -> bool:
        """Whether ``value`` would improve on the best, without recording it."""
        if self._mode is Mode.MIN:
            return value < self._best - self._min_delta
        return value > self._best + self._min_delta

    def register(self, value: float) -> bool:
        """Record ``value``; return whether it improved on the best."""
        value = float(value)
        if self.is_improvement(value):
            self._best = value
            self._num_bad_epochs = 0
            return True
        self._num_bad_epochs += 1
        return False

    def get_state(self) -> dict[str, Any]:
        """The state to checkpoint: ``{"best", "num_bad_epochs"}``."""
        return {"best": self._best, "num_bad_epochs": self._num_bad_epochs}

    def set_state(self, state: dict[str, Any], /) -> None:
        """Restore a state from :meth:`get_state`.

        Raises:
            ValueError: keys are missing or unknown.
        """
        check_state_keys(type(self).__name__, state, {"best", "num_bad_epochs"})
        self._best = float(state["best"])
        self._num_bad_epochs = int(state["num_bad_epochs"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(mode={self._mode.value!r}, min_delta={self._min_delta}, "
            f"best={self._best}, num_bad_epochs={self._num_bad_epochs})"
        )


class EarlyStopping(BestMetricTracker):
    """Stop once ``patience`` updates in a row have not improved the metric by ``min_delta``.

    Args:
        patience: how many non-improving updates in a row to tolerate; must be >= 1.
        min_delta: how much better a value must be to count as an improvement.
        mode: ``"min"`` or ``"max"``.

    Example:
        >>> from substrax.callbacks import EarlyStopping
        >>> stopper = EarlyStopping(patience=2, min_delta=0.01, mode="min")
        >>> improved = []
        >>> for step, loss in enumerate([1.0, 0.5, 0.49, 0.495, 0.5]):
        ...     improved.append(stopper.update(loss))
        ...     if stopper.should_stop:
        ...         break
        >>> improved, step
        ([True, True, False, False], 3)
    """

    __slots__ = ("_patience",)

    def __init__(
        self, *, patience: int, min_delta: float = 0.0, mode: Mode | str = Mode.MIN
    ) -> None:
        check_int("patience", patience, minimum=1)
        super().__init__(mode=mode, min_delta=min_delta)
        self._patience = patience

    @property
    def patience(self) -> int:
        """How many non-improving updates in a row stop training."""
        return self._patience

    def update(self, value: float) -> bool:
        """Record ``value``; return whether it improved on the best."""
        return self.register(value)

    @property
    def should_stop(self) -> bool:
        """Whether ``patience`` updates in a row have not improved."""
        return self.num_bad_epochs >= self._patience
