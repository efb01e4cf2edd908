"""Counting jax calls per loop iteration, at the import path substrax 0.1.22 gave it.

This module's path is an interface: ``substrax.testing.jax_calls`` is where 0.1.22 users import
``counted_calls``, ``by_package``, ``per_iteration`` and ``JAX_CALL_WEIGHTS`` from (0.1.22's
names of the kinds are in ``ALIASES``). It holds no
logic; the implementation lives in ``substrax.testing._jax_calls``, and the functions are also
in :mod:`substrax.testing`.

Example:
    >>> from substrax.testing.jax_calls import JAX_CALL_WEIGHTS, KINDS
    >>> KINDS
    ('dispatch', 'host_to_device', 'device_to_host', 'compile')
    >>> dict(JAX_CALL_WEIGHTS)["device_to_host"]
    1
"""

from ._call_counts import ALIASES, JAX_CALL_WEIGHTS, KINDS
from ._errors import CountingFailedError, ToolIdsInUseError, TooManyCallsError, UnevenCountError
from ._jax_calls import (
    CallCounts,
    Keys,
    WeightFn,
    by_package,
    counted_calls,
    per_iteration,
    started,
)


__all__ = [
    "ALIASES",
    "JAX_CALL_WEIGHTS",
    "KINDS",
    "CallCounts",
    "CountingFailedError",
    "Keys",
    "TooManyCallsError",
    "ToolIdsInUseError",
    "UnevenCountError",
    "WeightFn",
    "by_package",
    "counted_calls",
    "per_iteration",
    "started",
]
