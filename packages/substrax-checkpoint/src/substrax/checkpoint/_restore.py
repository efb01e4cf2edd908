"""Reading a step: templates checked before any array is read, placement, stored leaves."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import jax
import numpy as np
import orbax.checkpoint as ocp

from substrax.support import check_array_variables
from substrax.typing import PyTree

from . import _trees
from ._manifest import Damage, check_manifest, read_manifest
from ._metadata import DTYPES_ITEM, WRAPPER, StepRecord
from ._read_errors import CheckpointCorruptError, CheckpointDtypeMismatchError, DtypeMismatch
from ._templates import (
    check_keys,
    check_template,
    dtype_mismatches,
    python_number_dtypes,
    resolve_shardings,
    restored_keys,
    unplaced,
)


def stored_restore_args(
    stored: PyTree, host: Mapping[str, str] | None = None, *, local: bool = False
) -> PyTree:
    """Restore arguments without a template: arrays where saved, the leaves ``host`` names as NumPy.

    ``local`` (a reader, which restores in its own process alone): an array saved across devices
    of other processes comes to this process's default device, whole, not onto a global
    sharding it cannot fill.
    """
    fallback = _trees.default_sharding()

    def sharding_of(leaf: object) -> object:
        if not isinstance(leaf, ocp.metadata.ArrayMetadata):
            return None
        if leaf.sharding is None:
            return fallback
        try:
            saved = leaf.sharding.to_jax_sharding()
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return fallback
        return fallback if local and not saved.is_fully_addressable else saved

    args = ocp.checkpoint_utils.construct_restore_args(
        stored, sharding_tree=jax.tree.map(sharding_of, stored)
    )
    if not host:
        return args

    def on_host(path: tuple[object, ...], _leaf: object, arg: object) -> object:
        return ocp.RestoreArgs(restore_type=np.ndarray) if _trees.leaf_path(path) in host else arg

    return jax.tree_util.tree_map_with_path(on_host, stored, args)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredLeaf:
    """One stored leaf as its metadata describes it (no array is read).

    A typed PRNG key shows its ``key<impl>`` dtype and the keys' shape (its ``nbytes`` are its
    data's), a ``None`` leaf the dtype ``"None"``, a str ``"str"``.
    """

    path: str
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int | None


def stored_leaves(
    stored: PyTree,
    dtypes: Mapping[str, str] | None = None,
    shapes: Mapping[str, list[int]] | None = None,
) -> list[StoredLeaf]:
    """The leaves of an item's orbax metadata tree: path, shape, dtype and size in bytes.

    ``dtypes`` and ``shapes`` (the step's records) name the keys, whose data orbax describes.
    """
    leaves: list[StoredLeaf] = []
    pairs, _ = jax.tree_util.tree_flatten_with_path(stored, is_leaf=lambda leaf: leaf is None)
    for key_path, leaf in pairs:
        path = _trees.leaf_path(key_path)
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        name, nbytes = ("str" if isinstance(leaf, ocp.metadata.StringMetadata) else None), None
        name = "None" if leaf is None else name
        if dtype is not None and _trees.is_key(dtype):
            name = str(dtype)
        elif dtype is not None:
            name = np.dtype(dtype).name
            if shape is not None:
                nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        shape = None if shape is None else tuple(int(s) for s in shape)
        if _trees.is_key_name(recorded := (dtypes or {}).get(path, "")) and name == "uint32":
            name, keys = recorded, (shapes or {}).get(path)  # a record without shapes: data's
            shape = tuple(keys) if keys is not None else None if shape is None else shape[:-1]
        leaves.append(StoredLeaf(path=path, shape=shape, dtype=name, nbytes=nbytes))
    return leaves


def stored_trees(
    manager: ocp.CheckpointManager,
    step: int,
    record: StepRecord,
    held: Sequence[str] | None = None,
) -> dict[str, PyTree]:
    """Orbax's metadata tree of each item (no array is read), without the wrapper node."""
    wrapped = record.layout == "current"
    trees: dict[str, PyTree] = {}
    try:
        metadata = manager.item_metadata(step)
        for name in record.metadata.items if held is None else held:  # a missing file: None
            tree = getattr(metadata[name], "tree", metadata[name])
            trees[name] = tree[WRAPPER] if wrapped else tree
    except _DAMAGE_ERRORS as error:
        raise _damaged(error, manager, step) from error
    return trees


_DAMAGE_ERRORS: Final = (ValueError, KeyError, TypeError, AttributeError)
"""What orbax raises reading a damaged file (JSONDecodeError is a ValueError)."""
_SHOWN: Final = 300  # characters of orbax's message shown in a corrupt error's detail
# orbax's words when a template's containers differ from the stored tree's (a dict for a list)
_STRUCTURE_MISMATCH: Final = "tree structures do not match"


def _damaged(
    error: Exception,
    manager: ocp.CheckpointManager,
    step: int,
    unfit: Callable[[], ValueError | None] = lambda: None,
) -> ValueError:
    """What orbax's ``error`` reading ``step`` means, as the error to raise.

    The damaged file (``CheckpointCorruptError``), else the template mismatch ``unfit`` finds
    (``ValueError``), else corruption in orbax's words.
    """
    root = Path(str(manager.directory))
    manifest = read_manifest(root / str(step))
    damage = [] if manifest is None else check_manifest(root / str(step), manifest)
    if damage:
        return _corrupt(root, step, damage)
    if (mismatch := unfit()) is not None:
        return mismatch
    text = str(error).split(" [tensorstore_spec", 1)[0].strip()
    shown = text if len(text) <= _SHOWN else f"{text[:_SHOWN]}..."
    if isinstance(error, ValueError) and _STRUCTURE_MISMATCH in text:  # a template, not damage
        # orbax's advice to pass partial_restore=True names an option restore does not take
        shown = shown.split("If this mismatch is intentional", 1)[0].strip()
        return ValueError(
            f"the templates do not match the containers of step {step} in {root} (orbax: "
            f"{shown}); build each template as its tree was saved (a list as a list, a dict as "
            "a dict)"
        )
    return CheckpointCorruptError(
        step=step,
        item="<step>",
        leaf="<root>",
        directory=root,
        path=root / str(step),
        detail=f"orbax could not read it ({type(error).__name__}: {shown})",
    )


def _unfit(
    manager: ocp.CheckpointManager, step: int, record: StepRecord, templates: Mapping[str, PyTree]
) -> ValueError | None:
    """The first template leaf that orbax's metadata of ``step`` shows does not fit, or None.

    A template checked against the step's recorded shapes only (no Python leaves, no key's
    implementation) is checked again here when orbax refuses it.
    """
    try:
        stored = stored_trees(manager, step, record, list(templates))
        for name, template in templates.items():
            check_template(name, stored[name], template)
    except CheckpointCorruptError:
        return None
    except ValueError as mismatch:
        return mismatch
    return None


def _corrupt(root: Path, step: int, damage: Sequence[Damage]) -> CheckpointCorruptError:
    """The error naming the first of ``damage`` (its file, item and array), counting the others."""
    first = damage[0]
    others = f"; {len(damage) - 1} other file(s) damaged too" if len(damage) > 1 else ""
    return CheckpointCorruptError(
        step=step,
        item=first.item or "<step>",
        leaf=(first.array or "<root>").replace(".", "/"),
        directory=root,
        path=root / str(step) / first.file,
        detail=f"{first.problem} against the step's manifest{others}",
    )


def check_files(root: Path, step: int, items: Sequence[str] | None) -> bool:
    """Check ``step``'s files (of ``items``, or all) against its manifest; whether it had one.

    Raises ``CheckpointCorruptError`` naming the first damaged file and counting the others.
    """
    manifest = read_manifest(step_dir := root / str(step))
    if manifest is None:
        return False
    damage = check_manifest(step_dir, manifest, items=items)
    if damage:
        raise _corrupt(root, step, damage)
    return True


def _held(record: StepRecord, step: int, items: Sequence[str] | None) -> tuple[str, ...]:
    held = record.metadata.items
    if items is None:
        return held
    if isinstance(items, str):  # not its letters: ('model',), as check_manifest says too
        raise TypeError(f"items={items!r} is one string; pass a sequence of names: ({items!r},)")
    if missing := [name for name in items if name not in held]:
        what = f"step {step} does not hold item(s) {missing} (it holds {held})"
        raise ValueError(f"{what}; restore items it holds")
    return tuple(name for name in held if name in items)


def _check_templated(
    templates: Mapping[str, PyTree],
    held: tuple[str, ...],
    record: StepRecord,
    step: int,
    items: Sequence[str] | None,
) -> None:
    """Refuse templates of items the restore does not read: not in the step, or not in ``items``."""
    unknown = [name for name in templates if name not in held]
    if unknown and items is not None and set(unknown) <= set(record.metadata.items):
        raise ValueError(
            f"templates name item(s) {unknown} that items={tuple(items)} leaves out; name them "
            "in items= too, or drop their templates"
        )
    if unknown:
        raise ValueError(
            f"templates name item(s) {unknown} that step {step} does not hold (it holds {held})"
        )


def restore_items(
    manager: ocp.CheckpointManager,
    step: int,
    record: StepRecord,
    *,
    templates: Mapping[str, PyTree],
    cast_dtypes: bool,
    mesh: jax.sharding.Mesh | None,
    items: Sequence[str] | None,
    local: bool = False,
) -> dict[str, PyTree]:
    """Restore ``step``'s items, templated ones onto their templates (checked before any read).

    ``local``: the restore is this process's alone (a reader's), see :func:`stored_restore_args`.
    """
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):  # pyright: ignore[reportUnnecessaryIsInstance]
        # an AbstractMesh failed inside orbax's read, which reads as a damaged step
        raise TypeError(
            f"restore's mesh= must be a concrete jax.sharding.Mesh, which names devices, not "
            f"{type(mesh).__name__} {mesh!r}; pass the mesh the arrays go to (e.g. "
            "create_device_mesh(...)), or leave mesh= out"
        )
    if record.damaged_dtypes is not None:
        path, detail = record.damaged_dtypes
        raise CheckpointCorruptError(
            step=step,
            item=DTYPES_ITEM,
            leaf="<root>",
            directory=path.parent.parent.parent,
            path=path,
            detail=f"the step's dtypes record is damaged: {detail}",
        )
    held = _held(record, step, items)
    _check_templated(templates, held, record, step, items)
    for name, tree in templates.items():
        check_array_variables(tree, f"restore (template {name!r})")
    wrapped = record.layout == "current"
    # a ShapeDtypeStruct without a sharding: a leaf saved as NumPy comes back as saved, others
    # as jax.Arrays on the default device
    host = {name: (record.host or {}).get(name, {}) for name in templates}
    bare = {name: unplaced(tree) & set(host[name]) for name, tree in templates.items()}
    resolved = {
        name: _trees.scalars_as_arrays(resolve_shardings(tree, mesh, bare[name]))
        for name, tree in templates.items()
    }
    # templates covering the recorded leaves skip orbax's metadata read (its restore reads it);
    # the record holds no None or empty container, which a template's are checked against
    stored: dict[str, PyTree] = {
        name: {path: SimpleNamespace(shape=tuple(shape)) for path, shape in shapes.items()}
        for name, tree in resolved.items()
        if (shapes := (record.shapes or {}).get(name)) is not None
        and {path for path, _ in _trees.flat_leaves(tree)} == set(shapes)
        and not _trees.empty_nodes(tree)
    }
    if unread := [name for name in held if name not in stored]:
        stored |= stored_trees(manager, step, record, unread)

    def saved_dtypes(name: str) -> dict[str, str]:
        saved = (record.dtypes or {}).get(name)
        saved = _trees.dtype_record(stored[name]) if saved is None else saved
        return {**saved, **python_number_dtypes(stored[name])}  # none in recorded shapes

    def mismatches(trees: Mapping[str, PyTree]) -> list[DtypeMismatch]:
        """Each leaf of ``trees`` whose dtype differs from the stored one."""
        return [
            m
            for name, tree in trees.items()
            for m in dtype_mismatches(name, saved_dtypes(name), tree)
        ]

    # NumPy leaves: a template's come back as its kinds (a bare one's as saved), an
    # untemplated item's as it was saved
    kinds: dict[str, Mapping[str, str]] = {
        name: {**{path: host[name][path] for path in bare[name]}, **_trees.host_record(tree)}
        for name, tree in templates.items()
    }
    for name, template in resolved.items():
        check_template(name, stored[name], template)
        check_keys(name, saved_dtypes(name), template, (record.shapes or {}).get(name))
    if not cast_dtypes and (before := mismatches(resolved)):
        raise CheckpointDtypeMismatchError(step=step, mismatches=tuple(before))
    args: dict[str, Any] = {}
    for name in held:
        if name in resolved:
            target = {WRAPPER: resolved[name]} if wrapped else resolved[name]
            restore = ocp.checkpoint_utils.construct_restore_args(target)
            args[name] = ocp.args.PyTreeRestore(item=target, restore_args=restore)
        else:
            kinds[name] = (record.host or {}).get(name, {})
            restore = stored_restore_args(stored[name], kinds[name], local=local)
            restore = {WRAPPER: restore} if wrapped else restore
            args[name] = ocp.args.PyTreeRestore(restore_args=restore)
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**args))
    except _DAMAGE_ERRORS as error:  # damaged files, or a template orbax's metadata refuses
        raise _damaged(
            error, manager, step, lambda: _unfit(manager, step, record, resolved)
        ) from error
    values = {
        name: _trees.as_saved(restored[name][WRAPPER] if wrapped else restored[name], kinds[name])
        for name in held
    }
    for name, template in resolved.items():
        values[name] = restored_keys(name, values[name], template)
    untemplated = {name: values[name] for name in held if name not in resolved}
    if not cast_dtypes and (after := mismatches(untemplated)):
        raise CheckpointDtypeMismatchError(step=step, mismatches=tuple(after))
    return values
