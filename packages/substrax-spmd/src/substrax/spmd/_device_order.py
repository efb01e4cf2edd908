"""Shardings over a step's devices in another order, put on the step's own mesh.

jax runs a compiled call over one ordered list of devices: an argument on a mesh that holds the
same devices in another order (``Mesh(np.array(jax.devices()[::-1]), ("data",))`` beside
``create_device_mesh({"data": 8})``, or a topology's own order) is refused at the call with
"incompatible devices". A step takes such a sharding with the same spec on its own mesh.
"""

import math
from typing import Any, TypeGuard, cast

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from substrax.typing import PyTree

from ._errors import BatchPlacementError
from ._leaf_names import leaf_name


def _ids(mesh: Mesh) -> list[int]:
    return [d.id for d in mesh.devices.flat]


def in_other_order(sharding: object, mesh: Mesh) -> TypeGuard[NamedSharding]:
    """Whether ``sharding`` is a ``NamedSharding`` over ``mesh``'s devices in another order.

    Example:
        >>> import jax
        >>> import numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec
        >>> from substrax.spmd._device_order import in_other_order
        >>> mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
        >>> other = Mesh(np.array(jax.devices()[1::-1]), ("data",))
        >>> in_other_order(NamedSharding(other, PartitionSpec()), mesh)
        True
    """
    if not isinstance(sharding, NamedSharding) or sharding.mesh is mesh:  # jax interns meshes
        return False
    if not isinstance(sharding.mesh, Mesh):
        return False
    theirs, ours = _ids(sharding.mesh), _ids(mesh)
    return theirs != ours and sorted(theirs) == sorted(ours)


def spec_axes(spec: PartitionSpec) -> list[str]:
    """The mesh axes ``spec`` names."""
    axes: list[str] = []
    for entry in spec:
        if isinstance(entry, str):
            axes.append(entry)
        elif isinstance(entry, tuple):
            axes.extend(str(a) for a in entry)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return axes


def same_spec_on(sharding: NamedSharding, mesh: Mesh, shape: tuple[int, ...]) -> Sharding | None:
    """``sharding``'s spec on ``mesh``; None where ``mesh`` lacks its axes or cannot split it."""
    if any(axis not in mesh.axis_names for axis in spec_axes(sharding.spec)):
        return None
    if len(sharding.spec) > len(shape):
        return None
    for size, entry in zip(shape, sharding.spec, strict=False):
        axes = spec_axes(PartitionSpec(entry))
        if size % math.prod(mesh.shape[a] for a in axes):
            return None
    return NamedSharding(mesh, sharding.spec, memory_kind=sharding.memory_kind)


def taken_onto(x: jax.Array, mesh: Mesh) -> Sharding:
    """Where an array over ``mesh``'s devices in another order goes: its spec, else replicated."""
    spec = same_spec_on(cast("NamedSharding", x.sharding), mesh, x.shape)
    return spec or NamedSharding(mesh, PartitionSpec())


def batch_leaf_onto(path: tuple[Any, ...], x: jax.Array, mesh: Mesh) -> Sharding:
    """Where a batch array over ``mesh``'s devices in another order goes: its spec on ``mesh``.

    Raises:
        BatchPlacementError: ``mesh`` lacks an axis its spec names, or cannot split it so; the
            message names the leaf and both device orders.
    """
    shard = cast("NamedSharding", x.sharding)
    target = same_spec_on(shard, mesh, x.shape)
    if target is None:
        where = jax.tree_util.keystr(path)
        theirs = cast("Mesh", shard.mesh)
        msg = (
            f"{leaf_name(where)} is on mesh {dict(theirs.shape)} over devices {_ids(theirs)}, "
            f"the step's devices in another order (its mesh {dict(mesh.shape)} holds them as "
            f"{_ids(mesh)}, and a step runs on one order); its spec {shard.spec} cannot be "
            "taken onto the step's mesh (an axis it lacks, or a size it does not divide): "
            "put the batch on the step's mesh (step.mesh), or pass batch_sharding="
        )
        raise BatchPlacementError(msg, path=where, shape=x.shape, spec=shard.spec)
    return target


def batch_on_mesh(sharding: Sharding | PyTree, mesh: Mesh) -> Sharding | PyTree:
    """A batch-sharding prefix, each sharding over ``mesh``'s devices in another order on ``mesh``.

    Each keeps its spec (and so splits the same dimensions over the same axis names).

    Raises:
        ValueError: Its spec names an axis ``mesh`` lacks; the message names both device orders.
    """

    def one(path: tuple[Any, ...], shard: object) -> object:
        if not in_other_order(shard, mesh):
            return shard
        missing = [a for a in spec_axes(shard.spec) if a not in mesh.axis_names]
        if missing:
            theirs = cast("Mesh", shard.mesh)
            msg = (
                f"batch_sharding{jax.tree_util.keystr(path)} is on mesh {dict(theirs.shape)} "
                f"over devices {_ids(theirs)}, the step's mesh {dict(mesh.shape)} holds "
                f"them in the order {_ids(mesh)}, and a step runs on one order; its spec "
                f"{shard.spec} names axes {missing} the step's mesh lacks, so it cannot be "
                "taken onto it: build the batch sharding on the step's mesh (step.mesh)"
            )
            raise ValueError(msg)
        return NamedSharding(mesh, shard.spec, memory_kind=shard.memory_kind)

    return jax.tree_util.tree_map_with_path(
        one, sharding, is_leaf=lambda x: isinstance(x, Sharding)
    )
