"""Flax logical-axis annotations turned into shardings of a model's state.

Annotate parameters the flax way (``nnx.with_partitioning(init, ("embed", "mlp"))`` or
``nnx.Param(value, out_sharding=("embed", "mlp"))``), pick rules, and place the model.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, cast

import jax
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from substrax.support import check_array_variables
from substrax.typing import PyTree

from ._errors import ShardingAnnotationError
from ._rules import LogicalAxisRules, RulesLike, as_logical_rules


_NO_RULES = LogicalAxisRules()


def _is_variable(x: object) -> bool:
    return isinstance(x, nnx.Variable)


def _path_str(path: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _mesh_axes_for(
    name: str, rules: LogicalAxisRules, mesh: Mesh | AbstractMesh, path: str, annotation: object
) -> tuple[str, ...]:
    if name in rules:
        target = rules[name]
    elif name in mesh.axis_names:
        target = name
    else:
        known = list(rules)
        msg = (
            f"{path}: logical axis {name!r} (annotation {annotation!r}) is not in the rules "
            f"{known} nor an axis of the mesh {dict(mesh.shape)}; add it to the rules"
        )
        raise ShardingAnnotationError(msg, path=path, annotation=annotation)
    axes = () if target is None else (target,) if isinstance(target, str) else target
    for axis in axes:
        if axis not in mesh.axis_names:
            msg = (
                f"{path}: logical axis {name!r} maps to {axis!r}, which is not an axis of the "
                f"mesh {dict(mesh.shape)}; fix the rules or the mesh"
            )
            raise ShardingAnnotationError(msg, path=path, annotation=annotation)
    return axes


def logical_to_mesh_spec(
    names: tuple[Any, ...] | PartitionSpec,
    rules: RulesLike,
    mesh: Mesh | AbstractMesh,
    *,
    shape: tuple[int, ...] | None = None,
    path: str = "<array>",
) -> PartitionSpec:
    """Turn one annotation (logical names per dimension) into a mesh ``PartitionSpec``.

    A logical name is looked up in ``rules``; a name that is already a mesh axis passes through.
    A mesh axis already used by an earlier dimension is dropped (MaxText's rule), so
    ``fsdp_rules()`` on a kernel annotated ``("embed", "mlp")`` splits only the first dimension.
    ``PartitionSpec.UNCONSTRAINED`` passes through, for ``jax.lax.with_sharding_constraint``
    (a variable annotated so is refused by :func:`state_shardings`: a placement is fixed).

    Raises:
        ShardingAnnotationError: If a name is unknown, maps to an axis the mesh lacks, the
            annotation names more dimensions than ``shape`` has, or a dimension of ``shape`` is
            not divisible by its mesh axes.

    Example:
        >>> from substrax.mesh import create_device_mesh, fsdp_rules, logical_to_mesh_spec
        >>> mesh = create_device_mesh({"data": 1, "model": 2})
        >>> logical_to_mesh_spec(("embed", "mlp"), fsdp_rules(), mesh)
        P('model', None)
    """
    table = as_logical_rules(rules)
    if shape is not None and len(tuple(names)) > len(shape):
        msg = (
            f"{path}: annotation {names!r} names {len(tuple(names))} dimensions but the value "
            f"has shape {shape} (rank {len(shape)}); give at most one name per dimension"
        )
        raise ShardingAnnotationError(msg, path=path, annotation=names)
    used: set[str] = set()
    entries: list[object] = []
    for dim, entry in enumerate(tuple(names)):
        if entry is PartitionSpec.UNCONSTRAINED:  # left to the compiler, as jax's specs allow
            entries.append(entry)
            continue
        logical = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        axes: list[str] = []
        for name in logical:
            for axis in _mesh_axes_for(name, table, mesh, path, names):
                if axis not in used:
                    used.add(axis)
                    axes.append(axis)
        if shape is not None and axes:
            split = math.prod(mesh.shape[a] for a in axes)
            if shape[dim] % split:
                msg = (
                    f"{path}: dimension {dim} of shape {shape} is not divisible by {split} "
                    f"(mesh axes {axes}); change the rules or the layer size"
                )
                raise ShardingAnnotationError(msg, path=path, annotation=names)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*entries)


def _entry_axes(entry: object) -> tuple[object, ...]:
    return (entry,) if isinstance(entry, str) else tuple(cast("tuple[object, ...]", entry))


def _fits(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh | AbstractMesh) -> bool:
    if len(spec) > len(shape):
        return False
    for size, entry in zip(shape, spec, strict=False):
        axes = () if entry is None else _entry_axes(entry)
        if size % math.prod(mesh.shape[cast("str", a)] for a in axes):
            return False
    return True


def _sharding_of(
    variable: nnx.Variable[Any], rules: LogicalAxisRules, mesh: Mesh | AbstractMesh, path: str
) -> NamedSharding:
    annotation = variable.get_metadata().get("out_sharding")
    if annotation is None:
        return NamedSharding(mesh, PartitionSpec())
    shape = tuple(getattr(variable.get_value(), "shape", ()))
    names: Any = annotation
    memory_kind = None
    if isinstance(annotation, NamedSharding):
        # An explicit placement, kept as given on its own mesh (a pipeline stage pinned to some
        # devices); its spec names mesh axes, which pass through no rules.
        names, rules, mesh = annotation.spec, _NO_RULES, annotation.mesh
        memory_kind = annotation.memory_kind
    _check_constrained(names, path)
    if isinstance(variable, nnx.OptState):
        # Optimizer state copies its parameter's annotation; where its shape cannot take it
        # (adafactor's factored statistics, shape-(1,) placeholders) it is replicated.
        spec = logical_to_mesh_spec(names, rules, mesh, path=path)
        if not _fits(spec, shape, mesh):
            spec = PartitionSpec()
    else:
        spec = logical_to_mesh_spec(names, rules, mesh, shape=shape, path=path)
    return NamedSharding(mesh, spec, memory_kind=memory_kind)


def _check_constrained(names: object, path: str) -> None:
    """Refuse an annotation leaving a dimension UNCONSTRAINED: a variable's placement is fixed."""
    if isinstance(names, tuple | PartitionSpec) and PartitionSpec.UNCONSTRAINED in names:
        msg = (
            f"{path}: annotation {names!r} leaves a dimension UNCONSTRAINED, which only "
            "jax.lax.with_sharding_constraint takes; a variable is placed on a fixed sharding: "
            "annotate that dimension None (replicated) or with a logical name"
        )
        raise ShardingAnnotationError(msg, path=path, annotation=names)


def state_shardings(tree: PyTree, mesh: Mesh, rules: RulesLike = ()) -> PyTree:
    """The ``NamedSharding`` of every variable of a model, optimizer or state.

    Each variable's flax ``out_sharding`` annotation is mapped through ``rules``;
    an unannotated variable is replicated. A ``NamedSharding`` annotation is an explicit
    placement and is kept as given, on its own mesh, whatever ``mesh`` is (a pipeline stage
    pinned to some devices, or to axes ``mesh`` lacks); its rank and divisibility are checked
    there. Optimizer state (``nnx.OptState``) copies its parameter's annotation; one whose shape
    cannot take it (adafactor's factored row and column statistics, shape-``(1,)``
    placeholders) is replicated. A variable that holds no array (``optax.masked``'s
    ``MaskedNode``) is returned unchanged, with no sharding.

    Args:
        tree: An nnx graph node (module, optimizer, tuple of them) or an ``nnx.State``.
        mesh: The mesh to place on.
        rules: Logical name to mesh axes.

    Returns:
        An ``nnx.State`` of the same structure whose variables hold ``NamedSharding`` values
        (one leaf per array of ``tree``).

    Raises:
        ShardingAnnotationError: If an annotation does not fit its variable (see
            :func:`logical_to_mesh_spec`), or a ``NamedSharding`` annotation does not fit its
            variable on its own mesh (``mesh`` is not consulted: an axis it lacks is no error).

    Example:
        >>> from flax import nnx
        >>> from substrax.mesh import create_device_mesh, state_shardings
        >>> mesh = create_device_mesh({"model": 2})
        >>> with nnx.use_eager_sharding(False):
        ...     layer = nnx.Linear(2, 4, rngs=nnx.Rngs(0),
        ...                        kernel_init=nnx.with_partitioning(nnx.initializers.ones, (None, "mlp")))
        >>> state_shardings(layer, mesh, {"mlp": "model"})["kernel"].get_value().spec
        P(None, 'model')
    """
    state = tree if isinstance(tree, nnx.State) else nnx.state(tree)
    check_array_variables(state, "state_shardings")
    table = as_logical_rules(rules)

    def one(path: tuple[Any, ...], variable: PyTree) -> PyTree:
        if not isinstance(variable, nnx.Variable):
            return NamedSharding(mesh, PartitionSpec())
        if not jax.tree.leaves(variable.get_raw_value()):  # optax.masked's MaskedNode: no array
            return variable
        return variable.replace(_sharding_of(variable, table, mesh, _path_str(path)))  # pyright: ignore[reportUnknownMemberType]

    return jax.tree_util.tree_map_with_path(one, state, is_leaf=_is_variable)


def _sharding_leaves(shardings: PyTree) -> list[Any]:
    return jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))


