"""A train step's flat state: its arrays placed once, and the changes made to its objects read back.

:class:`~substrax.spmd.TrainStep` keeps the arrays of ``(model, optimizer)`` as a flat list and
runs every step on it; these helpers put that list where the step runs and take back what a
caller set in the live nnx objects between steps.
"""

import logging
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from substrax.typing import PyTree

from ._device_order import in_other_order, taken_onto
from ._live_graph import describe
from ._state_placement import put_keys_as_data


_logger = logging.getLogger(__name__)


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


def mesh_of(leaves: list[Any]) -> Mesh | None:
    """The mesh of the first leaf sharded by a ``NamedSharding``, or None."""
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


def _buffer(x: Any) -> object:  # noqa: ANN401  (any leaf)
    """What identifies the memory ``x`` holds: two leaves alike here share one buffer."""
    if not isinstance(x, jax.Array):
        return id(x)
    try:
        shard = x.addressable_data(0)
        return (shard.device, shard.unsafe_buffer_pointer())
    except (RuntimeError, NotImplementedError, ValueError, IndexError):  # no pointer here
        return id(x)


def own_buffers(leaves: list[Any], fresh: list[int] | None = None) -> None:
    """Give each leaf a buffer of its own, copying one that another leaf already holds.

    Two variables set to one array (``z = jnp.ones(2)``, ``a = nnx.Param(z)``, ``b =
    nnx.Param(z)``) would hand one buffer to a donating step twice, which XLA refuses (and on
    a mesh the failed call leaves the devices waiting). The leaves at ``fresh`` (all when
    None) are the ones copied when they share; the others keep their buffers.
    """
    fresh = list(range(len(leaves))) if fresh is None else fresh
    kept = set(range(len(leaves))) - set(fresh)
    seen = {_buffer(leaves[i]) for i in kept if isinstance(leaves[i], jax.Array)}
    for i in fresh:
        x = leaves[i]
        if not isinstance(x, jax.Array):
            continue
        key = _buffer(x)
        if key in seen:
            leaves[i] = jax.device_put(x, x.sharding, may_alias=False)
            key = _buffer(leaves[i])
        seen.add(key)


def _name(path: tuple[Any, ...]) -> str:
    """``model.up.kernel`` for a leaf's key path in the state of ``(model, optimizer)``."""
    keys = path[:-1] if path and getattr(path[-1], "name", None) == "value" else path
    return describe(keys)


def _is_split(sharding: object) -> bool:
    return isinstance(sharding, NamedSharding) and not sharding.is_fully_replicated


def _warn_unsplit(before: list[Any], after: list[Any], paths: list[tuple[Any, ...]]) -> None:
    """Warn of leaves the placement replicated though split, or not split as their parameter.

    An optimizer-state leaf follows a parameter when its path ends with the parameter's path
    in the model (``optimizer.opt_state[0].mu.up.kernel`` and ``model.up.kernel``) and its
    shape is the parameter's.
    """
    lost = [
        _name(p)
        for p, old, new in zip(paths, before, after, strict=True)
        if _is_split(getattr(old, "sharding", None)) and not _is_split(new.sharding)
    ]
    params = {tuple(p[1:]): x for p, x in zip(paths, after, strict=True) if _key0(p) == 0}
    for path, x in zip(paths, after, strict=True):
        if _key0(path) != 1 or not isinstance(x, jax.Array):
            continue
        param = next((params[path[i:]] for i in range(1, len(path)) if path[i:] in params), None)
        if (
            param is not None
            and param.shape == x.shape
            and _is_split(param.sharding)
            and not x.sharding.is_equivalent_to(param.sharding, x.ndim)
        ):
            lost.append(_name(path))
    if lost:
        _logger.warning(
            "TrainStep replicates %d state leaves that were split, or that the parameter they "
            "belong to splits (%s): each device holds them whole. Shard the model and its "
            "optimizer together (shard_model(model, mesh, rules) after building the optimizer, "
            "or create_sharded_model), and give mesh= the mesh the state is on",
            len(lost),
            ", ".join(lost[:5]) + (", ..." if len(lost) > 5 else ""),  # noqa: PLR2004
        )


def _key0(path: tuple[Any, ...]) -> object:
    return getattr(path[0], "key", None) if path else None


