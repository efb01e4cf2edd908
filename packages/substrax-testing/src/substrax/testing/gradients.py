"""Gradient checks against finite differences, at the import path substrax 0.1.22 gave them.

This module's path is an interface: ``substrax.testing.gradients`` is where 0.1.22 users import
``check_parameter_gradients`` and ``check_input_gradients`` from. It holds no logic; the
implementation lives in ``substrax.testing._gradients``, and the names are also in
:mod:`substrax.testing`.

Example:
    >>> from substrax.testing.gradients import GRADIENT_TOLERANCES
    >>> sorted(GRADIENT_TOLERANCES)
    ['bfloat16', 'float16', 'float32', 'float64']
"""

from ._errors import GradientMismatchError, ZeroGradientError
from ._gradient_records import GRADIENT_TOLERANCES, GradientTolerance, LeafGradientCheck
from ._gradients import MODES, check_input_gradients, check_parameter_gradients


__all__ = [
    "GRADIENT_TOLERANCES",
    "MODES",
    "GradientMismatchError",
    "GradientTolerance",
    "LeafGradientCheck",
    "ZeroGradientError",
    "check_input_gradients",
    "check_parameter_gradients",
]
