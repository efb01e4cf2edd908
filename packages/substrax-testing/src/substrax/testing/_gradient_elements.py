"""Compare a leaf's sampled elements one by one, and find the worst.

``check_grads`` checks one random direction of a leaf's sampled elements: its sum can hide a small
element that is wrong, and its failure says neither which element is wrong nor by how much. This
compares each sampled element's derivative (jax's, in the mode checked) with its own central
difference of the float64 reference, at its own step (``step * max(1, |x|)``): in reverse mode always (jax's
gradient is at hand), in forward mode (one ``jax.jvp`` per element) after a failure. It can find no
element out of tolerance (``failing`` 0) where only the direction was, by cancellation; the leaf
has still failed. A leaf that failed at its default step is checked again at a finer one
(:func:`retried`). After a failure, :func:`reference_failure` says whether the float64 reference
itself is to blame. Importing this module imports no jax.
"""

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn

from substrax.typing import PyTree

from ._gradient_records import (
    GRADIENT_TOLERANCES,
    ROUNDING_FACTOR,
    GradientTolerance,
    LeafGradientCheck,
    rounding_allowance,
)
from ._gradient_refusals import BLIND_ROUNDING


if TYPE_CHECKING:
    import jax
    import numpy as np

    from ._errors import GradientMismatchError

Result = tuple[float, LeafGradientCheck, bool, Any]
"""A leaf's check: its score, summary, whether it failed and ``check_grads``' error."""
_TINY: Final = 1e-300  # an allowance of 0 (rtol = atol = 0) makes any error infinitely bad


def localize(
    summary: LeafGradientCheck,
    reference: Callable[["np.ndarray"], Any],
    derivatives: tuple["np.ndarray", Callable[[Any], Any]],
    start: "np.ndarray",
    *,
    eps: "np.ndarray",
    where: tuple["np.ndarray", tuple[int, ...]],
) -> tuple[float, LeafGradientCheck]:
    """Compare jax's derivative of each sampled element with its own central difference.

    Args:
        summary: The leaf's check (its path, mode, dtype, count and tolerance).
        reference: The float64 loss as a function of the sampled elements' values.
        derivatives: jax's gradient at them (used in ``"rev"``), and its derivative along a
            direction of them (used in ``"fwd"``: one ``jax.jvp`` per element's unit vector).
        start: The sampled elements' values (float64).
        eps: Each sampled element's central-difference step.
        where: The sampled elements' flat indices in the leaf, and the leaf's shape.

    Returns:
        The worst element's error over its allowance (NaN worst), and the summary with that
        element, both its values and its step, the largest errors and how many elements are out
        of ``atol + rtol * |numeric|`` plus the difference's rounding (``rounding_allowance``
        of the larger ``|loss|`` of the two ends and the element's step).
    """
    import numpy as np  # noqa: PLC0415

    (gradient, along), (indices, shape) = derivatives, where
    tolerance = summary.tolerance
    assert tolerance is not None  # noqa: S101 - every check has one
    units = np.eye(start.size)
    if summary.mode == "rev":
        analytic = np.asarray(gradient, dtype=np.float64).reshape(start.size)
    else:
        analytic = np.array([float(along(unit)) for unit in units])
    h = np.asarray(eps, dtype=np.float64)
    values = [
        (np.asarray(reference(start + s)), np.asarray(reference(start - s))) for s in h * units
    ]
    plus, minus = (np.array([float(pair[side]) for pair in values]) for side in (0, 1))
    numeric = (plus - minus) / (2 * h)
    error = np.abs(analytic - numeric)
    relative = error / np.maximum(np.abs(numeric), np.finfo(np.float64).tiny)
    # the difference's own rounding: eps of the reference's dtype (float64) times |loss| / step
    machine = float(np.finfo(values[0][0].dtype).eps)
    rounding = rounding_allowance(machine, np.maximum(np.abs(plus), np.abs(minus)), h)
    allowed = tolerance.atol + tolerance.rtol * np.abs(numeric) + rounding
    score = np.where(np.isfinite(error), error / np.maximum(allowed, _TINY), np.inf)
    worst = int(np.argmax(score))
    index = np.unravel_index(int(indices[worst]), shape)
    return float(score[worst]), dataclasses.replace(
        summary,
        index=tuple(int(i) for i in index),
        analytic=float(analytic[worst]),
        numeric=float(numeric[worst]),
        step=float(np.asarray(eps)[worst]),
        max_abs_error=_largest(error),
        max_rel_error=_largest(relative),
        failing=int(np.count_nonzero(~(error <= allowed))),  # NaN is out of tolerance
    )


