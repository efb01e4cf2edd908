"""Compare a leaf's sampled elements one by one, and find the worst.

``check_grads`` checks one random direction of a leaf's sampled elements: its sum can hide a small
element that is wrong, and its failure says neither which element is wrong nor by how much. This
compares each sampled element's derivative (jax's, in the mode checked) with its own central
difference of the float64 reference, at its own step (``step * max(1, |x|)``): in reverse mode always (jax's
gradient is at hand), in forward mode (one ``jax.jvp`` per element) after a failure. It can find no
element out of tolerance (``failing`` 0) where only the direction was, by cancellation; the leaf
has still failed. After a failure, :func:`unlike_reference` says whether the float64 reference
itself is to blame. Importing this module imports no jax.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from substrax.typing import PyTree

from ._gradient_records import GRADIENT_TOLERANCES, LeafGradientCheck


if TYPE_CHECKING:
    import jax
    import numpy as np

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
        of ``atol + rtol * |numeric|``.
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
    steps = np.asarray(eps, dtype=np.float64) * units
    numeric = np.array(
        [float(reference(start + step)) - float(reference(start - step)) for step in steps]
    ) / (2 * np.asarray(eps, dtype=np.float64))
    error = np.abs(analytic - numeric)
    relative = error / np.maximum(np.abs(numeric), np.finfo(np.float64).tiny)
    allowed = tolerance.atol + tolerance.rtol * np.abs(numeric)
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


def unlike_reference(
    loss: Callable[[PyTree, PyTree], PyTree], point: tuple[PyTree, PyTree], value: "jax.Array"
) -> str | None:
    """Why the float64 reference is not the loss checked, where that shows; None if it does not.

    Asked after a failure: ``loss`` is called at ``point``, the float64 copy (under x64), and
    ``value`` is jax's loss as checked. The reference is not float64 where the model computes
    in a dtype of its own, and not the loss where random draws differ under x64.
    """
    import jax.numpy as jnp  # noqa: PLC0415

    reference = jnp.asarray(loss(*point))
    if (computed := reference.dtype) != jnp.float64:
        return (
            f"but its reference is not float64: the loss is {computed} under it (a layer's "
            f"explicit dtype=, or a cast, such as the loss's); set the layer's dtype to None to "
            f"compute in its parameters' dtype and leave the loss uncast, or check with a "
            f"tolerance= (a step and rtol) for {computed}"
        )
    tolerance = GRADIENT_TOLERANCES.get(value.dtype.name)
    there, here = float(reference), float(value)
    if tolerance is None or abs(there - here) <= tolerance.atol + tolerance.rtol * abs(here):
        return None
    return (
        f"but the loss is {there:.6g} under its float64 reference and {here:.6g} as checked: "
        "not the same function (random draws, like a Dropout that is not deterministic, differ "
        "under x64); make the model deterministic for the check"
    )
