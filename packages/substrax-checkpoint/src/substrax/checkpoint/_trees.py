"""PyTree helpers: leaf paths, stored dtypes, host leaves, and items as orbax saves them."""

from collections.abc import Mapping
from typing import Any, Literal

import jax
import numpy as np
import orbax.checkpoint as ocp

from substrax.typing import PyTree

from ._errors import CheckpointLeafNameCollisionError
from ._formats import HOST_LEAVES


_PYTHON_METADATA = (ocp.metadata.ScalarMetadata, ocp.metadata.StringMetadata)
WRAPPER = "tree"
"""Every item is stored as ``{"tree": item}`` so that a bare array (a lone PRNG key) is a PyTree."""

type HostKind = Literal["ndarray", "numpy_scalar"]
"""How a host leaf was saved: a NumPy array, or a NumPy scalar (stored as a 0-d array)."""


def key_name(entry: object) -> str:
    """One entry of a jax key path as text: a dict key, an attribute or an index.

    Example:
        >>> import jax
        >>> from substrax.checkpoint._trees import key_name
        >>> key_name(jax.tree_util.SequenceKey(2))
        '2'
    """
    for attribute in ("key", "name", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def leaf_path(path: tuple[object, ...]) -> str:
    """Join a jax key path into the ``a/b/0`` form used in dtype records and messages.

    Example:
        >>> import jax
        >>> from substrax.checkpoint._trees import leaf_path
        >>> leaf_path((jax.tree_util.DictKey("kernel"), jax.tree_util.GetAttrKey("value")))
        'kernel/value'
    """
    return "/".join(key_name(entry) for entry in path)


def flat_leaves(tree: PyTree) -> list[tuple[str, Any]]:
    """Every leaf of ``tree`` with its joined path, in flattening order.

    Example:
        >>> from substrax.checkpoint._trees import flat_leaves
        >>> flat_leaves({"a": 1, "b": [2]})
        [('a', 1), ('b/0', 2)]
    """
    pairs, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(leaf_path(path), leaf) for path, leaf in pairs]


def leaf_dtype(leaf: object) -> str | None:
    """The dtype a leaf is stored with (a typed PRNG key's key data), or None for plain Python."""
    dtype = getattr(leaf, "dtype", None)
    python = isinstance(leaf, (bool, int, float, str, *_PYTHON_METADATA))
    if dtype is None or (python and not isinstance(leaf, np.generic)):
        return None
    if isinstance(dtype, np.dtype):  # every dtype but jax's extended ones (keys): no jax call
        return dtype.name
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return "uint32"
    return np.dtype(dtype).name


def stored_name(path: tuple[object, ...]) -> str:
    """The name orbax stores a leaf under in its item: its keys joined with ``.``.

    Example:
        >>> import jax
        >>> from substrax.checkpoint._trees import stored_name
        >>> stored_name((jax.tree_util.DictKey("x"), jax.tree_util.SequenceKey(0)))
        'x.0'
    """
    return ".".join(key_name(entry) for entry in path)


def check_stored_names(item: str, paths: list[tuple[object, ...]]) -> None:
    """Refuse two leaves of ``item`` that orbax would store under one name.

    Orbax writes each leaf under its keys joined with ``.``; two leaves of one name overwrite
    each other on disk, and one restores in place of the other. Raises
    ``CheckpointLeafNameCollisionError`` naming both leaves' paths.

    Example:
        >>> import jax
        >>> from substrax.checkpoint._trees import check_stored_names
        >>> pairs, _ = jax.tree_util.tree_flatten_with_path({"a.b": 1, "a": {"b": 2}})
        >>> check_stored_names("model", [path for path, _ in pairs])
        Traceback (most recent call last):
        ...
        substrax.checkpoint.CheckpointLeafNameCollisionError: item 'model' has two leaves, 'a/b' and 'a.b', ...
    """
    seen: dict[str, tuple[object, ...]] = {}
    for path in paths:
        name = stored_name(path)
        first = seen.setdefault(name, path)
        if first is not path:
            raise CheckpointLeafNameCollisionError(
                item=item, paths=(leaf_path(first), leaf_path(path)), stored_name=name
            )


def dtype_record(items: Mapping[str, PyTree]) -> dict[str, dict[str, str]]:
    """``{item: {leaf_path: dtype}}`` for every leaf that has a dtype.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._trees import dtype_record
        >>> dtype_record({"model": {"w": np.zeros(2, np.float32), "n": 3}})
        {'model': {'w': 'float32'}}
    """
    record: dict[str, dict[str, str]] = {}
    for name, tree in items.items():
        record[name] = {
            path: dtype for path, leaf in flat_leaves(tree) if (dtype := leaf_dtype(leaf))
        }
    return record


def host_kind(leaf: object) -> HostKind | None:
    """How ``leaf`` is kept on the host, or None for a ``jax.Array`` or a plain Python value.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._trees import host_kind
        >>> host_kind(np.zeros(2)), host_kind(np.int64(3)), host_kind(3)
        ('ndarray', 'numpy_scalar', None)
    """
    if isinstance(leaf, np.ndarray):
        return "ndarray"
    if isinstance(leaf, np.generic) and leaf.dtype.kind in "biufc":
        return "numpy_scalar"
    return None


def host_record(tree: PyTree) -> dict[str, HostKind]:
    """``{leaf_path: kind}`` for every NumPy leaf of ``tree``.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._trees import host_record
        >>> host_record({"order": np.arange(3), "seed": np.uint64(7), "position": 4})
        {'order': 'ndarray', 'seed': 'numpy_scalar'}
    """
    return {path: kind for path, leaf in flat_leaves(tree) if (kind := host_kind(leaf))}


