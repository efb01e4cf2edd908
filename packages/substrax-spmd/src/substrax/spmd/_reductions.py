"""Metric reductions over global arrays, and collectives inside shard_map or pmap."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeGuard, get_args

import jax
import jax.numpy as jnp
import numpy as np

from substrax.support import check_type
from substrax.typing import PyTree

from ._errors import UnknownAxisError, UnknownReductionError


type Reduction = Literal["mean", "sum", "max", "min"]
REDUCTIONS: tuple[str, ...] = get_args(Reduction.__value__)

_ARRAYS = (jax.Array, np.ndarray)


def _is_array(value: object, min_ndim: int = 1) -> TypeGuard[jax.Array | np.ndarray]:
    """Whether ``value`` is an array a reduction applies to (ndim >= ``min_ndim``)."""
    return isinstance(value, _ARRAYS) and value.ndim >= min_ndim


_NUMBERS = (*_ARRAYS, np.generic, int, float)


def _holds_numbers(value: object) -> bool:
    """Whether ``value`` is a container of numbers or arrays (a list, a nested metric).

    Such a value, named in ``reduce_fn``, would pass through unreduced: it is refused.
    """
    return not isinstance(value, _NUMBERS) and any(
        isinstance(leaf, _NUMBERS) for leaf in jax.tree.leaves(value)
    )


def _map_arrays[T](fn: Callable[[Any], Any], metrics: T, *, min_ndim: int = 1) -> T:
    def one(leaf: PyTree) -> PyTree:
        return fn(leaf) if _is_array(leaf, min_ndim) else leaf

    return jax.tree.map(one, metrics)


def _across[T](collective: Callable[[Any, str], Any], tree: T, axis_name: str) -> T:
    """Apply ``collective(leaf, axis_name)`` to every array leaf, scalars included.

    Raises:
        UnknownAxisError: A NameError, if ``axis_name`` is not bound where this runs (jax says
            only ``AssertionError`` under ``shard_map``); the message lists the names that are.
    """
    try:
        return _map_arrays(lambda x: collective(x, axis_name), tree, min_ndim=0)
    except (AssertionError, NameError) as error:
        available = tuple(str(name) for name in jax.sharding.get_abstract_mesh().axis_names)
        if axis_name in available:
            raise
        where = f"the mesh axes here are {available}" if available else "no mesh axis is bound here"
        msg = (
            f"axis_name {axis_name!r} is not bound: {where}; pass axis_name= one of them, "
            "and call this inside jax.shard_map or jax.pmap"
        )
        raise UnknownAxisError(msg, axis_name=axis_name, available=available) from error


def reduce_mean[T](metrics: T) -> T:
    """Average every array leaf (ndim >= 1) of ``metrics``, at any depth; others pass through.

    Works on global arrays under ``jax.jit`` with a mesh: XLA inserts the cross-device reduction.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import reduce_mean
        >>> reduce_mean({"loss": jnp.array([1.0, 3.0]), "step": 7})
        {'loss': Array(2., dtype=float32), 'step': 7}
    """
    return _map_arrays(jnp.mean, metrics)


def reduce_sum[T](metrics: T) -> T:
    """Sum every array leaf (ndim >= 1) of ``metrics``; others pass through.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import reduce_sum
        >>> reduce_sum({"n": jnp.array([1, 2, 3])})
        {'n': Array(6, dtype=int32)}
    """
    return _map_arrays(jnp.sum, metrics)


def reduce_max[T](metrics: T) -> T:
    """Take the maximum of every array leaf (ndim >= 1) of ``metrics``; others pass through.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import reduce_max
        >>> reduce_max({"x": jnp.array([1, 5, 3])})
        {'x': Array(5, dtype=int32)}
    """
    return _map_arrays(jnp.max, metrics)


def reduce_min[T](metrics: T) -> T:
    """Take the minimum of every array leaf (ndim >= 1) of ``metrics``; others pass through.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import reduce_min
        >>> reduce_min({"x": jnp.array([1, 5, 3])})
        {'x': Array(1, dtype=int32)}
    """
    return _map_arrays(jnp.min, metrics)


_BY_NAME: dict[str, Callable[[Any], Any]] = {
    "mean": jnp.mean,
    "sum": jnp.sum,
    "max": jnp.max,
    "min": jnp.min,
}


def reduce_custom[V](
    metrics: Mapping[str, V], reduce_fn: Mapping[str, str | None] | None = None
) -> dict[str, V | jax.Array]:
    """Reduce each named metric by its own operation.

    Args:
        metrics: Metric name to value.
        reduce_fn: Metric name to ``"mean"``, ``"sum"``, ``"max"``, ``"min"``, or None to pass
            the value through; a metric it does not name is averaged. None averages all.

    Returns:
        Metric name to reduced value (array values with ndim >= 1 are reduced; any other
        value, such as a string, a number or None, passes through as it is).

    Raises:
        UnknownReductionError: For an operation outside the four, or a name that is not a metric.
        TypeError: For a named value that is a container of numbers or arrays (a list, a
            nested metric), which would pass through unreduced.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import reduce_custom
        >>> out = reduce_custom({"loss": jnp.array([1.0, 3.0]), "step": jnp.array([4, 5])}, {"step": "max"})
        >>> float(out["loss"]), int(out["step"])
        (2.0, 5)
    """
    ops = dict(reduce_fn or {})
    for name, op in ops.items():
        if name not in metrics:
            msg = f"reduce_fn names {name!r}, which is not a metric (metrics: {sorted(metrics)})"
            raise UnknownReductionError(msg, name=name, reduction=op)
        if op is not None and op not in _BY_NAME:
            msg = f"metric {name!r} asks for reduction {op!r}; use one of {REDUCTIONS} or None"
            raise UnknownReductionError(msg, name=name, reduction=op)
    out: dict[str, V | jax.Array] = {}
    for name, value in metrics.items():
        op = ops.get(name, "mean")
        if op is not None and _is_array(value):
            out[name] = _BY_NAME[op](value)
            continue
        if name in ops and op is not None and _holds_numbers(value):  # it would pass unreduced
            kind = type(value).__name__
            raise TypeError(
                f"reduce_fn asks {op!r} of metric {name!r}, a {kind} holding numbers: the "
                "metrics are a flat mapping of arrays; stack them (jnp.stack) or give each "
                "array its own name"
            )
        out[name] = value
    return out


def reduce_gradient_tree[T](
    gradients: T, reduce_type: Literal["mean", "sum"] = "mean", *, axis_name: str | None = None
) -> T:
    """Reduce a gradient tree across devices.

    Under ``jax.jit`` with global arrays (``axis_name=None``) the gradient of the batch's loss
    is already the full gradient (XLA inserted the all-reduce), so the tree comes back
    unchanged. Inside ``shard_map`` or ``pmap``, pass the mapped ``axis_name`` and every array
    leaf is averaged (``pmean``) or summed (``psum``) across it.

    Raises:
        ValueError: If ``reduce_type`` is not ``"mean"`` or ``"sum"``.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import reduce_gradient_tree
        >>> grads = {"w": jnp.ones(3)}
        >>> reduce_gradient_tree(grads) is grads
        True
    """
    if reduce_type not in ("mean", "sum"):
        msg = f"reduce_type must be 'mean' or 'sum'; got {reduce_type!r}"
        raise ValueError(msg)
    if axis_name is None:
        return gradients
    return _across(jax.lax.pmean if reduce_type == "mean" else jax.lax.psum, gradients, axis_name)


def reduce_mean_collective[T](metrics: T, axis_name: str = "batch") -> T:
    """Average every array leaf across ``axis_name`` (inside ``shard_map`` or ``pmap`` only).

    Raises:
        UnknownAxisError: A NameError, if no mapped axis is named ``axis_name`` (a mesh of
            ``"data"`` under ``shard_map`` with the default ``"batch"``); it lists the names.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import reduce_mean_collective
        >>> f = jax.pmap(lambda x: reduce_mean_collective({"x": x}), axis_name="batch")
        >>> f(jnp.arange(2.0))["x"].tolist()
        [0.5, 0.5]
    """
    return _across(jax.lax.pmean, metrics, axis_name)


def reduce_sum_collective[T](metrics: T, axis_name: str = "batch") -> T:
    """Sum every array leaf across ``axis_name`` (inside ``shard_map`` or ``pmap`` only).

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import reduce_sum_collective
        >>> f = jax.pmap(lambda x: reduce_sum_collective({"x": x}), axis_name="batch")
        >>> f(jnp.arange(2.0))["x"].tolist()
        [1.0, 1.0]
    """
    return _across(jax.lax.psum, metrics, axis_name)


def all_gather[T](metrics: T, axis_name: str = "batch") -> T:
    """Gather every array leaf from all devices along ``axis_name`` (inside ``shard_map`` or ``pmap``).

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import all_gather
        >>> f = jax.pmap(lambda x: all_gather({"x": x}), axis_name="batch")
        >>> f(jnp.arange(2.0))["x"].tolist()
        [[0.0, 1.0], [0.0, 1.0]]
    """
    return _across(jax.lax.all_gather, metrics, axis_name)


def collect_from_devices[V](metrics: Mapping[str, V]) -> dict[str, list[jax.Array] | V]:
    """Split per-device values (leading device axis) into per-device lists.

    Call it outside the mapped function, on what ``pmap`` or ``shard_map`` returned.

    Raises:
        TypeError: ``metrics`` is not a mapping of metric names to values.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import collect_from_devices
        >>> collect_from_devices({"loss": jnp.array([1.0, 2.0]), "tag": "eval"})["loss"]
        [Array(1., dtype=float32), Array(2., dtype=float32)]
    """
    check_type("metrics", metrics, Mapping, "a mapping of metric names to per-device values")
    out: dict[str, list[jax.Array] | V] = {}
    for name, value in metrics.items():
        if _is_array(value):
            out[name] = [jnp.asarray(v) for v in value]
        else:
            out[name] = value
    return out