def _largest(values: "np.ndarray") -> float:
    import numpy as np  # noqa: PLC0415

    return float(np.nanmax(values)) if np.isfinite(values).any() else math.inf


def finer_step(tolerance: GradientTolerance, loss: float) -> GradientTolerance | None:
    """``tolerance`` at the step a failed leaf is checked again at, on a float64 reference.

    A step made for the leaf's dtype (float32's ``1e-3``) is larger than a float64 reference
    needs, and a central difference that wide can cross a kink near an element (a ReLU's at 0
    in a layer it feeds) where jax's derivative, a one-sided one, is right. The retry's step
    is the smallest, down to float64's (``1e-6``), whose rounding allowance at ``loss``
    (:func:`rounding_allowance`) stays within a tenth of ``atol``, so that a wrong gradient
    passes it no more easily; None where that step is not smaller than the tolerance's.

    Example:
        >>> from substrax.testing import GRADIENT_TOLERANCES
        >>> from substrax.testing._gradient_elements import finer_step
        >>> finer_step(GRADIENT_TOLERANCES["float32"], 2.3).step
        1e-06
        >>> finer_step(GRADIENT_TOLERANCES["float32"], 1e8) is None  # it would need 0.22
        True
    """
    import numpy as np  # noqa: PLC0415

    allowed = BLIND_ROUNDING * tolerance.atol  # the rounding the retry may add, at most
    needed = ROUNDING_FACTOR * float(np.finfo(np.float64).eps) * abs(loss)
    step = max(GRADIENT_TOLERANCES["float64"].step, needed / allowed if allowed else math.inf)
    return dataclasses.replace(tolerance, step=step) if step < tolerance.step else None


def finer_steps(
    tolerances: Sequence[GradientTolerance] | None, loss: float, dtype: Callable[[], Any]
) -> Callable[[int], GradientTolerance | None]:
    """Each leaf's :func:`finer_step`, by position, where the reference really is float64.

    ``tolerances``: the leaves' defaults (None for a ``tolerance=``, used as given: no retry);
    ``dtype()``: the dtype of the reference's loss, uncast (asked once, at the first retry).
    """
    import numpy as np  # noqa: PLC0415

    precise = functools.cache(lambda: np.dtype(dtype()) == np.float64)

    def finer(position: int) -> GradientTolerance | None:
        if tolerances is None or not precise():
            return None
        return finer_step(tolerances[position], loss)

    return finer


def retried(
    check: Callable[[int, str, GradientTolerance | None], Result],
    finer: Callable[[int], GradientTolerance | None],
) -> Callable[[int, str], Result]:
    """``check(position, mode, None)``, a failed leaf checked again at ``finer(position)``.

    The leaf passes where it passes at the finer step (its summary names that step); where it
    fails again, or ``finer`` gives None, the first failure is the leaf's result.
    """

    def checked(position: int, mode: str) -> Result:
        first = check(position, mode, None)
        if not first[2] or (tolerance := finer(position)) is None:
            return first
        again = check(position, mode, tolerance)
        return first if again[2] else again

    return checked


def check_modes(
    check: Callable[[int, str], Result], modes: Sequence[str], positions: list[int], who: str
) -> tuple[list[Result], str | None]:
    """``check(position, mode)`` of each leaf in each mode, ``"rev"`` first; and a note.

    Forward mode refuses a ``custom_vjp`` (a ``TypeError``): where reverse mode found a
    mismatch, that is reported, the refusal noted, instead of the refusal alone.
    """
    results: list[Result] = []
    try:
        for mode in sorted(modes, key=("rev", "fwd").index):
            results.extend(check(position, mode) for position in positions)
    except TypeError as refused:
        if not any(result[2] for result in results):
            raise
        return results, f"{who}: not checked in fwd mode: {refused}"
    return results, None