def _too_large(leaf: object) -> bool:
    return type(leaf) is int and not -(2**63) <= leaf < 2**64


def for_saving(items: Mapping[str, PyTree]) -> tuple[dict[str, PyTree], dict[str, Any]]:
    """The items as orbax saves them, and the JSON of the step's ``dtypes`` item, in one pass.

    NumPy scalars become 0-d arrays (see ``scalars_as_arrays``). The JSON is ``dtype_record``
    plus, under ``HOST_LEAVES`` (a name no item can have), ``{item: {leaf_path: kind}}`` for the
    NumPy leaves: they restore without a template as NumPy values of their stored dtypes,
    whatever jax's x64 setting. A record without that key (written before it existed) restores
    them as ``jax.Array`` as it did then. A Python int that no 64-bit integer holds, and an
    empty (zero-size) array, are refused here, naming their item and leaf, rather than failing
    inside orbax's (background) write; so are two leaves that orbax would store under one name
    (``CheckpointLeafNameCollisionError``, see :func:`check_stored_names`).

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._trees import for_saving
        >>> items, record = for_saving({"data_iterator": {"order": np.arange(2), "seed": np.int8(3)}})
        >>> record
        {'data_iterator': {'order': 'int64', 'seed': 'int8'}, 'host_leaves': {'data_iterator': {'order': 'ndarray', 'seed': 'numpy_scalar'}}}
        >>> items["data_iterator"]["seed"].shape
        ()
        >>> for_saving({"data_iterator": {"position": 2**70}})
        Traceback (most recent call last):
        ...
        ValueError: item 'data_iterator' leaf 'position' is the Python int 1180591620717411303424, which no 64-bit integer holds; save it as a string (str(value)) and convert it back after restoring
        >>> for_saving({"model": {"mask": np.zeros((0, 3))}})
        Traceback (most recent call last):
        ...
        ValueError: item 'model' leaf 'mask' is an empty array (shape (0, 3)): orbax cannot store zero-size arrays; ...
    """
    saved: dict[str, PyTree] = {}
    dtypes: dict[str, dict[str, str]] = {}
    host: dict[str, dict[str, HostKind]] = {}
    for name, tree in items.items():
        pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
        check_stored_names(name, [key_path for key_path, _ in pairs])
        leaves: list[object] = []
        dtypes[name] = {}
        kinds: dict[str, HostKind] = {}
        for key_path, leaf in pairs:
            dtype, kind = leaf_dtype(leaf), host_kind(leaf)
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
            if getattr(leaf, "size", None) == 0:
                raise ValueError(
                    f"item {name!r} leaf {path!r} is an empty array (shape "
                    f"{tuple(getattr(leaf, 'shape', ()))}): orbax cannot store zero-size "
                    "arrays; leave the leaf out, or save a placeholder and its length"
                )
            if dtype is not None:
                dtypes[name][path] = dtype
            if kind is not None:
                kinds[path] = kind
            leaves.append(np.asarray(leaf) if kind == "numpy_scalar" else leaf)
        if kinds:
            host[name] = kinds
        scalars = "numpy_scalar" in kinds.values()
        saved[name] = jax.tree_util.tree_unflatten(treedef, leaves) if scalars else tree
    return saved, {**dtypes, HOST_LEAVES: host}


def scalars_as_arrays(tree: PyTree) -> PyTree:
    """``tree`` with every NumPy scalar as a 0-d array of its dtype.

    Orbax saves a NumPy scalar as a Python number (or, for ``np.bool_``, not at all); a 0-d
    array keeps its dtype, and ``as_saved`` turns it back into the scalar.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._trees import scalars_as_arrays
        >>> scalars_as_arrays({"seed": np.uint64(7)})["seed"].shape
        ()
    """

    def convert(leaf: object) -> object:
        return np.asarray(leaf) if host_kind(leaf) == "numpy_scalar" else leaf

    return jax.tree.map(convert, tree)


def as_saved(tree: PyTree, kinds: Mapping[str, str]) -> PyTree:
    """``tree`` with the 0-d arrays that ``kinds`` names as NumPy scalars turned back into them.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._trees import as_saved
        >>> as_saved({"seed": np.asarray(np.uint64(7))}, {"seed": "numpy_scalar"})
        {'seed': np.uint64(7)}
    """
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
    """A global array replicated on ``sharding`` holding this process's value of ``leaf``.

    ``sharding`` spans ``jax.devices()`` in order: the shards of a PRNG key array are matched to
    the devices by position.
    """
    here = jax.process_index()
    local = [device for device in jax.devices() if device.process_index == here]
    shards = [jax.device_put(leaf, device) for device in local]
    return jax.make_array_from_single_device_arrays(leaf.shape, sharding, shards)


def globalize_host_local(items: Mapping[str, PyTree]) -> dict[str, PyTree]:
    """Make every host-local ``jax.Array`` of a multi-process save a replicated global array.

    Orbax writes only global arrays when several processes save together; a host-local array
    (a PRNG key made on this process's device, nnx state never placed on the global mesh) holds
    its whole value on this process, and is stored as process 0's value, as NumPy leaves are:
    it must be the same on every process. It restores onto the template's placement (its
    device again). Global arrays and every other leaf pass through unchanged.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._trees import globalize_host_local
        >>> globalize_host_local({"model": {"w": np.zeros(2)}})["model"]["w"].tolist()
        [0.0, 0.0]
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
