"""Reading a step: template checks, dtype checks before any array is read, and placement."""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import jax
import orbax.checkpoint as ocp

from substrax.typing import PyTree

from . import _templates, _trees
from ._corrupt_reads import metadata_damage, named_damage
from ._errors import CheckpointCorruptError, CheckpointDtypeMismatchError, DtypeMismatch
from ._formats import DTYPES_ITEM, StepRecord


def stored_trees(
    manager: ocp.CheckpointManager,
    step: int,
    record: StepRecord,
    held: Sequence[str] | None = None,
) -> dict[str, PyTree]:
    """Orbax's metadata tree of each item (no array is read), without the wrapper node.

    A damaged array's metadata raises ``CheckpointCorruptError`` naming the leaf in its item.
    """
    wrapped = record.layout == "current"
    try:
        metadata = manager.item_metadata(step)
    except CheckpointCorruptError as error:
        raise _in_step(error, step, wrapped=wrapped) from error.__cause__
    except _DAMAGE_ERRORS as error:
        raise _damaged(error, manager, step) from error
    trees: dict[str, PyTree] = {}
    for name in record.metadata.items if held is None else held:
        tree = getattr(metadata[name], "tree", metadata[name])
        trees[name] = tree[_trees.WRAPPER] if wrapped else tree
    return trees


_DAMAGE_ERRORS: Final = (ValueError, KeyError, TypeError, AttributeError)
"""What orbax raises reading a damaged metadata file (JSONDecodeError is a ValueError)."""
_IN_AN_ARRAY: Final = 2  # parts of a path below the step before an array's own files
_SHOWN: Final = 300  # characters of orbax's message shown in a corrupt error's detail


def _damaged(error: Exception, manager: ocp.CheckpointManager, step: int) -> Exception:
    """``CheckpointCorruptError`` naming the damaged metadata file behind ``error``, else ``error``.

    Orbax reads a step's ``_sharding``, ``_METADATA`` and ``_CHECKPOINT_METADATA`` files itself
    and raises whatever their damage leads to (``JSONDecodeError``, ``KeyError``,
    ``AttributeError``, TensorStore's ``ValueError``). The file the error names, or else the
    first of the step's metadata files that is not the JSON object orbax wrote, is named; an
    error with no damaged file behind it is returned as it is.
    """
    root = Path(str(manager.directory))
    step_dir = root / str(step)
    found = named_damage(error)
    if found is None or not found[0].is_relative_to(step_dir):
        damaged = metadata_damage(step_dir)
        if not damaged:
            return error
        found = damaged[0]
    path, damage = found
    parts = path.relative_to(step_dir).parts
    item, leaf = (parts[0], "<root>") if len(parts) > 1 else ("<step>", "<root>")
    if path.name in ("zarr.json", ".zarray") and len(parts) > _IN_AN_ARRAY:
        leaf = path.parent.name.removeprefix(f"{_trees.WRAPPER}.").replace(".", "/")
    return CheckpointCorruptError(
        step=step,
        item=item,
        leaf=leaf,
        directory=root,
        path=path,
        detail=f"{damage} ({type(error).__name__}: {_first_words(error)})",
    )


def _first_words(error: Exception) -> str:
    """The start of ``error``'s message, without the TensorStore spec it may end with."""
    text = str(error).split(" [tensorstore_spec", 1)[0].strip()
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}..."


def _saved_dtypes(record: StepRecord, name: str, stored: PyTree) -> Mapping[str, str]:
    saved = (record.dtypes or {}).get(name)
    return saved if saved is not None else _trees.dtype_record({name: stored})[name]


def _held(record: StepRecord, step: int, items: Sequence[str] | None) -> tuple[str, ...]:
    held = record.metadata.items
    if items is None:
        return held
    missing = [name for name in items if name not in held]
    if missing:
        raise ValueError(
            f"step {step} does not hold item(s) {missing} (it holds {held}); restore items it holds"
        )
    return tuple(name for name in held if name in items)


def _in_step(error: CheckpointCorruptError, step: int, *, wrapped: bool) -> CheckpointCorruptError:
    """``error`` naming ``step`` and the leaf's path in its item (without the wrapper node)."""
    prefix = f"{_trees.WRAPPER}/"
    leaf = error.leaf
    if wrapped and (leaf == _trees.WRAPPER or leaf.startswith(prefix)):
        leaf = leaf.removeprefix(_trees.WRAPPER).removeprefix("/")
    elif wrapped and leaf.startswith(f"{_trees.WRAPPER}."):  # a parameter's name, from metadata
        leaf = leaf.removeprefix(f"{_trees.WRAPPER}.").replace(".", "/")
    return CheckpointCorruptError(
        step=step,
        item=error.item,
        leaf=leaf or "<root>",
        directory=error.directory,
        path=error.path,
        detail=error.detail,
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
) -> dict[str, PyTree]:
    """Restore the items of ``step``; templated ones onto their templates' shardings and dtypes.

    The template structure and the dtypes are checked against the stored metadata before any
    array is read; untemplated items are checked after (a 64-bit array narrowed by x64 being off).
    """
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
    unknown = [name for name in templates if name not in held]
    if unknown:
        raise ValueError(
            f"templates name item(s) {unknown} that step {step} does not hold (it holds {held})"
        )
    wrapped = record.layout == "current"
    stored = stored_trees(manager, step, record, held)
    # NumPy leaves: a template's come back as its kinds, an untemplated item's as it was saved
    kinds: dict[str, Mapping[str, str]] = {
        name: _trees.host_record(tree) for name, tree in templates.items()
    }
    resolved = {
        name: _trees.scalars_as_arrays(_templates.resolve_abstract_meshes(tree, mesh))
        for name, tree in templates.items()
    }
    mismatches: list[DtypeMismatch] = []
    for name, template in resolved.items():
        _templates.check_template(name, stored[name], template)
        saved = _saved_dtypes(record, name, stored[name])
        mismatches += _templates.dtype_mismatches(name, saved, template)
    if mismatches and not cast_dtypes:
        raise CheckpointDtypeMismatchError(step=step, mismatches=tuple(mismatches))
    args: dict[str, Any] = {}
    for name in held:
        if name in resolved:
            target = {_trees.WRAPPER: resolved[name]} if wrapped else resolved[name]
            args[name] = ocp.args.PyTreeRestore(
                item=target, restore_args=_templates.restore_args(target)
            )
        else:
            kinds[name] = (record.host or {}).get(name, {})
            restore = _templates.stored_restore_args(stored[name], kinds[name])
            args[name] = ocp.args.PyTreeRestore(
                restore_args={_trees.WRAPPER: restore} if wrapped else restore
            )
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**args))
    except CheckpointCorruptError as error:
        raise _in_step(error, step, wrapped=wrapped) from error.__cause__
    except _DAMAGE_ERRORS as error:
        raise _damaged(error, manager, step) from error
    values = {
        name: _trees.as_saved(
            restored[name][_trees.WRAPPER] if wrapped else restored[name], kinds[name]
        )
        for name in held
    }
    if not cast_dtypes:
        after = [
            mismatch
            for name in held
            if name not in resolved
            for mismatch in _templates.dtype_mismatches(
                name, _saved_dtypes(record, name, stored[name]), values[name]
            )
        ]
        if after:
            raise CheckpointDtypeMismatchError(step=step, mismatches=tuple(after))
    return values
