"""Which TrainStep last ran on a model: nothing else reads the objects it left stale."""

from __future__ import annotations

import weakref

from ._errors import StateChangedError


__all__ = ["check_current", "ran_on"]

# id(model) -> (the TrainStep that last ran on it, whether the model's objects hold its state)
_LAST: dict[int, tuple[weakref.ref[object], bool]] = {}


def ran_on(model: object, step: object, *, current: bool) -> None:
    """Note that ``step`` ran on ``model``; ``current``: it wrote its state back into the objects."""
    _LAST[id(model)] = (weakref.ref(step), current)


def check_current(model: object, reader: object, who: str) -> None:
    """Refuse ``reader`` (a step, or None) reading ``model`` left stale by another TrainStep.

    A TrainStep keeps its state apart from the objects until :meth:`~TrainStep.sync`: another
    step over them would read arrays that step donated (jax's "Array has been deleted"), or,
    without donation, the parameters before training, silently.

    Example:
        >>> from substrax.spmd._trained_by import check_current, ran_on
        >>> model, step = object(), type("Step", (), {})()
        >>> ran_on(model, step, current=False)
        >>> check_current(model, None, "EvalStep")
        Traceback (most recent call last):
        ...
        substrax.spmd.StateChangedError: EvalStep reads a model that a TrainStep has trained ...
    """
    step, current = _LAST.get(id(model), (lambda: None, True))
    if current or step() in (None, reader):
        return
    raise StateChangedError(
        f"{who} reads a model that a TrainStep has trained without writing its state back into "
        "it, so the model's objects still hold the state before that step (or arrays it "
        "donated); build it from the TrainStep (EvalStep(step, ...), or a TrainStep from "
        "step.model and step.optimizer), or call that step's sync() once: it then writes every "
        "step's state back",
        path="model",
    )