def shard_model[N](node: N, mesh: Mesh, rules: RulesLike = ()) -> N:
    """Place every variable of ``node`` on its annotated sharding, in place.

    Args:
        node: A module, an optimizer, or a tuple of them (shared variables are placed once).
        mesh: The mesh to place on.
        rules: Logical name to mesh axes; see :func:`state_shardings`.

    Returns:
        ``node`` itself, its variables now global arrays on ``mesh``.

    Raises:
        ShardingAnnotationError: As :func:`state_shardings`.

    Example:
        >>> from flax import nnx
        >>> from substrax.mesh import create_device_mesh, fsdp_rules, shard_model
        >>> mesh = create_device_mesh({"data": 1, "model": 2})
        >>> with nnx.use_eager_sharding(False):
        ...     layer = nnx.Linear(4, 4, rngs=nnx.Rngs(0),
        ...                        kernel_init=nnx.with_partitioning(nnx.initializers.ones, ("embed", "mlp")))
        >>> shard_model(layer, mesh, fsdp_rules()).kernel.get_value().sharding.spec
        P('model', None)
    """
    state = nnx.state(node)
    check_array_variables(state, "shard_model")
    shardings = state_shardings(state, mesh, rules)
    leaves, treedef = jax.tree.flatten(state)
    placed = jax.device_put(leaves, _sharding_leaves(shardings))
    nnx.update(node, jax.tree.unflatten(treedef, placed))
    return node


