"""Templates: each leaf checked against the stored one, abstract meshes made concrete.

A template that does not fit raises ``ValueError`` naming the leaf, what the checkpoint holds
there and what the template asks for; a dtype change (a plain Python number's kind included) is
a ``DtypeMismatch``.
"""

from collections.abc import Collection, Mapping
from typing import Final, cast

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from substrax.typing import PyTree

from . import _trees
from ._read_errors import DtypeMismatch


_PYTHON_NUMBERS: Final = {
    "bool": jnp.bool_,
    "int": jnp.integer,
    "float": jnp.floating,
    "complex": jnp.complexfloating,
}
"""The dtypes that a template's plain Python number restores without a change of kind."""


def _python_number(leaf: object) -> bool:
    return isinstance(leaf, bool | int | float | complex) and not isinstance(leaf, np.generic)


def _wanted(leaf: object) -> str | None:
    """What a template leaf restores as: a dtype, a Python number's type, or None (a str)."""
    return type(leaf).__name__ if _python_number(leaf) else _trees.leaf_dtype(leaf)


def _fits(saved: str, wanted: str) -> bool:
    """Whether a leaf stored as ``saved`` restores as ``wanted`` (``_wanted``) unchanged."""
    if _trees.is_key_name(wanted) and saved == "uint32":
        return True  # a key in a record written before keys had their own name
    kind = _PYTHON_NUMBERS.get(wanted)
    if kind is None:
        return saved == wanted
    try:
        return bool(jnp.issubdtype(jnp.dtype(saved), kind))
    except TypeError:
        return False


def python_number_dtypes(stored: PyTree) -> dict[str, str]:
    """``{leaf_path: dtype}`` of the plain Python numbers of orbax's metadata tree ``stored``."""
    return {
        path: np.dtype(leaf.dtype).name
        for path, leaf in _trees.flat_leaves(stored)
        if isinstance(leaf, ocp.metadata.ScalarMetadata) and leaf.dtype is not None
    }


def dtype_mismatches(item: str, saved: Mapping[str, str], template: PyTree) -> list[DtypeMismatch]:
    """The template leaves that would not restore as stored: another dtype, a float as an int...

    ``saved`` maps leaf paths to stored dtypes (a plain Python number's included); a template's
    Python number asks for its kind (``int``: any integer dtype), anything else for its dtype.
    """
    return [
        DtypeMismatch(item=item, leaf=path, saved=saved[path], restored=wanted)
        for path, leaf in _trees.flat_leaves(template)
        if (wanted := _wanted(leaf)) is not None
        and path in saved
        and not _fits(saved[path], wanted)
    ]


def _named(dtype: str) -> str:
    what = f"{dtype} PRNG key" if _trees.is_key_name(dtype) else f"{dtype} value"
    return f"{'an' if what[0] in 'aeio' else 'a'} {what}"


def _key_mismatch(item: str, path: str, stored: str, wanted: str) -> ValueError:
    advice = (
        f"a key of the implementation the step was saved with (dtype {stored})"
        if _trees.is_key_name(stored)
        else f"a {stored} leaf"
    )
    return ValueError(
        f"template for item {item!r} and the checkpoint do not match: leaf {path!r} is "
        f"{_named(stored)} in the checkpoint but {_named(wanted)} in the template (cast_dtypes "
        f"changes no key's implementation); give the template {advice}"
    )


def _plain_data(stored: str, wanted: str, shape: list[int] | None, leaf: object) -> bool:
    """Whether a ``uint32`` leaf is plain data, not a key recorded before keys had their name.

    A record that keeps shapes keeps a key's own shape (``()`` for one key), not its data's.
    """
    if stored != "uint32" or not _trees.is_key_name(wanted) or shape is None:
        return False
    return tuple(shape) != tuple(getattr(leaf, "shape", ()))


def check_keys(
    item: str,
    saved: Mapping[str, str],
    template: PyTree,
    shapes: Mapping[str, list[int]] | None = None,
) -> None:
    """Raise ValueError at the first template leaf whose PRNG key does not fit the stored leaf.

    A key where another implementation's key or no key is stored, or no key where one is;
    ``shapes`` (the step's recorded shapes) tells a ``uint32`` array from an older key record.
    """
    for path, leaf in _trees.flat_leaves(template):
        wanted, stored = _wanted(leaf), saved.get(path)
        if wanted is None or stored is None:
            continue
        if _fits(stored, wanted) and not _plain_data(
            stored, wanted, (shapes or {}).get(path), leaf
        ):
            continue
        if _trees.is_key_name(wanted) or _trees.is_key_name(stored):
            raise _key_mismatch(item, path, stored, wanted)


