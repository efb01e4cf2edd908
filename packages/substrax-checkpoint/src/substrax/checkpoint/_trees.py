"""PyTree helpers: leaf paths, stored dtypes, host leaves, and items as orbax saves them."""

import functools
from collections.abc import Mapping
from typing import Any, Literal

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from substrax.typing import PyTree

from ._extra import check_text
from ._metadata import HOST_LEAVES, SHAPES
from ._write_errors import CheckpointLeafNameCollisionError


_PYTHON_METADATA = (ocp.metadata.ScalarMetadata, ocp.metadata.StringMetadata)

type HostKind = Literal["ndarray", "numpy_scalar"]
"""How a host leaf was saved: a NumPy array, or a NumPy scalar (stored as a 0-d array)."""


def _key_name(entry: object) -> str:
    """One entry of a jax key path as text: a dict key, an attribute or an index."""
    for attribute in ("key", "name", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def leaf_path(path: tuple[object, ...], separator: str = "/") -> str:
    """Join a jax key path: ``a/b/0`` (dtype records, messages), or with ``.`` as orbax stores it."""
    return separator.join(_key_name(entry) for entry in path)


def flat_leaves(tree: PyTree) -> list[tuple[str, Any]]:
    """Every leaf of ``tree`` with its joined path, in flattening order."""
    pairs, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(leaf_path(path), leaf) for path, leaf in pairs]


def _empty(node: object) -> bool:
    """Whether ``node`` is None or a container without children: a place without a leaf."""
    if node is None:
        return True
    if isinstance(node, (dict, list, tuple)):  # the common containers, without flattening
        return not node
    if hasattr(node, "shape"):  # an array: a leaf
        return False
    structure = jax.tree_util.tree_structure(node)
    return structure.num_leaves == 0 and structure.num_nodes == 1


def empty_nodes(tree: PyTree) -> set[str]:
    """The joined paths of ``tree``'s None values and empty containers, which hold no leaf.

    Example:
        >>> from substrax.checkpoint._trees import empty_nodes
        >>> sorted(empty_nodes({"w": 1.0, "ema": None, "extra": {"a": {}, "b": [()]}}))
        ['ema', 'extra/a', 'extra/b/0']
    """
    pairs, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_empty)
    return {leaf_path(path) for path, node in pairs if _empty(node)}


def leaf_dtype(leaf: object) -> str | None:
    """The dtype a leaf is stored with (``key<fry>`` for a typed PRNG key), or None for plain Python.

    Records written before keys had their own name hold a key's data dtype, ``uint32``.
    """
    dtype = getattr(leaf, "dtype", None)
    python = isinstance(leaf, (bool, int, float, str, *_PYTHON_METADATA))
    if dtype is None or (python and not isinstance(leaf, np.generic)):
        return None
    if isinstance(dtype, np.dtype):  # every dtype but jax's extended ones (keys): no jax call
        return dtype.name
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return str(dtype)  # key<fry>: a key's own, told apart from its uint32 key data
    return np.dtype(dtype).name


@functools.cache
def _storable(dtype: str) -> bool:
    """Whether TensorStore, which writes orbax's arrays, has the dtype (it lacks ``uint4``)."""
    try:
        ts.dtype(dtype)
    except ValueError:
        return False
    return True


def check_stored_names(item: str, paths: list[tuple[object, ...]]) -> None:
    """Refuse (``CheckpointLeafNameCollisionError``) two leaves stored or recorded under one name.

    Orbax names a leaf by its keys joined with ``.``, TensorStore keys its array by that name
    less one trailing ``/`` (``{"a/": x, "a": y}``: one array), the store's dtype, host and shape
    records by its keys joined with ``/`` (``{"a/b": x, "a": {"b": y}}``: two of record ``a/b``).
    A path that is not UTF-8 text (a lone surrogate in a key) is refused too (``ValueError``).
    """
    stored: dict[str, tuple[object, ...]] = {}
    recorded: dict[str, tuple[object, ...]] = {}
    for path in paths:
        name = leaf_path(path, ".").removesuffix("/")  # "a/" is the array "a" to TensorStore
        if not name.isascii():  # orbax writes the name into its JSON metadata
            check_text(f"the path of an item {item!r} leaf", leaf_path(path))
        first = stored.setdefault(name, path)
        if first is not path:
            raise CheckpointLeafNameCollisionError(
                item=item, paths=(leaf_path(first), leaf_path(path)), stored_name=name
            )
        first = recorded.setdefault(record := leaf_path(path), path)
        if first is not path:  # told apart by their keys, as jax.tree_util.keystr shows them
            shown = (jax.tree_util.keystr(first), jax.tree_util.keystr(path))
            raise CheckpointLeafNameCollisionError(item=item, paths=shown, stored_name=record)


