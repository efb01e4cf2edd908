"""What a gradient check is judged by and reports: tolerances by dtype, and each leaf's result.

Importing this module imports no jax.
"""

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from substrax.support import check_float


if TYPE_CHECKING:
    import numpy as np


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GradientTolerance:
    """How a leaf of one dtype is checked.

    A check passes when ``|analytic - numeric| <= atol + rtol * |numeric| + rounding``, where
    ``rounding`` is the central difference's own rounding error, :func:`rounding_allowance`
    (``10 * eps * |loss| / step``, ``eps`` the float64 reference's): a loss much larger than
    its gradient (``1e6 + w * b``) leaves a difference of two nearly equal values.

    Attributes:
        step: The central-difference step, relative to ``max(1, |x|)`` of each checked element
            (a default's failed leaf is checked again at float64's, on a float64 reference).
        rtol: The relative tolerance.
        atol: The absolute tolerance.

    Example:
        >>> from substrax.testing import GRADIENT_TOLERANCES, GradientTolerance
        >>> GRADIENT_TOLERANCES["float32"].rtol
        0.002
        >>> GradientTolerance(step=1e-3, rtol=1e-2, atol=1e-4).atol
        0.0001
    """

    step: float
    rtol: float
    atol: float

    def __post_init__(self) -> None:
        check_float("step", self.step, minimum=0.0, exclusive_minimum=True)
        check_float("rtol", self.rtol, minimum=0.0)
        check_float("atol", self.atol, minimum=0.0)


ROUNDING_FACTOR: Final = 10.0
"""The safety factor on a central difference's rounding error, ``eps * |loss| / step``."""


def rounding_allowance(eps: float, loss: object, step: object) -> "np.ndarray":
    """The rounding error allowed a central difference of a loss of size ``loss`` at ``step``.

    Each loss value is rounded by about ``eps * |loss|``, so their difference over the step
    ``2 * step`` is off by about ``eps * |loss| / step``; :data:`ROUNDING_FACTOR` times that is
    allowed. ``loss`` and ``step`` may be arrays (one per element).

    Example:
        >>> from substrax.testing._gradient_records import rounding_allowance
        >>> float(rounding_allowance(2.0**-52, 1e6, 1e-6)) < 3e-3
        True
    """
    import numpy as np  # noqa: PLC0415 - importing this module imports no numpy either

    return ROUNDING_FACTOR * eps * np.abs(np.asarray(loss, dtype=np.float64)) / np.asarray(step)


GRADIENT_TOLERANCES: Final[Mapping[str, GradientTolerance]] = MappingProxyType(
    {
        "float64": GradientTolerance(step=1e-6, rtol=1e-6, atol=1e-9),
        "float32": GradientTolerance(step=1e-3, rtol=2e-3, atol=1e-5),
        "float16": GradientTolerance(step=1e-2, rtol=1e-2, atol=1e-3),
        "bfloat16": GradientTolerance(step=1e-2, rtol=5e-2, atol=1e-2),
    }
)
"""The default tolerance of each floating dtype, by name: the analytic gradient in that dtype
against a float64 reference. Pass ``tolerance=`` for another dtype or a looser check."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LeafGradientCheck:
    """One leaf's check in one mode, and its worst element where the check failed.

    In ``"rev"`` mode each sampled element is compared with its own central difference, and
    ``check_grads`` checks a random direction of them; in ``"fwd"`` mode only the direction is
    checked, and the elements are compared one by one only when it fails. A leaf that passed
    names no element or values (NaN); in rev it keeps its largest errors.

    Attributes:
        path: The leaf's path (``"layers/0/kernel"``; ``"input"`` for the input).
        mode: ``"rev"`` (``jax.grad``) or ``"fwd"`` (``jax.jvp``).
        dtype: The leaf's dtype name.
        index: The worst element's index in the leaf (``()`` when the check passed).
        analytic: jax's derivative there (NaN when the check passed).
        numeric: The float64 central difference there (NaN when the check passed).
        max_abs_error: The largest ``|analytic - numeric|`` over the checked elements (NaN
            when they were not compared one by one: a fwd check that passed).
        max_rel_error: The largest relative error over them (NaN likewise).
        checked: How many elements were checked (sampled).
        failing: How many were out of tolerance (0 when the check passed).
        tolerance: The tolerance the leaf was checked with.
        step: The central-difference step used at the worst element (``tolerance.step *
            max(1, |x|)``; None when no element is named). A failure reports it as the step.

    Example:
        >>> import dataclasses
        >>> import math
        >>> from substrax.testing import LeafGradientCheck
        >>> leaf = LeafGradientCheck(
        ...     path="kernel", mode="rev", dtype="float32", index=(0, 1), analytic=1.0,
        ...     numeric=1.5, max_abs_error=0.5, max_rel_error=1 / 3, checked=4, failing=1,
        ... )
        >>> leaf.describe()
        'kernel[0, 1] (rev, float32): analytic 1, numeric 1.5; max abs error 0.5, max rel error 0.333; 1 of 4 checked elements out of tolerance'
        >>> dataclasses.replace(leaf, index=(), analytic=math.nan, failing=0).describe()
        'kernel (rev, float32): 4 checked elements within tolerance, each and along a random direction'
        >>> dataclasses.replace(leaf, mode="fwd", index=(), analytic=math.nan, failing=0).describe()
        'kernel (fwd, float32): 4 checked elements within tolerance along a random direction'
    """

    path: str
    mode: str
    dtype: str
    index: tuple[int, ...]
    analytic: float
    numeric: float
    max_abs_error: float
    max_rel_error: float
    checked: int
    failing: int
    tolerance: GradientTolerance | None = None
    step: float | None = None

    def describe(self) -> str:
        """One line: where, both values and the errors, how many elements failed, the tolerance."""
        where = f"[{', '.join(map(str, self.index))}]" if self.index else ""
        line = f"{self.path}{where} ({self.mode}, {self.dtype}): "
        if self.failing or not math.isnan(self.analytic):
            line += (
                f"analytic {self.analytic:.6g}, numeric {self.numeric:.6g}; max abs error "
                f"{self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g}; "
                f"{self.failing} of {self.checked} checked elements out of tolerance"
            )
        else:
            each = ", each and" if self.mode == "rev" else ""
            line += (
                f"{self.checked} checked elements within tolerance{each} along a random direction"
            )
        if (chosen := self.tolerance) is not None:
            step = chosen.step if self.step is None else self.step  # the one used, if known
            line += f" (rtol {chosen.rtol:g}, atol {chosen.atol:g}, step {step:g})"
        return line


def tolerance_for(dtype: str, chosen: object) -> GradientTolerance:
    """``chosen`` (a ``tolerance=``), or the default tolerance of a leaf of ``dtype``."""
    if chosen is not None and not isinstance(chosen, GradientTolerance):
        raise TypeError(f"tolerance must be a GradientTolerance or None, not {chosen!r}")
    if chosen is None and dtype not in GRADIENT_TOLERANCES:
        known = ", ".join(GRADIENT_TOLERANCES)
        raise ValueError(f"no default gradient tolerance for {dtype} ({known}); pass tolerance=")
    return chosen if isinstance(chosen, GradientTolerance) else GRADIENT_TOLERANCES[dtype]