def _moves_onto(leaves: list[Any], mesh: Mesh) -> tuple[list[int], list[Sharding]]:
    """The leaves not on ``mesh`` and where each goes: replicated, or by its spec.

    A leaf split over ``mesh``'s devices in another order (a mesh built over them in another
    order) keeps its spec on ``mesh`` where ``mesh`` can split it so; jax runs one order.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    devices = set(mesh.devices.flat)
    moves: list[int] = []
    targets: list[Sharding] = []
    for i, x in enumerate(leaves):
        if not isinstance(x, jax.Array):
            moves.append(i)
            targets.append(replicated)
        elif in_other_order(x.sharding, mesh):
            moves.append(i)
            targets.append(taken_onto(x, mesh))
        elif x.sharding.device_set != devices:
            moves.append(i)
            targets.append(replicated)
    return moves, targets


def reordered_onto(state: PyTree, mesh: Mesh) -> PyTree:
    """``state`` with each array split over ``mesh``'s devices in another order put on ``mesh``.

    It keeps its spec where ``mesh`` can split it so, and is replicated where not (as
    :func:`place_state` puts it); ``state`` itself is returned when no array needs it.
    """
    leaves, treedef = jax.tree.flatten(state)
    moves = [
        i
        for i, x in enumerate(leaves)
        if isinstance(x, jax.Array) and in_other_order(x.sharding, mesh)
    ]
    if not moves:
        return state
    targets = [taken_onto(leaves[i], mesh) for i in moves]
    for i, array in zip(moves, put_keys_as_data([leaves[i] for i in moves], targets), strict=True):
        leaves[i] = array
    return jax.tree.unflatten(treedef, leaves)


def place_state(
    leaves: list[Any],
    mesh: Mesh | None,
    fallback: Mesh | None = None,
    *,
    paths: list[tuple[Any, ...]] | None = None,
) -> tuple[list[Any], Mesh | None, Sharding]:
    """Put the state's arrays where the step runs; return them, the mesh and the metrics' sharding.

    The mesh is ``mesh``, else the first one a leaf is sharded over, else ``fallback`` (the
    batch sharding's). On a mesh, a leaf split over its devices in another order takes its
    spec on the mesh (replicated where the mesh lacks its axes), and a leaf not
    already on all of its devices is replicated onto it (a typed PRNG key as its key data, so
    that a key on one process's device reaches a mesh over several processes); without one,
    every leaf is committed to the first leaf's device (a call on uncommitted inputs would
    compile a second program). Every leaf gets a buffer of its own (:func:`own_buffers`).

    Given the leaves' key ``paths``, a WARNING (on this module's logger) names the leaves that
    were split by a ``NamedSharding`` and come out replicated (a ``mesh`` over other devices
    than the state's), and the optimizer-state leaves not split as their parameter is (an
    optimizer built before ``shard_model(model, ...)``).

    Raises:
        ValueError: ``fallback`` (the batch's mesh) spans other devices than the mesh chosen.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd._step_state import place_state
        >>> leaves, mesh, sharding = place_state([jnp.ones(2)], None)
        >>> mesh is None, leaves[0].committed
        (True, True)
    """
    given = leaves = [strong(x) for x in leaves]
    mesh = next((m for m in (mesh, mesh_of(leaves), fallback) if m is not None), None)
    if mesh is not None and fallback is not None:
        ours, theirs = set(mesh.devices.flat), set(fallback.devices.flat)
        if ours != theirs:
            msg = (
                f"batch_sharding's mesh spans devices {sorted(d.id for d in theirs)} but the "
                f"step's state is on mesh {dict(mesh.shape)} over devices "
                f"{sorted(d.id for d in ours)}; one step runs on one set of devices: build the "
                "batch sharding on the state's mesh, or pass that mesh as mesh="
            )
            raise ValueError(msg)
    if mesh is not None:
        replicated = NamedSharding(mesh, PartitionSpec())
        moves, targets = _moves_onto(leaves, mesh)
        placed = put_keys_as_data([leaves[i] for i in moves], targets)
        leaves = list(leaves)
        for i, array in zip(moves, placed, strict=True):
            leaves[i] = array
        if paths is not None:
            _warn_unsplit(given, leaves, paths)
        own_buffers(leaves)
        return leaves, mesh, replicated
    leaves = [jnp.asarray(x) for x in leaves]
    device = next(iter(leaves[0].devices())) if leaves else jax.devices()[0]
    sharding = SingleDeviceSharding(device)
    leaves = jax.device_put(leaves, sharding)
    own_buffers(leaves)
    return leaves, None, sharding


class StateVariables:
    """The live Variables of a flat state, each with the run of leaves its value flattens to.

    A Variable may hold one array or a pytree of them (``nnx.Variable((a, b))``); its leaves
    follow one another in the flat state. A Variable holding no array (optax.masked's
    ``MaskedNode``) has none and is not tracked, nor is a leaf that is no Variable's.

    Args:
        state: The ``nnx.State`` of ``(model, optimizer)`` that the flat leaves are of.
    """

    def __init__(self, state: PyTree) -> None:
        self._variables: list[nnx.Variable[Any]] = []
        self._spans: list[tuple[int, int, Any]] = []  # (first leaf, leaf count, value treedef)
        self._paths: list[Any] = []  # each Variable's key path in ``state``
        self._given: list[Any] = []  # the raw value the step last wrote into each
        start = 0
        items = jax.tree_util.tree_leaves_with_path(
            state, is_leaf=lambda x: isinstance(x, nnx.Variable)
        )
        for path, item in items:
            count = len(jax.tree.leaves(item))
            if isinstance(item, nnx.Variable) and count:
                self._variables.append(item)  # pyright: ignore[reportUnknownArgumentType]
                self._spans.append((start, count, jax.tree.structure(item.get_raw_value())))
                self._paths.append(path)
            start += count

    @property
    def variables(self) -> list[nnx.Variable[Any]]:
        """The Variables tracked, in the order of their leaves."""
        return list(self._variables)

    def write_back(self, leaves: list[Any]) -> None:
        """Set every Variable to its current leaves, and remember what was set."""
        self._given = []
        for variable, (start, count, treedef) in zip(self._variables, self._spans, strict=True):
            variable.set_raw_value(jax.tree.unflatten(treedef, leaves[start : start + count]))
            self._given.append(variable.get_raw_value())

    def read_back(self, leaves: list[Any]) -> None:
        """Take into ``leaves`` the arrays written into the Variables since :meth:`write_back`.

        A changed array keeps its leaf's dtype and sharding (and gets a buffer of its own); one
        of another shape, or a value of another structure, is refused. Whether the objects are
        live or not, a restore written into them is what the next step trains on, never the
        step's own stale state.

        Raises:
            ValueError: A variable was set to another shape or structure; the message names it
                (``model.kernel``, ``optimizer.opt_state[0].mu['kernel']``).
        """
        changed = [
            k for k, v in enumerate(self._variables) if v.get_raw_value() is not self._given[k]
        ]
        if not changed:
            return
        index: list[int] = []
        values: list[Any] = []
        for k in changed:
            start, _, treedef = self._spans[k]
            flat, structure = jax.tree_util.tree_flatten_with_path(
                self._variables[k].get_raw_value()
            )
            if structure != treedef:
                self._refuse(k, (), f"a value of structure {structure}", f"{treedef}")
            for j, (sub, value) in enumerate(flat):
                old = leaves[start + j]
                if getattr(value, "dtype", None) != old.dtype:
                    value = jnp.asarray(value, dtype=old.dtype)  # noqa: PLW2901
                if jnp.shape(value) != old.shape:
                    self._refuse(k, sub, f"shape {jnp.shape(value)}", f"{old.shape}")
                index.append(start + j)
                values.append(strong(value))
        placed = put_keys_as_data(values, [leaves[i].sharding for i in index])
        for i, array in zip(index, placed, strict=True):
            leaves[i] = array
        own_buffers(leaves, index)
        for k in changed:  # taken: read again only once written again
            self._given[k] = self._variables[k].get_raw_value()

    def _refuse(self, k: int, sub: tuple[Any, ...], got: str, built: str) -> None:
        path = self._paths[k]
        owner = ("model", "optimizer")[int(getattr(path[0], "key", 0))]
        where = owner + jax.tree_util.keystr((*path[1:], *sub))
        msg = (
            f"{where} was set to {got}, but the step was built for {built}; a TrainStep's "
            "state keeps its shapes, so build a new TrainStep"
        )
        raise ValueError(msg)