def dtype_record(tree: PyTree) -> dict[str, str]:
    """``{leaf_path: dtype}`` for every leaf of ``tree`` that has a dtype."""
    return {path: dtype for path, leaf in flat_leaves(tree) if (dtype := leaf_dtype(leaf))}


def host_kind(leaf: object) -> HostKind | None:
    """How ``leaf`` is kept on the host, or None for a ``jax.Array`` or a plain Python value."""
    if isinstance(leaf, np.ndarray):
        return "ndarray"
    if isinstance(leaf, np.generic) and leaf.dtype.kind in "biufc":
        return "numpy_scalar"
    return None


def host_record(tree: PyTree) -> dict[str, HostKind]:
    """``{leaf_path: kind}`` for every NumPy leaf of ``tree``."""
    return {path: kind for path, leaf in flat_leaves(tree) if (kind := host_kind(leaf))}


def _kind(leaf: object) -> str:
    """What a leaf is, as a multi-process save compares it (its value may differ)."""
    if isinstance(leaf, jax.Array):  # a global one's dtype and shape too: one array, all write
        where = "host-local" if leaf.is_fully_addressable else "global"
        return f"{where} jax.Array {leaf.dtype}{list(leaf.shape)}"
    if isinstance(leaf, np.ndarray | np.generic):
        return "NumPy array"
    if isinstance(leaf, bool | int | float | complex):
        return "Python scalar"
    return f"Python {type(leaf).__name__}"


def leaf_kinds(items: Mapping[str, PyTree]) -> dict[str, str]:
    """``{item: "item", "item/leaf/path": kind}``: the shape of a save that every process shares."""
    kinds: dict[str, str] = {}
    for name, tree in items.items():
        kinds[name] = "item"
        kinds.update((f"{name}/{path}", _kind(leaf)) for path, leaf in flat_leaves(tree))
    return kinds


def _too_large(leaf: object) -> bool:
    return type(leaf) is int and not -(2**63) <= leaf < 2**64


def for_saving(items: Mapping[str, PyTree]) -> tuple[dict[str, PyTree], dict[str, Any]]:
    """The items as orbax saves them, and the JSON of the step's ``dtypes`` item, in one pass.

    NumPy scalars become 0-d arrays. The JSON is each item's ``dtype_record`` plus, under
    ``HOST_LEAVES``, its ``host_record``, and under ``SHAPES`` its leaves' shapes. A Python int
    that no 64-bit integer holds, an empty array, a dtype TensorStore lacks and two leaves of one
    stored name are refused here, not inside orbax's write.
    """
    saved: dict[str, PyTree] = {}
    dtypes: dict[str, dict[str, str]] = {}
    host: dict[str, dict[str, HostKind]] = {}
    shapes: dict[str, dict[str, list[int]]] = {}  # every leaf with a dtype has its shape
    for name, tree in items.items():
        pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
        check_stored_names(name, [key_path for key_path, _ in pairs])
        leaves: list[object] = []
        dtypes[name] = {}
        kinds: dict[str, HostKind] = {}
        for key_path, leaf in pairs:
            dtype, kind = leaf_dtype(leaf), host_kind(leaf)
            if isinstance(leaf, str) and not leaf.isascii():
                check_text(f"item {name!r} leaf {leaf_path(key_path)!r}", leaf)
            if dtype is None and kind is None and not _too_large(leaf):
                leaves.append(leaf)
                continue
            path = leaf_path(key_path)
            if _too_large(leaf):
                raise ValueError(
                    f"item {name!r} leaf {path!r} is the Python int {leaf}, which no 64-bit "
                    "integer holds; save it as a string (str(value)) and convert it back after "
                    "restoring"
                )
            if isinstance(leaf, jax.Array) and leaf.is_deleted():
                raise ValueError(
                    f"item {name!r} leaf {path!r} is a jax.Array that was deleted (donated to a "
                    "jitted step, or deleted by hand); save the arrays the step returned, or "
                    "save before the step that donates them"
                )
            if getattr(leaf, "size", None) == 0:
                raise ValueError(
                    f"item {name!r} leaf {path!r} is an empty array (shape "
                    f"{tuple(getattr(leaf, 'shape', ()))}): orbax cannot store zero-size "
                    "arrays; leave the leaf out, or save a placeholder and its length"
                )
            if dtype is not None and not is_key_name(dtype) and not _storable(dtype):
                raise TypeError(
                    f"item {name!r} leaf {path!r} has dtype {dtype}, which TensorStore (orbax's "
                    "array writer) cannot store; save it widened or as its bits (e.g. "
                    "leaf.astype(jnp.uint8)) and convert it back after restoring"
                )
            if dtype is not None:
                dtypes[name][path] = dtype
                shapes.setdefault(name, {})[path] = [int(d) for d in np.shape(leaf)]
            if kind is not None:
                kinds[path] = kind
            leaves.append(np.asarray(leaf) if kind == "numpy_scalar" else leaf)
        if kinds:
            host[name] = kinds
        scalars = "numpy_scalar" in kinds.values()
        saved[name] = jax.tree_util.tree_unflatten(treedef, leaves) if scalars else tree
    return saved, {**dtypes, HOST_LEAVES: host, SHAPES: shapes}


