"""Reading a step: template checks, dtype checks before any array is read, and placement."""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import jax
import orbax.checkpoint as ocp

from substrax.typing import PyTree

from . import _templates, _trees
from ._errors import CheckpointCorruptError, CheckpointDtypeMismatchError, DtypeMismatch
from ._formats import DTYPES_ITEM, StepRecord
from ._manifest import Damage, check_manifest, read_manifest


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
    except _DAMAGE_ERRORS as error:
        raise _damaged(error, manager, step) from error
    trees: dict[str, PyTree] = {}
    for name in record.metadata.items if held is None else held:
        tree = getattr(metadata[name], "tree", metadata[name])
        trees[name] = tree[_trees.WRAPPER] if wrapped else tree
    return trees


_DAMAGE_ERRORS: Final = (ValueError, KeyError, TypeError, AttributeError)
"""What orbax raises reading a damaged file (JSONDecodeError is a ValueError)."""
_SHOWN: Final = 300  # characters of orbax's message shown in a corrupt error's detail


def _damaged(error: Exception, manager: ocp.CheckpointManager, step: int) -> CheckpointCorruptError:
    """``CheckpointCorruptError`` for what orbax raised reading ``step``'s files.

    Where the step has a manifest, the damaged file it finds is named (a read that checks no
    manifest, such as ``describe``, lands here); else the step is, with orbax's words.
    """
    root = Path(str(manager.directory))
    manifest = read_manifest(root / str(step))
    damage = [] if manifest is None else check_manifest(root / str(step), manifest)
    if damage:
        return _corrupt(root, step, damage)
    text = str(error).split(" [tensorstore_spec", 1)[0].strip()
    shown = text if len(text) <= _SHOWN else f"{text[:_SHOWN]}..."
    return CheckpointCorruptError(
        step=step,
        item="<step>",
        leaf="<root>",
        directory=root,
        path=root / str(step),
        detail=f"orbax could not read it ({type(error).__name__}: {shown})",
    )


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

    Raises ``CheckpointCorruptError`` naming the first damaged file (its item and array when the
    layout tells them), with how many others are damaged. A step without a manifest (written
    before manifests, or interrupted between orbax's commit and its manifest) returns False:
    it is unverified, and still restores.
    """
    step_dir = root / str(step)
    manifest = read_manifest(step_dir)
    if manifest is None:
        return False
    damage = check_manifest(step_dir, manifest, items=items)
    if damage:
        raise _corrupt(root, step, damage)
    return True


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
