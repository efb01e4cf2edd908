"""Putting host batches onto a mesh, each leaf on its sharding."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.core
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from substrax.devices import check_fits_32_bits
from substrax.typing import PyTree

from ._errors import BatchPlacementError
from ._leaf_names import leaf_name


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
    """How many dimensions a sharding needs: one per entry of its spec, a ``None`` one too (jax's rule)."""
    return len(sharding.spec) if isinstance(sharding, NamedSharding) else 0


def _is_local(leaf: object) -> bool:
    """Whether ``leaf`` is this process's rows rather than a global array."""
    return not (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable)


def _rows_only(leaf: object, *, multi: bool) -> bool:
    """Whether only ``leaf``'s number of dimensions can be checked.

    So for a traced value (inside ``jax.jit`` or ``shard_map``, where its shape may be one
    device's shard), and for one process's rows of a global array whose global shape only jax
    knows.
    """
    return isinstance(leaf, jax.core.Tracer) or (multi and _is_local(leaf))


def misfit(shape: tuple[int, ...], sharding: Sharding, *, rows_only: bool = False) -> str | None:
    """Why ``sharding`` cannot split an array of ``shape``, or None if it can.

    With ``rows_only`` (one process's rows of a global array, whose global shape only jax
    knows) just the number of dimensions is checked.
    """
    need = _split_rank(sharding)
    if len(shape) < need:
        return f"names {need} dimension(s)"
    if rows_only or not isinstance(sharding, NamedSharding):
        return None
    mesh_shape = dict(sharding.mesh.shape)
    for dim, entry in enumerate(sharding.spec):
        if entry is None:
            continue
        axes: tuple[str, ...] = entry if isinstance(entry, tuple) else (entry,)
        ways = math.prod(mesh_shape[axis] for axis in axes)
        if shape[dim] % ways:
            named = " x ".join(f"{axis!r} ({mesh_shape[axis]})" for axis in axes)
            return (
                f"splits its dimension {dim} ({shape[dim]}) {ways} ways over mesh axis {named}, "
                f"and {ways} does not divide {shape[dim]}"
            )
    return None


def _refuse(batch: PyTree, sharding: Sharding | PyTree, *, multi: bool = False) -> None:
    """Find, with paths, the first leaf its sharding cannot split, and raise for it."""
    is_sharding = lambda x: isinstance(x, Sharding)  # noqa: E731

    def check(prefix_path: tuple[Any, ...], shard: Sharding, subtree: PyTree) -> None:
        for path, leaf in jax.tree_util.tree_flatten_with_path(subtree)[0]:
            if not isinstance(leaf, _ARRAY_TYPES):
                continue
            why = misfit(np.shape(leaf), shard, rows_only=_rows_only(leaf, multi=multi))
            if why is None:
                continue
            where = jax.tree_util.keystr((*prefix_path, *path))
            spec = shard.spec if isinstance(shard, NamedSharding) else PartitionSpec()
            fix = (
                "give it a replicated sharding, e.g. NamedSharding(mesh, PartitionSpec()), "
                "through a pytree prefix of shardings"
                if np.ndim(leaf) < _split_rank(shard)
                else "make the batch size a multiple of it (drop or pad the last rows)"
            )
            msg = f"{leaf_name(where)} has shape {np.shape(leaf)} but its sharding {spec} {why}; {fix}"
            raise BatchPlacementError(msg, path=where, shape=np.shape(leaf), spec=spec)

    if is_sharding(sharding):
        check((), sharding, batch)
        return
    jax.tree_util.tree_map_with_path(check, sharding, batch, is_leaf=is_sharding)


def _refuse_non_shardings(sharding: object) -> None:
    """Refuse a ``PartitionSpec``, a None (or anything else) where shardings are expected."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(sharding, is_leaf=lambda x: x is None):
        if isinstance(leaf, Sharding):
            continue
        if leaf is None:
            where = f"batch_sharding{jax.tree_util.keystr(path)}"
            msg = (
                f"{where} is None; every part of a batch sharding prefix must be a sharding: "
                "give that part one (NamedSharding(mesh, PartitionSpec()) replicates it)"
            )
            raise TypeError(msg)
        if isinstance(leaf, PartitionSpec):
            msg = (
                f"batch sharding {leaf} is a PartitionSpec, not a sharding: wrap it, "
                f"NamedSharding(mesh, {leaf}) (a TrainStep with a mesh does this for you)"
            )
        else:
            msg = (
                f"batch sharding must be a jax Sharding or a pytree prefix of them; got a "
                f"{type(leaf).__name__} ({leaf!r})"
            )
        raise TypeError(msg)


def resolve_batch_sharding(sharding: object, mesh: Mesh | None) -> Sharding | PyTree:
    """Turn each ``PartitionSpec`` in a batch-sharding prefix into ``NamedSharding(mesh, spec)``.

    Raises:
        TypeError: For a ``PartitionSpec`` without a mesh to put it on, a None, or a leaf that
            is neither (the message names the path).
    """
    if mesh is not None:
        sharding = jax.tree.map(
            lambda s: NamedSharding(mesh, s) if isinstance(s, PartitionSpec) else s, sharding
        )
    _refuse_non_shardings(sharding)
    return sharding


def _on_target(leaf: object, target: Sharding) -> bool:
    if not isinstance(leaf, jax.Array):
        return False
    current = leaf.sharding
    return current is target or current == target


def _prefix_mismatch(batch: PyTree, sharding: PyTree, error: ValueError) -> str:
    """Why ``sharding`` is no pytree prefix of ``batch``, naming the first path where not."""
    covers = [
        path
        for path, _ in jax.tree_util.tree_leaves_with_path(
            sharding, is_leaf=lambda x: isinstance(x, Sharding)
        )
    ]
    leaves = [path for path, _ in jax.tree_util.tree_leaves_with_path(batch)]
    fix = (
        "give batch_sharding the batch's structure down to each sharding (a pytree prefix of "
        "the batch), e.g. one entry for each key"
    )
    for leaf in leaves:
        if not any(leaf[: len(path)] == path for path in covers):
            return f"{leaf_name(leaf)} has no sharding in batch_sharding; {fix}"
    for path in covers:
        if not any(leaf[: len(path)] == path for leaf in leaves):
            where = jax.tree_util.keystr(path)
            return f"batch_sharding{where} names a part the batch does not have; {fix}"
    return f"batch_sharding is not a pytree prefix of the batch ({error}); {fix}"


def _targets(batch: PyTree, sharding: Sharding | PyTree, index: list[int]) -> list[Sharding]:
    """The sharding of each array leaf (positions ``index`` among ``batch``'s leaves)."""
    if isinstance(sharding, Sharding):
        return [sharding] * len(index)
    _refuse_non_shardings(sharding)
    try:
        pairs = jax.tree.map(
            lambda s, sub: (s, sub), sharding, batch, is_leaf=lambda x: isinstance(x, Sharding)
        )
    except ValueError as error:  # jax's pytree structure error, which names no batch leaf
        raise ValueError(_prefix_mismatch(batch, sharding, error)) from None
    per_leaf: list[Sharding] = []
    for shard, sub in jax.tree.leaves(
        pairs,
        is_leaf=lambda x: isinstance(x, tuple) and len(x) == _PAIR and isinstance(x[0], Sharding),
    ):  # pyright: ignore[reportUnknownArgumentType]
        per_leaf.extend([shard] * len(jax.tree.leaves(sub)))
    return [per_leaf[i] for i in index]


def _place_across_processes(
    local: list[Any], shardings: list[Sharding], paths: list[str]
) -> list[jax.Array]:
    """Assemble process-local rows in one call, and reshard global arrays."""
    placed: list[Any] = list(local)
    rows = [k for k, x in enumerate(local) if _is_local(x)]
    try:
        made = jax.make_array_from_process_local_data(
            [shardings[k] for k in rows], [local[k] for k in rows]
        )
    except ValueError as error:  # jax's IndivisibleError names no leaf: find it, one by one
        for k in rows:
            try:
                jax.make_array_from_process_local_data(shardings[k], local[k])
            except ValueError as found:
                shape, sharding = np.shape(local[k]), shardings[k]
                spec = sharding.spec if isinstance(sharding, NamedSharding) else PartitionSpec()
                msg = (
                    f"{leaf_name(paths[k])} has shape {shape} on this process, and its sharding "
                    f"{spec} cannot assemble the processes' parts into one array ({found}); "
                    "each dimension the spec splits must divide evenly over this process's "
                    "devices on those mesh axes (for the rows: drop or pad the last ones)"
                )
                raise BatchPlacementError(msg, path=paths[k], shape=shape, spec=spec) from None
        raise error from None
    for k, array in zip(rows, made, strict=True):
        placed[k] = array
    for k, x in enumerate(local):
        if not _is_local(x):
            placed[k] = jax.device_put(x, shardings[k])
    return placed


def place_batch_on_shards(batch: PyTree, sharding: Sharding | PyTree) -> PyTree:
    """Turn this process's batch into global arrays, each subtree on its sharding.

    Array leaves (``jax.Array``, NumPy arrays and NumPy scalars) are placed in one call: on
    one process one batched ``jax.device_put`` (what ``make_array_from_process_local_data``
    does there); on several, one ``jax.make_array_from_process_local_data``, where each
    process passes the rows it loaded and jax assembles the global array (every process must
    pass the same number of rows, as jax infers the global shape from its own; a replicated
    leaf must be equal on every process). A ``jax.Array`` already on its sharding is kept as it is;
    one on another sharding is resharded (on several processes, a global array is resharded
    and a process-local one is taken as this process's rows). Any other leaf, such as a string
    or a Python number, is returned as it is. Call it outside ``jax.jit``: inside a traced
    function each leaf is checked for the dimensions its sharding names, and returned as it
    is, not placed.

    Args:
        batch: The batch this process loaded.
        sharding: One sharding for every array leaf, or a pytree prefix of ``batch`` whose
            leaves are shardings, each applying to its subtree.

    Returns:
        The batch with every array leaf replaced by the global array on its sharding.

    Raises:
        BatchPlacementError: A ValueError, if a leaf has fewer dimensions than its sharding's
            spec names (a ``None`` entry too), or a split dimension that its mesh axes do not
            divide (a 12-row batch on an 8-way data axis); the message names the leaf's path
            and the sizes.
        ValueError: If ``sharding`` is no pytree prefix of ``batch`` (a key missing, or one the
            batch lacks); the message names the path.
        TypeError: If ``sharding`` is (or holds) a ``PartitionSpec`` (wrap it in
            ``NamedSharding(mesh, spec)``) or a None (the message names the path).

    Example:
        >>> import numpy as np
        >>> from substrax.mesh import create_device_mesh
        >>> from substrax.spmd import create_data_parallel_sharding, place_batch_on_shards
        >>> sharding = create_data_parallel_sharding(create_device_mesh({"data": 2}))
        >>> placed = place_batch_on_shards({"x": np.ones((4, 3)), "name": "b0"}, sharding)
        >>> placed["x"].sharding.spec, placed["name"]
        (P('data',), 'b0')
    """
    leaves, treedef = jax.tree.flatten(batch)
    index = [i for i, leaf in enumerate(leaves) if isinstance(leaf, _ARRAY_TYPES)]
    targets = _targets(batch, sharding, index)
    multi = jax.process_count() > 1
    moves: list[tuple[int, Sharding]] = []
    for i, target in zip(index, targets, strict=True):
        leaf = leaves[i]
        traced = isinstance(leaf, jax.core.Tracer)
        if not traced and _on_target(leaf, target):
            continue
        if misfit(np.shape(leaf), target, rows_only=_rows_only(leaf, multi=multi)) is not None:
            _refuse(batch, sharding, multi=multi)
        if not traced:  # a traced leaf is left as it is
            moves.append((i, target))
    if not moves:
        return batch
    local = [leaves[i] for i, _ in moves]
    for i, _ in moves:  # jax narrows a 64-bit host leaf to 32 bits while x64 is off
        leaf = leaves[i]
        if isinstance(leaf, np.ndarray | np.generic) and leaf.dtype.itemsize == _WIDE:
            check_fits_32_bits(jax.tree_util.keystr(_path_of(batch, i)), leaf)
    shardings = [target for _, target in moves]
    if not multi:
        # What make_array_from_process_local_data does on one process, minus its pytree work.
        placed = jax.device_put(local, shardings)
    else:
        every = jax.tree_util.tree_flatten_with_path(batch)[0]
        paths = [jax.tree_util.keystr(every[i][0]) for i, _ in moves]
        placed = _place_across_processes(local, shardings, paths)
    for (i, _), array in zip(moves, placed, strict=True):
        leaves[i] = array
    return jax.tree.unflatten(treedef, leaves)


_WIDE = 8  # bytes: a 64-bit dtype


def _path_of(batch: PyTree, index: int) -> tuple[Any, ...]:
    """The key path of ``batch``'s leaf number ``index``."""
    return jax.tree_util.tree_flatten_with_path(batch)[0][index][0]
