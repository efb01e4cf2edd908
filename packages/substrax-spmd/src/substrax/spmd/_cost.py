"""What one optimizer step of a compiled train step costs, from XLA's cost analysis."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from substrax.typing import PyTree


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """The cost of one optimizer step of a :class:`~substrax.spmd.TrainStep`, per device.

    The figures come from XLA's cost analysis of the compiled, partitioned program, so they are
    one device's share of a sharded step (the work every device repeats, such as an update of
    replicated parameters, counted on each). They are per optimizer step whatever the loop
    features: with ``accumulate_steps=N`` one step is all N microbatches and the one update,
    with ``steps_per_call=k`` one call is k steps and counts k times these figures.

    Attributes:
        flops: Floating-point operations per device and optimizer step; None where the
            backend's cost analysis reports none.
        bytes_accessed: Bytes read and written per device and optimizer step (None likewise).
        devices: How many devices run the step.
        accumulate_steps: The step's microbatches per optimizer step.
        steps_per_call: The step's optimizer steps per call.

    Example:
        >>> from substrax.spmd import StepCost
        >>> cost = StepCost(flops=1e9, bytes_accessed=None, devices=8)
        >>> cost.total_flops
        8000000000.0
    """

    flops: float | None
    bytes_accessed: float | None
    devices: int
    accumulate_steps: int = 1
    steps_per_call: int = 1

    @property
    def total_flops(self) -> float | None:
        """``flops`` over every device: the whole step's operations (None if unknown)."""
        return None if self.flops is None else self.flops * self.devices


def _figure(analysis: Mapping[str, Any], key: str) -> float | None:
    value = analysis.get(key)
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def read_cost(
    jitted: Any,  # noqa: ANN401  (a jax.jit function)
    args: tuple[PyTree, ...],
    *,
    mesh: Mesh | None,
) -> tuple[float | None, float | None]:
    """The FLOPs and bytes accessed of ``jitted`` compiled for ``args`` (abstract values work).

    The compilation is jax's own: a program already compiled for the same shapes and
    shardings is not compiled again, and calling ``jitted`` afterwards reuses this one.
    """
    if mesh is None:
        compiled = jitted.lower(*args).compile()
    else:
        with jax.set_mesh(mesh):
            compiled = jitted.lower(*args).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list | tuple):  # older jax: one dict per program
        analysis = analysis[0] if analysis else None  # pyright: ignore[reportUnknownVariableType]
    if not isinstance(analysis, Mapping):
        return None, None
    return _figure(analysis, "flops"), _figure(analysis, "bytes accessed")  # pyright: ignore[reportUnknownArgumentType]


def abstract(x: PyTree, *, unstack: bool = False) -> PyTree:
    """``x`` as a ``ShapeDtypeStruct`` on its sharding; with ``unstack``, one of its rows.

    A row of an array stacked on an unsplit leading axis keeps the rest of its partition spec.
    A NumPy array has no sharding yet (jax puts it on the default device); anything else (a
    Python number) is returned as it is.
    """
    if isinstance(x, np.ndarray | np.generic):
        shape = np.shape(x)[1:] if unstack else np.shape(x)
        return jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(x.dtype))
    if not isinstance(x, jax.Array):
        return x
    sharding = x.sharding
    shape = tuple(x.shape)
    if unstack:
        shape = shape[1:]
        if isinstance(sharding, NamedSharding):
            sharding = NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec[1:]))
    return jax.ShapeDtypeStruct(shape, x.dtype, sharding=sharding)
