"""BestMetricTracker and EarlyStopping, the plain improvement rules; checks of saved states."""

from __future__ import annotations

import contextlib
import math
import operator
import sys
from collections.abc import Mapping
from typing import Any, cast

from substrax.support import Mode, check_float, check_int, check_mode

from ._errors import MonitorMismatchError


PlateauMode = Mode
"""The old name of :class:`substrax.support.Mode` (``PlateauMode.MIN is Mode.MIN``)."""
LARGEST = sys.float_info.max


def check_state(
    who: str,
    state: object,
    required: set[str],
    *optional: str,
    monitor: str | None = None,
    mode: Mode | None = None,
) -> Mapping[str, Any]:
    """``state`` with each ``required`` key, no unknown one, and the ``monitor`` and ``mode`` given.

    A state saved without ``monitor`` or ``mode`` (by an earlier version) matches any.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"{who} state must be a dict from get_state(), not {state!r:.80}")
    state = cast("Mapping[str, Any]", state)
    watched = {"monitor": monitor, "mode": None if mode is None else mode.value}
    optional = (*optional, *(key for key, value in watched.items() if value is not None))
    missing, unknown = required - set(state), set(state) - required - set(optional)
    if missing or unknown:
        also = f" (and optionally {sorted(optional)})" if optional else ""
        raise ValueError(
            f"{who} state needs exactly the keys {sorted(required)}{also}; "
            f"missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    configured = (monitor or "", watched["mode"] or "")
    saved = tuple(str(state.get(key, value or "")) for key, value in watched.items())
    if saved != configured:
        raise MonitorMismatchError((saved[0], saved[1]), configured)
    return state


def state_number(
    who: str,
    state: Mapping[str, Any],
    key: str,
    wanted: str,
    *,
    integer: bool = False,
    low: float = -math.inf,
    high: float = math.inf,
    none: bool = False,
) -> Any:  # noqa: ANN401  (an int or a float, or None where ``none``)
    """``state[key]`` as a number in ``[low, high]`` (None where ``none``), else a ValueError naming it."""
    value = state.get(key)
    if value is None and none:
        return None
    number: float = math.nan
    if value is not None and not isinstance(value, (bool, str, bytes)):
        with contextlib.suppress(TypeError, ValueError):
            number = operator.index(value) if integer else float(value)  # numpy scalars too
    if not low <= number <= high:  # NaN too
        raise ValueError(
            f"{who} state holds {key}={value!r:.80}, which is not {wanted}; restore a state "
            "that get_state() returned"
        )
    return number


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
        """Record ``value``; return whether it improved on the best.

        Raises:
            TypeError: ``value`` is not one real number (a bool, a str, None, a vector).
        """
        value = self._number(value)
        if self.is_improvement(value):
            self._best = value
            self._num_bad_epochs = 0
            return True
        self._num_bad_epochs += 1
        return False

    def _number(self, value: object) -> float:
        """``value`` as a float: an int, a float or a 0-d numeric array (numpy, jax), not a bool."""
        kind = getattr(getattr(value, "dtype", None), "kind", "f")
        if not isinstance(value, (bool, str, bytes)) and kind not in "bcOSU":
            try:
                if getattr(value, "shape", ()) == ():
                    return float(value)  # pyright: ignore[reportArgumentType]
            except OverflowError:
                raise ValueError(
                    f"{type(self).__name__} got value={value!r:.80}, an int too large for a "
                    "float; track a metric a float can hold"
                ) from None
            except (TypeError, ValueError):
                pass
        raise TypeError(
            f"{type(self).__name__} got value={value!r:.80} ({type(value).__name__}); it "
            "wants one real number (an int, a float or a 0-d array) of the metric it tracks"
        )

    def get_state(self) -> dict[str, Any]:
        """The state, strict JSON: an infinite best (none yet) is the largest float of its sign."""
        best = math.copysign(LARGEST, self._best) if math.isinf(self._best) else self._best
        return {"best": best, "num_bad_epochs": self._num_bad_epochs, "mode": self._mode.value}

    def set_state(self, state: dict[str, Any], /) -> None:
        """Restore a state from :meth:`get_state`; a ``best`` of None means none yet.

        Raises:
            ValueError: a key is missing or unknown, or a value is malformed (the message names it).
            MonitorMismatchError: the state was saved in another mode (``mode`` may be absent).
        """
        who = type(self).__name__
        checked = check_state(who, state, {"best", "num_bad_epochs"}, mode=self._mode)
        best = state_number(who, checked, "best", "a number, or None for no best yet", none=True)
        bad = state_number(who, checked, "num_bad_epochs", "an integer >= 0", integer=True, low=0)
        if best is None:
            best = math.inf if self._mode is Mode.MIN else -math.inf
        self._best = math.copysign(math.inf, best) if abs(best) >= LARGEST else best
        self._num_bad_epochs = bad

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
        self._patience = check_int("patience", patience, minimum=1)
        super().__init__(mode=mode, min_delta=min_delta)

    @property
    def patience(self) -> int:
        """How many non-improving updates in a row stop training."""
        return self._patience

    def update(self, value: float) -> bool:
        """Record ``value``; return whether it improved on the best (TypeError: not a number)."""
        return self.register(value)

    @property
    def should_stop(self) -> bool:
        """Whether ``patience`` updates in a row have not improved."""
        return self.num_bad_epochs >= self._patience
