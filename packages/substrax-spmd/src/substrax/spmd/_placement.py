"""Putting host batches and model state onto a mesh."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from substrax.typing import PyTree

from ._errors import BatchPlacementError


def create_data_parallel_sharding(mesh: Mesh, data_axis: str = "data") -> NamedSharding:
    """The sharding that splits a batch's leading axis over ``data_axis``.

    Raises:
        ValueError: If ``data_axis`` is not an axis of ``mesh``.

    Example:
        >>> from substrax.mesh import create_device_mesh
        >>> from substrax.spmd import create_data_parallel_sharding
        >>> create_data_parallel_sharding(create_device_mesh({"data": 2})).spec
        P('data',)
    """
    if data_axis not in mesh.axis_names:
        msg = f"data_axis {data_axis!r} is not an axis of the mesh {dict(mesh.shape)}; pass data_axis="
        raise ValueError(msg)
    return NamedSharding(mesh, PartitionSpec(data_axis))


_PAIR = 2
_ARRAY_TYPES = (np.ndarray, np.generic, jax.Array)


def _split_rank(sharding: Sharding) -> int:
    """How many leading dimensions a sharding needs: 1 + the last split dimension."""
    if not isinstance(sharding, NamedSharding):
        return 0
    spec = sharding.spec
    for i in range(len(spec) - 1, -1, -1):
        if spec[i] is not None:
            return i + 1
    return 0


def _refuse(batch: PyTree, sharding: Sharding | PyTree) -> None:
    """Find, with paths, the first leaf its sharding cannot split, and raise for it."""
    is_sharding = lambda x: isinstance(x, Sharding)  # noqa: E731

    def check(prefix_path: tuple[Any, ...], shard: Sharding, subtree: PyTree) -> None:
        need = _split_rank(shard)
        for path, leaf in jax.tree_util.tree_flatten_with_path(subtree)[0]:
            if isinstance(leaf, _ARRAY_TYPES) and np.ndim(leaf) < need:
                where = jax.tree_util.keystr((*prefix_path, *path))
                spec = shard.spec if isinstance(shard, NamedSharding) else PartitionSpec()
                msg = (
                    f"batch leaf {where} has shape {np.shape(leaf)} but its sharding {spec} splits "
                    f"{need} dimension(s); give it a replicated sharding, e.g. "
                    "NamedSharding(mesh, PartitionSpec()), through a pytree prefix of shardings"
                )
                raise BatchPlacementError(msg, path=where, shape=np.shape(leaf), spec=spec)

    if is_sharding(sharding):
        check((), sharding, batch)
        return
    jax.tree_util.tree_map_with_path(check, sharding, batch, is_leaf=is_sharding)


def place_batch_on_shards(batch: PyTree, sharding: Sharding | PyTree) -> PyTree:
    """Turn this process's batch into global arrays, each subtree on its sharding.

    Array leaves (``jax.Array``, NumPy arrays and NumPy scalars) are placed in one call: on
    one process one batched ``jax.device_put`` (what ``make_array_from_process_local_data``
    does there); on several, one ``jax.make_array_from_process_local_data``, where each
    process passes the rows it loaded and jax assembles the global array (a replicated leaf
    must be equal on every process). Any other leaf, such as a string or a Python number, is
    returned as it is. Call it outside ``jax.jit``.

    Args:
        batch: The batch this process loaded.
        sharding: One sharding for every array leaf, or a pytree prefix of ``batch`` whose
            leaves are shardings, each applying to its subtree.

    Returns:
        The batch with every array leaf replaced by the global array on its sharding.

    Raises:
        BatchPlacementError: A ValueError, if a leaf has fewer dimensions than its sharding
            splits; the message names the leaf's path.

    Example:
        >>> import numpy as np
        >>> from substrax.mesh import create_device_mesh
        >>> from substrax.spmd import create_data_parallel_sharding, place_batch_on_shards
        >>> sharding = create_data_parallel_sharding(create_device_mesh({"data": 2}))
        >>> placed = place_batch_on_shards({"x": np.ones((4, 3)), "name": "b0"}, sharding)
        >>> placed["x"].sharding.spec, placed["name"]
        (P('data',), 'b0')
    """
    if isinstance(sharding, Sharding):
        leaves, treedef = jax.tree.flatten(batch)
        need = _split_rank(sharding)
        index = [i for i, leaf in enumerate(leaves) if isinstance(leaf, _ARRAY_TYPES)]
        if need and any(np.ndim(leaves[i]) < need for i in index):
            _refuse(batch, sharding)
        shardings: list[Sharding] | Sharding = sharding
    else:
        pairs = jax.tree.map(
            lambda s, sub: (s, sub), sharding, batch, is_leaf=lambda x: isinstance(x, Sharding)
        )
        leaves, treedef = jax.tree.flatten(batch)
        per_leaf: list[Sharding] = []
        for shard, sub in jax.tree.leaves(
            pairs,
            is_leaf=lambda x: (
                isinstance(x, tuple) and len(x) == _PAIR and isinstance(x[0], Sharding)
            ),
        ):  # pyright: ignore[reportUnknownArgumentType]
            per_leaf.extend([shard] * len(jax.tree.leaves(sub)))
        index = [i for i, leaf in enumerate(leaves) if isinstance(leaf, _ARRAY_TYPES)]
        shardings = [per_leaf[i] for i in index]
        if any(np.ndim(leaves[i]) < _split_rank(s) for i, s in zip(index, shardings, strict=True)):
            _refuse(batch, sharding)
    if not index:
        return batch
    local = [leaves[i] for i in index]
    if jax.process_count() == 1:
        # What make_array_from_process_local_data does on one process, minus its pytree work.
        placed = jax.device_put(local, shardings)
    else:
        if isinstance(shardings, Sharding):
            shardings = [shardings] * len(local)
        placed = jax.make_array_from_process_local_data(shardings, local)
    for i, array in zip(index, placed, strict=True):
        leaves[i] = array
    return jax.tree.unflatten(treedef, leaves)


type FilterShardings = nnx.StateSharding | Mapping[Any, PartitionSpec | Sharding]


def _is_typed_key(value: object) -> bool:
    return isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)


def place_nnx_state_on_shards(
    state: nnx.State[Any, Any], mesh: Mesh, filter_sharding: FilterShardings | None = None
) -> nnx.State[Any, Any]:
    """Place an nnx state on ``mesh``: replicated, or by filter.

    Args:
        state: The state to place, e.g. ``nnx.state(model)``.
        mesh: The mesh.
        filter_sharding: An nnx filter to ``PartitionSpec`` (or sharding) mapping, or an
            ``nnx.StateSharding``; the first matching filter decides a variable's sharding, and
            a variable no filter matches is replicated. Everything is replicated when None.

    Returns:
        A state of the same structure, every array a global array on ``mesh``.

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
    if filter_sharding is None:
        rules: list[tuple[Any, Sharding]] = []
    else:
        items = (
            filter_sharding.items()
            if isinstance(filter_sharding, Mapping)
            else zip(filter_sharding.filters, filter_sharding.shardings, strict=True)
        )
        rules = [
            (
                nnx.filterlib.to_predicate(f),
                s if isinstance(s, Sharding) else NamedSharding(mesh, s),
            )
            for f, s in items
        ]
    flat = nnx.to_flat_state(state)
    leaves: list[Any] = []
    targets: list[Sharding] = []
    for path, variable in flat:
        value = variable.get_value() if isinstance(variable, nnx.Variable) else variable
        target = next((s for pred, s in rules if pred(path, variable)), replicated)
        leaves.append(value)
        targets.append(target)
    # Typed PRNG keys travel as their key data: across processes jax places raw arrays onto a
    # global sharding, but refuses a key array that lives on one process's device.
    keys = {i: jax.random.key_impl(x) for i, x in enumerate(leaves) if _is_typed_key(x)}
    raw = [jax.random.key_data(x) if i in keys else x for i, x in enumerate(leaves)]
    placed = jax.device_put(raw, targets)
    placed = [
        jax.random.wrap_key_data(x, impl=keys[i]) if i in keys else x for i, x in enumerate(placed)
    ]
    out: list[tuple[Any, Any]] = []
    for (path, variable), array in zip(flat, placed, strict=True):
        out.append((path, variable.replace(array) if isinstance(variable, nnx.Variable) else array))
    return nnx.from_flat_state(out)