def _key_impl(key: object) -> str:
    """The implementation of a typed PRNG key or of its ``ShapeDtypeStruct`` (``rbg``...)."""
    found: list[str] = []
    jax.eval_shape(lambda k: found.append(str(jax.random.key_impl(k))), key)
    return found[0]


def restored_keys(item: str, restored: PyTree, template: PyTree) -> PyTree:
    """``restored`` with the leaves where ``template`` holds PRNG keys as keys of its dtype.

    Orbax wraps a key's data in the implementation it stored, where it kept one.
    """
    keys = {
        path: leaf
        for path, leaf in _trees.flat_leaves(template)
        if _trees.is_key(getattr(leaf, "dtype", None))
    }
    if not keys:
        return restored

    def as_key(path: str, leaf: jax.Array) -> jax.Array:
        wanted = keys[path].dtype
        if leaf.dtype == wanted:
            return leaf
        if _trees.is_key(leaf.dtype):  # a record from before keys were named could not tell
            raise _key_mismatch(item, path, str(leaf.dtype), str(wanted))
        try:  # key data that orbax did not wrap (no record of the implementation)
            return jax.random.wrap_key_data(leaf, impl=_key_impl(keys[path]))
        except TypeError as error:
            raise _key_mismatch(
                item, path, f"{leaf.dtype}{list(leaf.shape)}", str(wanted)
            ) from error

    pairs, treedef = jax.tree_util.tree_flatten_with_path(restored)
    leaves = [
        as_key(path, leaf) if (path := _trees.leaf_path(key_path)) in keys else leaf
        for key_path, leaf in pairs
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _describe(leaf: object) -> str:
    """A stored (orbax's metadata) or template leaf, for a message."""
    if isinstance(leaf, str | ocp.metadata.StringMetadata):
        return "a str"
    if isinstance(leaf, ocp.metadata.ScalarMetadata):
        return f"a Python number ({leaf.dtype})"
    if _python_number(leaf):
        return f"the Python {type(leaf).__name__} {leaf!r}"
    dtype, shape = getattr(leaf, "dtype", None), getattr(leaf, "shape", None)
    what = "PRNG key" if _trees.is_key(dtype) else "array"
    what = what if dtype is None else f"{dtype} {what}"
    shown = "" if shape is None else f" of shape {tuple(shape)}"
    return f"{'an' if what[0] in 'aeio' else 'a'} {what}{shown}"


def _key_data_shape(key: object) -> tuple[int, ...] | None:
    try:
        return tuple(jax.eval_shape(jax.random.key_data, key).shape)
    except (TypeError, ValueError):
        return None


def _misfit(stored: object, leaf: object) -> str | None:
    """Why template ``leaf`` cannot receive the ``stored`` leaf, or None when it can."""
    text = isinstance(stored, ocp.metadata.StringMetadata)
    if text != isinstance(leaf, str) or (
        isinstance(stored, ocp.metadata.ScalarMetadata)
        and _trees.is_key(getattr(leaf, "dtype", None))
    ):
        return f"is {_describe(stored)} in the checkpoint but {_describe(leaf)} in the template"
    saved_shape = getattr(stored, "shape", None)
    shape = () if _python_number(leaf) else getattr(leaf, "shape", None)
    if _trees.is_key(getattr(leaf, "dtype", None)) and isinstance(
        stored, ocp.metadata.ArrayMetadata
    ):
        # orbax's metadata holds a key's data: its shape is the keys' and the implementation's
        data = _key_data_shape(leaf)
        if saved_shape is None or data is None or tuple(saved_shape) == data:
            return None
        return (
            f"holds PRNG key data of shape {tuple(saved_shape)} in the checkpoint but the "
            f"template has {_describe(leaf)}, whose key data has shape {data} (another key "
            "implementation, or another number of keys)"
        )
    if saved_shape is None or shape is None or tuple(saved_shape) == tuple(shape):
        return _unsplittable(leaf)
    if _python_number(leaf):
        return f"is {_describe(stored)} in the checkpoint but {_describe(leaf)} in the template"
    return f"has shape {tuple(shape)} in the template but {tuple(saved_shape)} in the checkpoint"


def _unsplittable(leaf: object) -> str | None:
    """Why ``leaf``'s sharding cannot split its shape (8 rows over 3 devices), or None."""
    sharding, shape = getattr(leaf, "sharding", None), getattr(leaf, "shape", None)
    if not isinstance(sharding, jax.sharding.NamedSharding) or shape is None:
        return None
    try:
        sharding.shard_shape(tuple(shape))
    except ValueError as error:
        return f"of shape {tuple(shape)} cannot be split as its sharding {sharding.spec} says ({error})"
    return None


def check_template(item: str, stored: PyTree, template: PyTree) -> None:
    """Raise ValueError naming the first leaf where ``template`` does not fit the ``stored`` tree.

    The message says what the checkpoint holds there and what the template asks for.
    """

    def mismatch(path: str, problem: str) -> ValueError:
        prefix = f"template for item {item!r} and the checkpoint do not match: leaf {path!r}"
        return ValueError(f"{prefix} {problem}")

    saved = dict(_trees.flat_leaves(stored))
    wanted = _trees.flat_leaves(template)
    for path, leaf in wanted:
        if path not in saved:
            raise mismatch(
                path, "is not stored (the store was written for another structure or architecture)"
            )
        if (problem := _misfit(saved[path], leaf)) is not None:
            raise mismatch(path, problem)
    wanted_paths = {path for path, _ in wanted}
    for path in saved:
        if path not in wanted_paths:
            raise mismatch(path, "is stored but missing from the template")
    # None and empty containers hold no leaf, yet orbax compares them too
    saved_empty, wanted_empty = _trees.empty_nodes(stored), _trees.empty_nodes(template)
    if unstored := sorted(wanted_empty - saved_empty):
        raise mismatch(unstored[0], "is None or an empty container in the template but not stored")
    if untemplated := sorted(saved_empty - wanted_empty):
        problem = "is stored as None or an empty container but missing from the template"
        raise mismatch(untemplated[0], problem)


def _concrete(sharding: object, path: str, mesh: jax.sharding.Mesh | None) -> object:
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return sharding
    abstract = sharding.mesh
    if not isinstance(abstract, jax.sharding.AbstractMesh):
        return sharding
    candidate = mesh
    if candidate is None:
        # the mesh set with jax.set_mesh (an empty one when none is); a jax without the public
        # getter asks for restore(..., mesh=mesh) below
        getter = getattr(jax.sharding, "get_mesh", None)
        found = cast("jax.sharding.Mesh | None", getter() if callable(getter) else None)
        candidate = None if found is None or found.empty else found
    if candidate is None or dict(candidate.shape) != dict(abstract.shape):
        given = (
            "" if candidate is None else f"; the mesh given has the shape {dict(candidate.shape)}"
        )
        raise ValueError(
            f"template leaf {path!r} carries an abstract mesh {dict(abstract.shape)} (a template "
            "from nnx.eval_shape under a mesh); pass restore(..., mesh=mesh) or restore inside "
            f"`with jax.set_mesh(mesh):` with a concrete mesh of that shape{given}"
        )
    return jax.sharding.NamedSharding(candidate, sharding.spec, memory_kind=sharding.memory_kind)


def unplaced(template: PyTree) -> set[str]:
    """The paths of ``template``'s ``ShapeDtypeStruct`` leaves without a sharding."""
    return {
        path
        for path, leaf in _trees.flat_leaves(template)
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None
    }


def resolve_shardings(
    template: PyTree, mesh: jax.sharding.Mesh | None, host: Collection[str] = ()
) -> PyTree:
    """Give ``template``'s ``ShapeDtypeStruct`` leaves the sharding their arrays restore with.

    An abstract mesh becomes a concrete mesh of its shape; a leaf without a sharding gets the
    default device's (``default_sharding``), or keeps none (NumPy) where ``host`` names it.
    """
    pairs, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves: list[object] = []
    for key_path, leaf in pairs:
        path = _trees.leaf_path(key_path)
        if isinstance(leaf, jax.ShapeDtypeStruct) and (
            leaf.sharding is not None or path not in host
        ):
            sharding = (
                _trees.default_sharding()
                if leaf.sharding is None
                else _concrete(leaf.sharding, path, mesh)
            )
            if sharding is not leaf.sharding:
                leaf = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)  # noqa: PLW2901
        leaves.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, leaves)
