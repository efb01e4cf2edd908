"""Restoring onto templates: shape and dtype checks, abstract meshes, orbax restore arguments.

A template leaf must match a stored leaf's path and shape (a dtype change is reported for the
store to refuse or cast); a ``ShapeDtypeStruct`` built under an abstract mesh gets a concrete
one; untemplated items get restore arguments that place arrays where they were saved. Also
``describe``: a stored item's leaves from orbax's metadata, no array read. The leaf paths and
dtype records these use are :mod:`._trees`'.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import jax
import numpy as np
import orbax.checkpoint as ocp

from substrax.typing import PyTree

from ._errors import DtypeMismatch
from ._trees import flat_leaves, leaf_dtype, leaf_path


def dtype_mismatches(item: str, saved: Mapping[str, str], template: PyTree) -> list[DtypeMismatch]:
    """The template leaves whose dtype differs from the stored one."""
    found: list[DtypeMismatch] = []
    for path, leaf in flat_leaves(template):
        wanted = leaf_dtype(leaf)
        stored = saved.get(path)
        if wanted is not None and stored is not None and wanted != stored:
            found.append(DtypeMismatch(item=item, leaf=path, saved=stored, restored=wanted))
    return found


def check_template(item: str, stored: PyTree, template: PyTree) -> None:
    """Raise ValueError naming the first leaf where ``template`` does not fit the stored tree.

    ``stored`` is orbax's metadata tree of the item (without the wrapper node).
    """
    saved = dict(flat_leaves(stored))
    wanted = flat_leaves(template)
    wanted_paths = {path for path, _ in wanted}
    for path, leaf in wanted:
        if path not in saved:
            raise ValueError(
                f"template for item {item!r} does not match the checkpoint: leaf {path!r} is "
                "not stored (the store was written for another structure or architecture)"
            )
        saved_shape = getattr(saved[path], "shape", None)
        shape = getattr(leaf, "shape", None)
        if saved_shape is not None and shape is not None and tuple(saved_shape) != tuple(shape):
            if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key):
                continue
            raise ValueError(
                f"template for item {item!r} does not match the checkpoint: leaf {path!r} has "
                f"shape {tuple(shape)} in the template but {tuple(saved_shape)} in the checkpoint"
            )
    for path in saved:
        if path not in wanted_paths:
            raise ValueError(
                f"template for item {item!r} does not match the checkpoint: leaf {path!r} is "
                "stored but missing from the template"
            )


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
            sharding = _concrete(leaf.sharding, leaf_path(path), mesh)
            if sharding is not leaf.sharding:
                leaf = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)  # noqa: PLW2901
        leaves.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def restore_args(template: PyTree) -> PyTree:
    """Orbax restore arguments that place each array on its template leaf's sharding."""
    return ocp.checkpoint_utils.construct_restore_args(template)


def stored_restore_args(stored: PyTree, host: Mapping[str, str] | None = None) -> PyTree:
    """Restore arguments for an item restored without a template.

    Arrays go to their saved placement when the devices it names are here, else to the first
    local device; the leaves ``host`` names (``{leaf_path: kind}`` of ``host_record``) come back
    as NumPy arrays of their stored dtypes, and plain Python leaves as the Python values they were.
    """
    fallback = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def sharding_of(leaf: object) -> object:
        if not isinstance(leaf, ocp.metadata.ArrayMetadata):
            return None
        if leaf.sharding is None:
            return fallback
        try:
            return leaf.sharding.to_jax_sharding()
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return fallback

    args = ocp.checkpoint_utils.construct_restore_args(
        stored, sharding_tree=jax.tree.map(sharding_of, stored)
    )
    if not host:
        return args

    def on_host(path: tuple[object, ...], _leaf: object, arg: object) -> object:
        return ocp.RestoreArgs(restore_type=np.ndarray) if leaf_path(path) in host else arg

    return jax.tree_util.tree_map_with_path(on_host, stored, args)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredLeaf:
    """One stored leaf as its metadata describes it (no array is read)."""

    path: str
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int | None


def describe(stored: PyTree) -> list[StoredLeaf]:
    """The leaves of an item's orbax metadata tree: path, shape, dtype and size in bytes."""
    leaves: list[StoredLeaf] = []
    for path, leaf in flat_leaves(stored):
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        name = None if dtype is None else np.dtype(dtype).name if not _is_key(dtype) else str(dtype)
        nbytes = None
        if shape is not None and dtype is not None and not _is_key(dtype):
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if isinstance(leaf, ocp.metadata.StringMetadata):
            name = "str"
        leaves.append(
            StoredLeaf(
                path=path,
                shape=None if shape is None else tuple(int(s) for s in shape),
                dtype=name,
                nbytes=nbytes,
            )
        )
    return leaves


def _is_key(dtype: object) -> bool:
    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))  # type: ignore[arg-type]
    except TypeError:
        return False
