"""What one optimizer step of a train step costs: its matrix FLOPs and XLA's bytes accessed.

The FLOPs are counted from the step's jaxpr (:func:`substrax.devices.count_flops`), the same
on every backend; XLA's post-optimisation figure leaves out the library calls a GPU's
matmuls become. The bytes accessed are XLA's own figure for the compiled program.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from substrax.devices import FlopCount, count_flops
from substrax.typing import PyTree


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """The cost of one optimizer step of a :class:`~substrax.spmd.TrainStep`, per device.

    ``flops`` counts the matmuls, convolutions and fused attention of the step's program,
    forward and backward (two per multiply-add, from its jaxpr, on every backend alike), and
    gives one device's share: the program's count over the devices. ``bytes_accessed`` is XLA's
    cost analysis of the compiled, partitioned program for one device. Both are per optimizer
    step whatever the loop features: with ``accumulate_steps=N`` one step is all N microbatches
    and the one update, with ``steps_per_call=k`` one call is k steps and counts k times these
    figures.

    Attributes:
        flops: Matrix FLOPs per device and optimizer step; None where they cannot be counted
            (``flops_reason`` says why), never a partial figure.
        bytes_accessed: Bytes read and written per device and optimizer step; None where the
            backend's cost analysis reports none.
        devices: How many devices run the step.
        accumulate_steps: The step's microbatches per optimizer step.
        steps_per_call: The step's optimizer steps per call.
        flops_reason: Why ``flops`` is None (an opaque kernel, a while loop that multiplies);
            None when it is a count.

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
    flops_reason: str | None = None

    @property
    def total_flops(self) -> float | None:
        """``flops`` over every device: the whole step's operations (None if unknown)."""
        return None if self.flops is None else self.flops * self.devices


def _figure(analysis: Mapping[str, Any], key: str) -> float | None:
    value = analysis.get(key)
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _under(mesh: Mesh | None) -> AbstractContextManager[Any]:
    return nullcontext() if mesh is None else jax.set_mesh(mesh)


def read_bytes(
    jitted: Any,  # noqa: ANN401  (a jax.jit function)
    args: tuple[PyTree, ...],
    *,
    mesh: Mesh | None,
) -> float | None:
    """XLA's bytes accessed of ``jitted`` compiled for ``args`` (abstract values work).

    The compilation is jax's own: a program already compiled for the same shapes and
    shardings is not compiled again, and calling ``jitted`` afterwards reuses this one.
    """
    with _under(mesh):
        compiled = jitted.lower(*args).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list | tuple):  # older jax: one dict per program
        analysis = analysis[0] if analysis else None  # pyright: ignore[reportUnknownVariableType]
    if not isinstance(analysis, Mapping):
        return None
    return _figure(analysis, "bytes accessed")  # pyright: ignore[reportUnknownArgumentType]


def count_program_flops(
    jitted: Any,  # noqa: ANN401  (a jax.jit function)
    args: tuple[PyTree, ...],
    *,
    mesh: Mesh | None,
) -> FlopCount:
    """The matrix FLOPs of one call of ``jitted`` on ``args``, from its traced program.

    jax keeps the trace: compiling or calling ``jitted`` for the same signature reuses it.
    """
    with _under(mesh):
        return count_flops(jitted, *args)


def abstract(x: PyTree, *, unstack: bool = False) -> PyTree:
    """``x`` as a ``ShapeDtypeStruct`` on its sharding; with ``unstack``, one of its rows.

    A row of an array stacked on an unsplit leading axis keeps the rest of its partition spec.
    A NumPy array, or a jax array not committed to a device, has no sharding yet (the call
    places it); anything else (a Python number) is returned as it is.
    """
    if isinstance(x, np.ndarray | np.generic):
        shape = np.shape(x)[1:] if unstack else np.shape(x)
        return jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(x.dtype))
    if not isinstance(x, jax.Array):
        return x
    if not getattr(x, "committed", True):  # placed by the call as a NumPy array would be
        shape = tuple(x.shape)[1:] if unstack else tuple(x.shape)
        return jax.ShapeDtypeStruct(shape, x.dtype)
    sharding = x.sharding
    shape = tuple(x.shape)
    if unstack:
        shape = shape[1:]
        if isinstance(sharding, NamedSharding):
            sharding = NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec[1:]))
    return jax.ShapeDtypeStruct(shape, x.dtype, sharding=sharding)
