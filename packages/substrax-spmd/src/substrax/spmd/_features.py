"""The loop features of a train step, chosen once: accumulation, precision, steps per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flax import nnx

from substrax.support import check_int
from substrax.typing import PyTree

from ._multi_step import repeat_steps
from ._precision import PrecisionPolicy
from ._row_weights import check_mask_key
from ._update import PureStep, build_update


def with_loop_features(
    plain: PureStep,
    *,
    graphdef: nnx.GraphDef[Any],
    treedef: PyTree,
    loss_fn: Callable[[Any, Any], Any],
    has_aux: bool,
    optimizer: nnx.Optimizer[Any],
    model: nnx.Module,
    accumulate_steps: int,
    steps_per_call: int,
    precision: PrecisionPolicy | None,
    mask: str | None = None,
) -> PureStep:
    """``plain`` itself when no feature is asked for, else the step that runs them.

    Raises:
        TypeError: A count that is not an int, ``precision`` that is not a policy, or a
            ``mask`` that is not a key.
        ValueError: A count below 1, or parameters not in the policy's ``param_dtype``.
    """
    check_int("accumulate_steps", accumulate_steps, minimum=1)
    check_int("steps_per_call", steps_per_call, minimum=1)
    check_mask_key("TrainStep", mask)
    step = plain
    if precision is not None:
        if not isinstance(precision, PrecisionPolicy):  # pyright: ignore[reportUnnecessaryIsInstance]
            msg = f"precision must be a PrecisionPolicy, got {type(precision).__name__}"
            raise TypeError(msg)
        precision.check_params(nnx.state(model, optimizer.wrt))
    if accumulate_steps > 1 or precision is not None:
        step = build_update(
            graphdef,
            treedef,
            loss_fn,
            has_aux=has_aux,
            accumulate_steps=accumulate_steps,
            precision=precision,
            wrt=optimizer.wrt,
            mask=mask,
        )
    if steps_per_call > 1:
        step = repeat_steps(step, steps_per_call)
    return step
