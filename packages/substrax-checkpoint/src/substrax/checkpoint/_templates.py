"""Templates: each leaf checked against the stored one, abstract meshes made concrete.

A template that does not fit raises ``ValueError`` naming the leaf, what the checkpoint holds
there and what the template asks for; a dtype change (a plain Python number's kind included) is
a ``DtypeMismatch``.
"""

from collections.abc import Mapping
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
    return f"{'an' if what[0] in 'aeiou' else 'a'} {what}{shown}"


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
        return None
    if _python_number(leaf):
        return f"is {_describe(stored)} in the checkpoint but {_describe(leaf)} in the template"
    return f"has shape {tuple(shape)} in the template but {tuple(saved_shape)} in the checkpoint"


def check_template(item: str, stored: PyTree, template: PyTree) -> None:
    """Raise ValueError naming the first leaf where ``template`` does not fit the ``stored`` tree.

    The message says what the checkpoint holds there and what the template asks for.
    """

    def mismatch(path: str, problem: str) -> ValueError:
        prefix = f"template for item {item!r} does not match the checkpoint: leaf {path!r}"
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
        raise ValueError(
            f"template leaf {path!r} carries an abstract mesh {dict(abstract.shape)} (a template "
            "from nnx.eval_shape under a mesh); pass restore(..., mesh=mesh) or restore inside "
            "`with jax.set_mesh(mesh):` with a concrete mesh of that shape"
        )
    return jax.sharding.NamedSharding(candidate, sharding.spec, memory_kind=sharding.memory_kind)


def resolve_abstract_meshes(template: PyTree, mesh: jax.sharding.Mesh | None) -> PyTree:
    """Replace abstract meshes in ``ShapeDtypeStruct`` leaves with a concrete mesh of that shape."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves: list[object] = []
    for path, leaf in pairs:
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is not None:
            sharding = _concrete(leaf.sharding, _trees.leaf_path(path), mesh)
            if sharding is not leaf.sharding:
                leaf = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)  # noqa: PLW2901
        leaves.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, leaves)
