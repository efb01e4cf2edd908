"""BestMetricTracker and EarlyStopping: the plain, framework-free improvement rules."""

from __future__ import annotations

import enum
import math
from typing import Any


__all__ = ["BestMetricTracker", "EarlyStopping", "PlateauMode", "check_patience"]


def check_patience(patience: object) -> None:
    """Refuse a patience that is not an integer >= 1 (a bool is not an integer here)."""
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"patience={patience!r} must be an integer >= 1")


class PlateauMode(enum.StrEnum):
    """Whether a smaller (``MIN``) or a larger (``MAX``) metric is better.

    Example:
        >>> PlateauMode("max") is PlateauMode.MAX
        True
    """

    MIN = "min"
    MAX = "max"


def _mode(mode: PlateauMode | str) -> PlateauMode:
    try:
        return PlateauMode(mode)
    except ValueError:
        raise ValueError(f"mode={mode!r} is not one of 'min' or 'max'") from None


class BestMetricTracker:
    """Remember the best value of a metric and how many updates in a row did not improve it.

    A value improves when it is below ``best - min_delta`` (``MIN``) or above
    ``best + min_delta`` (``MAX``).

    Args:
        mode: ``"min"`` or ``"max"``.
        min_delta: how much better a value must be to count; must be >= 0.

    Example:
        >>> tracker = BestMetricTracker(mode="min", min_delta=0.1)
        >>> [tracker.register(v) for v in (1.0, 0.95, 0.5)]
        [True, False, True]
        >>> tracker.best, tracker.num_bad_epochs
        (0.5, 0)
    """

    __slots__ = ("_best", "_min_delta", "_mode", "_num_bad_epochs")

    def __init__(
        self, *, mode: PlateauMode | str = PlateauMode.MIN, min_delta: float = 0.0
    ) -> None:
        if not min_delta >= 0.0:
            raise ValueError(
                f"min_delta={min_delta!r} must be >= 0; it is a margin, not a direction"
            )
        self._mode = _mode(mode)
        self._min_delta = float(min_delta)
        self._best = math.inf if self._mode is PlateauMode.MIN else -math.inf
        self._num_bad_epochs = 0

    @property
    def mode(self) -> PlateauMode:
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
        if self._mode is PlateauMode.MIN:
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
        expected = {"best", "num_bad_epochs"}
        if set(state) != expected:
            missing = sorted(expected - set(state))
            unknown = sorted(set(state) - expected)
            raise ValueError(
                f"{type(self).__name__} state needs exactly the keys {sorted(expected)}; "
                f"missing {missing}, unknown {unknown}"
            )
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
        >>> stopper = EarlyStopping(patience=2, min_delta=0.01, mode="min")
        >>> [stopper.update(v) for v in (1.0, 0.5, 0.49, 0.495)]
        [True, True, False, False]
        >>> stopper.should_stop
        True
    """

    __slots__ = ("_patience",)

    def __init__(
        self, *, patience: int, min_delta: float = 0.0, mode: PlateauMode | str = PlateauMode.MIN
    ) -> None:
        check_patience(patience)
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