def _check_one_device_order(shardings: PyTree, mesh: Mesh) -> None:
    """Refuse a variable pinned by its annotation to devices other than ``mesh``'s, named."""
    ours = [d.id for d in mesh.devices.flat]
    for path, variable in jax.tree_util.tree_flatten_with_path(shardings, is_leaf=_is_variable)[0]:
        if not isinstance(variable, nnx.Variable):
            continue
        sharding = variable.get_value()
        if not (isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh)):
            continue
        theirs = [d.id for d in sharding.mesh.devices.flat]
        if theirs != ours:
            where = _path_str(path)
            msg = (
                f"{where}: its NamedSharding annotation pins it to mesh "
                f"{dict(sharding.mesh.shape)} over devices {theirs}, but create_sharded_model "
                f"builds every variable in one jitted call over the devices of the mesh "
                f"{dict(mesh.shape)}, {ours} in that order: build the model, then place it with "
                "shard_model(model, mesh, rules), which puts each variable on its own mesh; or "
                "annotate it with logical names to follow the mesh"
            )
            annotation = variable.get_metadata().get("out_sharding")
            raise ShardingAnnotationError(msg, path=where, annotation=annotation)


def create_sharded_model[M](factory: Callable[[], M], mesh: Mesh, rules: RulesLike = ()) -> M:
    """Build a model directly on its shardings: no full copy on one device first.

    ``factory`` is traced abstractly to read the annotations, then run under ``jax.jit``
    with the shardings as ``out_shardings``. Eager sharding is off while it runs, so
    annotations may use logical names. The factory should make its own ``nnx.Rngs``.

    Args:
        factory: Builds the model (or a tuple of model and optimizer).
        mesh: The mesh to place on.
        rules: Logical name to mesh axes.

    Returns:
        The model, every variable a global array on its sharding.

    Raises:
        ShardingAnnotationError: As :func:`state_shardings`; and, before anything is built, a
            variable whose ``NamedSharding`` annotation pins it to other devices than
            ``mesh``'s, or to them in another order (one jitted call runs over one ordered list
            of devices; :func:`shard_model` places such a model).

    Example:
        >>> from flax import nnx
        >>> from substrax.mesh import create_device_mesh, create_sharded_model
        >>> mesh = create_device_mesh({"model": 2})
        >>> make = lambda: nnx.Linear(2, 4, rngs=nnx.Rngs(0),
        ...     kernel_init=nnx.with_partitioning(nnx.initializers.ones, (None, "mlp")))
        >>> create_sharded_model(make, mesh, {"mlp": "model"}).kernel.get_value().sharding.spec
        P(None, 'model')
    """

    def build() -> M:
        with nnx.use_eager_sharding(False):
            return factory()

    abstract = nnx.eval_shape(build)
    graphdef, abstract_state = nnx.split(abstract)
    check_array_variables(abstract_state, "create_sharded_model")
    shardings = state_shardings(abstract_state, mesh, rules)
    _check_one_device_order(shardings, mesh)
    treedef = jax.tree.structure(abstract_state)

    @functools.partial(jax.jit, out_shardings=_sharding_leaves(shardings))
    def init() -> list[Any]:
        return jax.tree.leaves(nnx.state(build()))

    return nnx.merge(graphdef, jax.tree.unflatten(treedef, init()))