def scalars_as_arrays(tree: PyTree) -> PyTree:
    """``tree`` with every NumPy scalar as a 0-d array of its dtype (orbax would lose the dtype)."""

    def convert(leaf: object) -> object:
        return np.asarray(leaf) if host_kind(leaf) == "numpy_scalar" else leaf

    return jax.tree.map(convert, tree)


def as_saved(tree: PyTree, kinds: Mapping[str, str]) -> PyTree:
    """``tree`` with the 0-d arrays that ``kinds`` names as NumPy scalars turned back into them."""
    if "numpy_scalar" not in kinds.values():
        return tree
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [
        leaf[()]
        if isinstance(leaf, np.ndarray) and kinds.get(leaf_path(path)) == "numpy_scalar"
        else leaf
        for path, leaf in pairs
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _replicated(leaf: jax.Array, sharding: jax.sharding.NamedSharding) -> jax.Array:
    """A global array replicated on ``sharding`` (``jax.devices()`` in order) holding ``leaf``."""
    here = jax.process_index()
    local = [device for device in jax.devices() if device.process_index == here]
    shards = [jax.device_put(leaf, device) for device in local]
    return jax.make_array_from_single_device_arrays(leaf.shape, sharding, shards)


def globalize_host_local(items: Mapping[str, PyTree]) -> dict[str, PyTree]:
    """Make every host-local ``jax.Array`` of a multi-process save a replicated global array.

    Orbax writes only global arrays when several processes save together; a host-local array
    is stored as process 0's value, as NumPy leaves are. Other leaves pass through.
    """
    if jax.process_count() == 1:
        return dict(items)
    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.asarray(jax.devices()), ("processes",)), jax.sharding.PartitionSpec()
    )

    def convert(leaf: object) -> object:
        if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
            return _replicated(leaf, sharding)
        return leaf

    return {name: jax.tree.map(convert, tree) for name, tree in items.items()}


def is_key(dtype: object) -> bool:
    """Whether ``dtype`` is a typed PRNG key's (``key<fry>``...)."""
    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))  # type: ignore[arg-type]
    except TypeError:
        return False


def is_key_name(dtype: str) -> bool:
    """Whether a recorded dtype (``leaf_dtype``) is a typed PRNG key's (``key<fry>``...)."""
    return dtype.startswith("key<")


def default_sharding() -> jax.sharding.SingleDeviceSharding:
    """This process's default device: ``jax.default_device``'s where set, else its first local one.

    On several processes each process names its own device, so an array placed there is the
    whole array on every process (a host-local array), as a restore without a template gives.
    """
    chosen: object = jax.config.jax_default_device
    if isinstance(chosen, str):  # a platform: "cpu"
        return jax.sharding.SingleDeviceSharding(jax.local_devices(backend=chosen)[0])
    local = jax.local_devices()
    return jax.sharding.SingleDeviceSharding(next((d for d in local if d == chosen), local[0]))