def raise_worst(
    who: str, results: list[Result], loss: tuple[Any, Any, Any], note: str | None
) -> NoReturn:
    """Raise the leaf most out of its allowance; a ValueError where the reference may explain it.

    ``loss``: the loss, the float64 point and jax's loss value (``reference_failure``'s);
    ``note``: added to the error (a mode not checked).
    """
    from ._errors import GradientMismatchError  # noqa: PLC0415 - a cycle

    _, worst, _, cause = max((r for r in results if r[2]), key=lambda result: result[0])
    error = GradientMismatchError(worst, tuple(summary for _, summary, _, _ in results))
    error.__cause__ = cause
    if note is not None:
        error.add_note(note)
    raise reference_failure(who, loss, error)


def reference_failure(
    who: str,
    checked: tuple[Callable[[PyTree, PyTree], PyTree], tuple[PyTree, PyTree], "jax.Array"],
    error: "GradientMismatchError",
) -> Exception:
    """What to raise for ``error``, a failed check: ``error``, or why its reference is to blame.

    ``checked``: the loss, the float64 point (the leaves and the rest) and jax's loss as
    checked. The loss is evaluated at the point as the check evaluates it (jitted, under x64)
    and compared with jax's. The reference is not
    float64 where the model computes in a dtype of its own or casts the loss, and not the loss
    where random draws differ under x64. Where that alone may explain the failure, a
    ValueError says so (caused by ``error``); a not-float64 reference whose rounding cannot
    explain the error is noted on ``error``, which is raised all the same.
    """
    try:
        reason = _unlike_reference(*checked, error.worst)
    except Exception:  # a diagnostic never replaces the failure it explains
        return error
    if reason is None:
        return error
    blamed, why = reason
    if not blamed:
        error.add_note(f"{who}: {why}")
        return error
    failure = ValueError(f"{who}: the gradient check failed, {why}; {error.worst.describe()}")
    failure.__cause__ = error
    return failure


def _unlike_reference(
    loss: Callable[[PyTree, PyTree], PyTree],
    point: tuple[PyTree, PyTree],
    value: "jax.Array",
    worst: LeafGradientCheck,
) -> tuple[bool, str] | None:
    """Why the reference is not the loss checked, and whether that alone may explain ``worst``.

    None where the reference is the float64 loss.
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    reference = jax.jit(loss)(*point)
    if (computed := reference.dtype) != jnp.float64:
        # a central difference of a loss rounded to ``computed``: its error is about
        # eps * |loss| / step; ten times that may be rounding, more is the gradient's own
        # (the smallest step, the tolerance's, allows the most)
        step = worst.tolerance.step if worst.tolerance else (worst.step or math.nan)
        rounding = 10 * float(jnp.finfo(computed).eps) * max(1.0, abs(float(reference))) / step
        error = worst.max_abs_error
        blamed = math.isfinite(error) and error <= rounding
        cast = (
            f"its reference is not float64: the loss is {computed} under it, so something in "
            "it computes in a dtype of its own, not its parameters' (float64 there): a layer's "
            "dtype (an explicit dtype=; nnx.SimpleCell's, nnx.LSTMCell's and the other RNN "
            "cells' default float32; nnx.Embed's, its embedding's dtype when built, even with "
            "dtype=None), or a cast, such as the loss's. Pass dtype=None to a layer that keeps "
            "it (set model.embed.dtype = None on an nnx.Embed) and leave the loss uncast"
        )
        if blamed:
            return True, f"but {cast}, or check with a tolerance= (a step and rtol) for {computed}"
        return False, (
            f"the error, up to {error:.3g}, is more than the {computed} rounding "
            f"of the reference explains (about {rounding:.3g}), but {cast} for a "
            "precise check"
        )
    tolerance = GRADIENT_TOLERANCES.get(value.dtype.name)
    there, here = float(reference), float(value)
    if tolerance is None or abs(there - here) <= tolerance.atol + tolerance.rtol * abs(here):
        return None
    return True, (
        f"but the loss is {there:.6g} under its float64 reference and {here:.6g} as checked: "
        "not the same function (random draws, like a Dropout that is not deterministic, differ "
        "under x64); make the model deterministic for the check"
    )
