"""Compare a leaf's sampled elements one by one, and find the worst.

``check_grads`` checks one random direction of a leaf's sampled elements: its sum can hide a small
element that is wrong, and its failure says neither which element is wrong nor by how much. This
compares each sampled element's derivative (jax's, in the mode checked) with its own central
difference of the float64 reference, at ``check_grads``' step: in reverse mode always (jax's
gradient is at hand), in forward mode (one ``jax.jvp`` per element) after a failure. It can find no
element out of tolerance (``failing`` 0) where only the direction was, by cancellation; the leaf
has still failed. Importing this module imports no jax.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ._gradient_records import LeafGradientCheck


if TYPE_CHECKING:
    import numpy as np

_TINY: Final = 1e-300  # an allowance of 0 (rtol = atol = 0) makes any error infinitely bad


def localize(
    summary: LeafGradientCheck,
    reference: Callable[["np.ndarray"], Any],
    derivatives: tuple["np.ndarray", Callable[[Any], Any]],
    start: "np.ndarray",
    *,
    eps: float,
    where: tuple["np.ndarray", tuple[int, ...]],
) -> tuple[float, LeafGradientCheck]:
    """Compare jax's derivative of each sampled element with its own central difference.

    Args:
        summary: The leaf's check (its path, mode, dtype, count and tolerance).
        reference: The float64 loss as a function of the sampled elements' values.
        derivatives: jax's gradient at them (used in ``"rev"``), and its derivative along a
            direction of them (used in ``"fwd"``: one ``jax.jvp`` per element's unit vector).
        start: The sampled elements' values (float64).
        eps: The central-difference step (``check_grads``').
        where: The sampled elements' flat indices in the leaf, and the leaf's shape.

    Returns:
        The worst element's error over its allowance (NaN worst), and the summary with that
        element, both its values, the largest errors and how many elements are out of
        ``atol + rtol * |numeric|``.
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
    numeric = np.array(
        [
            float(reference(start + eps * unit)) - float(reference(start - eps * unit))
            for unit in units
        ]
    ) / (2 * eps)
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
        max_abs_error=_largest(error),
        max_rel_error=_largest(relative),
        failing=int(np.count_nonzero(~(error <= allowed))),  # NaN is out of tolerance
    )


def _largest(values: "np.ndarray") -> float:
    import numpy as np  # noqa: PLC0415

    return float(np.nanmax(values)) if np.isfinite(values).any() else math.inf
