"""Putting an nnx state onto a mesh: replicated, or by filter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from ._device_order import spec_axes
from ._placement import misfit


type FilterShardings = nnx.StateSharding | Mapping[Any, PartitionSpec | Sharding]


def _is_typed_key(value: object) -> bool:
    return isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)


def put_keys_as_data(values: list[Any], targets: list[Sharding]) -> list[Any]:
    """``jax.device_put(values, targets)``, with typed PRNG keys moved as their key data.

    Across processes jax places raw arrays onto a global sharding, but refuses a key array
    that lives on one process's device; its key data goes, and is wrapped again there.
    """
    keys = {i: jax.random.key_impl(x) for i, x in enumerate(values) if _is_typed_key(x)}
    raw = [jax.random.key_data(x) if i in keys else x for i, x in enumerate(values)]
    placed = jax.device_put(raw, targets)
    return [
        jax.random.wrap_key_data(x, impl=keys[i]) if i in keys else x for i, x in enumerate(placed)
    ]


def _rule_sharding(path: tuple[Any, ...], rule: object, given: object, mesh: Mesh) -> Sharding:
    """The sharding a filter maps the variable at ``path`` to, or an error naming both."""
    where = "/".join(str(key) for key in path)
    if isinstance(given, Sharding):
        return given
    if not isinstance(given, PartitionSpec):
        wrap = f"PartitionSpec({given!r})" if isinstance(given, str) else "a PartitionSpec"
        msg = (
            f"state variable {where} matches filter {rule!r}, which maps to the "
            f"{type(given).__name__} {given!r}; map the filter to {wrap} or a Sharding"
        )
        raise TypeError(msg)
    missing = [axis for axis in spec_axes(given) if axis not in mesh.axis_names]
    if missing:
        msg = (
            f"state variable {where} matches filter {rule!r}, whose spec {given} names axes "
            f"{missing} that the mesh {dict(mesh.shape)} lacks; name axes of the mesh in it"
        )
        raise ValueError(msg)
    return NamedSharding(mesh, given)


def _check_state_leaf(path: tuple[Any, ...], value: object, target: Sharding) -> None:
    """Refuse a variable ``target`` cannot split, naming its path, shape and spec."""
    for array in jax.tree.leaves(value):
        shape = tuple(np.shape(array))
        why = misfit(shape, target)
        if why is not None:
            spec = target.spec if isinstance(target, NamedSharding) else PartitionSpec()
            where = "/".join(str(key) for key in path)
            msg = (
                f"state variable {where} has shape {shape} but its sharding {spec} {why}; "
                "give it a filter whose spec fits its shape (a variable no filter matches is "
                "replicated)"
            )
            raise ValueError(msg)


def place_nnx_state_on_shards(
    state: nnx.State[Any, Any], mesh: Mesh, filter_sharding: FilterShardings | None = None
) -> nnx.State[Any, Any]:
    """Place an nnx state on ``mesh``: replicated, or by filter.

    Args:
        state: The state to place, e.g. ``nnx.state(model)``.
        mesh: The mesh.
        filter_sharding: An nnx filter to ``PartitionSpec`` (or sharding) mapping, or an
            ``nnx.StateSharding``; the first matching filter decides a variable's sharding, and
            a variable no filter matches is replicated. Everything is replicated when None. A
            ``PartitionSpec`` is taken on ``mesh``; a ``Sharding`` is used as given, so one on
            another mesh puts its variables there, not on ``mesh``.

    Returns:
        A state of the same structure, every array a global array on ``mesh`` (or on the
        ``Sharding`` its filter gives).

    Raises:
        ValueError: A variable its sharding cannot split (a spec on a scalar, or a dimension
            its mesh axes do not divide), or whose spec names an axis ``mesh`` lacks, named by
            its path with its spec.
        TypeError: A filter mapped to neither a ``PartitionSpec`` nor a ``Sharding`` (a bare
            ``"model"``), named with the first variable it matches.

    Example:
        >>> from flax import nnx
        >>> from substrax.mesh import create_device_mesh
        >>> from jax.sharding import PartitionSpec as P
        >>> from substrax.spmd import place_nnx_state_on_shards
        >>> mesh = create_device_mesh({"model": 2})
        >>> state = nnx.state(nnx.Linear(2, 4, rngs=nnx.Rngs(0)))
        >>> placed = place_nnx_state_on_shards(state, mesh, {nnx.PathContains("kernel"): P(None, "model")})
        >>> placed["kernel"].get_value().sharding.spec, placed["bias"].get_value().sharding.spec
        (P(None, 'model'), P())
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    items: Any = ()
    if isinstance(filter_sharding, Mapping):
        items = filter_sharding.items()
    elif filter_sharding is not None:
        items = zip(filter_sharding.filters, filter_sharding.shardings, strict=True)
    rules = [(nnx.filterlib.to_predicate(f), f, s) for f, s in items]
    flat = nnx.to_flat_state(state)
    leaves: list[Any] = []
    targets: list[Sharding] = []
    for path, variable in flat:
        value = variable.get_value() if isinstance(variable, nnx.Variable) else variable
        rule = next(((f, s) for pred, f, s in rules if pred(path, variable)), None)
        target = replicated if rule is None else _rule_sharding(path, *rule, mesh)
        _check_state_leaf(path, value, target)
        leaves.append(value)
        targets.append(target)
    placed = put_keys_as_data(leaves, targets)
    out: list[tuple[Any, Any]] = []
    for (path, variable), array in zip(flat, placed, strict=True):
        out.append((path, variable.replace(array) if isinstance(variable, nnx.Variable) else array))
    return nnx.from_flat_state(out)
