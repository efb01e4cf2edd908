"""A train step's flat state: its arrays placed once, and the changes made to its objects read back.

:class:`~substrax.spmd.TrainStep` keeps the arrays of ``(model, optimizer)`` as a flat list and
runs every step on it; these helpers put that list where the step runs and take back what a
caller set in the live nnx objects between steps.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from substrax.typing import PyTree


def strong(x: PyTree) -> PyTree:
    """Drop a weak type, so the first step's output matches its input and nothing retraces.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd._step_state import strong
        >>> strong(jnp.asarray(1.0)).weak_type
        False
    """
    if isinstance(x, jax.Array) and getattr(x, "weak_type", False):  # key arrays have none
        return jnp.array(x, dtype=x.dtype)
    return x


def _mesh_of(leaves: list[Any]) -> Mesh | None:
    for leaf in leaves:
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
            return sharding.mesh
    return None


def sharding_mesh(shardings: object) -> Mesh | None:
    """The one mesh the ``NamedSharding`` leaves of a pytree of shardings (a batch's) name, or None.

    Raises:
        ValueError: they name two meshes (one step runs on one).
    """
    leaves = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, Sharding))
    meshes = list(
        dict.fromkeys(
            s.mesh for s in leaves if isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh)
        )
    )
    if len(meshes) > 1:
        raise ValueError(
            f"batch_sharding names {len(meshes)} meshes ({meshes[0]} and {meshes[1]}); a step "
            "runs on one: build every NamedSharding of the batch on the same mesh"
        )
    return meshes[0] if meshes else None


def place_state(
    leaves: list[Any], mesh: Mesh | None, fallback: Mesh | None = None
) -> tuple[list[Any], Mesh | None, Sharding]:
    """Put the state's arrays where the step runs; return them, the mesh and the metrics' sharding.

    The mesh is ``mesh``, else the first one a leaf is sharded over, else ``fallback`` (the
    batch sharding's). On a mesh, a leaf not
    already on all of its devices is replicated onto it; without one, every leaf is committed
    to the first leaf's device (a call on uncommitted inputs would compile a second program).

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd._step_state import place_state
        >>> leaves, mesh, sharding = place_state([jnp.ones(2)], None)
        >>> mesh is None, leaves[0].committed
        (True, True)
    """
    leaves = [strong(x) for x in leaves]
    mesh = next((m for m in (mesh, _mesh_of(leaves), fallback) if m is not None), None)
    if mesh is not None:
        replicated = NamedSharding(mesh, PartitionSpec())
        mesh_devices = set(mesh.devices.flat)
        placed = [
            x
            if isinstance(x, jax.Array) and x.sharding.device_set == mesh_devices
            else jax.device_put(x, replicated)
            for x in leaves
        ]
        return placed, mesh, replicated
    leaves = [jnp.asarray(x) for x in leaves]
    device = next(iter(leaves[0].devices())) if leaves else jax.devices()[0]
    sharding = SingleDeviceSharding(device)
    return jax.device_put(leaves, sharding), None, sharding


def read_back(
    variables: list[nnx.Variable[Any]],
    given: list[Any],
    leaves: list[Any],
    state: Callable[[], PyTree],
) -> None:
    """Take into ``leaves`` the arrays written into ``variables`` since the step wrote ``given``.

    A changed array keeps its leaf's dtype and sharding; one of another shape is refused.
    Whether the objects are live or not, a restore written into them is what the next step
    trains on, never the step's own stale state.

    Raises:
        ValueError: A variable was set to another shape; the message names it in ``state()``
            (the ``(model, optimizer)`` state the leaves are of).
    """
    changed = [i for i, v in enumerate(variables) if v.get_raw_value() is not given[i]]
    if not changed:
        return
    values: list[Any] = []
    for i in changed:
        value, old = variables[i].get_raw_value(), leaves[i]
        if getattr(value, "dtype", None) != old.dtype:
            value = jnp.asarray(value, dtype=old.dtype)
        if jnp.shape(value) != old.shape:
            path = jax.tree_util.tree_leaves_with_path(state())[i][0]
            owner = ("model", "optimizer")[int(getattr(path[0], "key", 0))]
            where = owner + jax.tree_util.keystr(path[1:]).removesuffix(".value")
            msg = (
                f"{where} was set to shape {jnp.shape(value)}, but the step was built for "
                f"{old.shape}; a TrainStep's state keeps its shapes, so build a new TrainStep"
            )
            raise ValueError(msg)
        values.append(strong(value))
    placed = jax.device_put(values, [leaves[i].sharding for i in changed])
    for i, array in zip(changed, placed, strict=True):
        leaves[i] = array
        given[i] = variables[i].get_raw_value()  # taken: read again only once written again
