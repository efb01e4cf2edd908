"""Verifying a step: every item read back with its checksums, every dtype against its record.

``python -m substrax.checkpoint verify`` reports what this finds, one entry per failure.
"""

from pathlib import Path
from typing import Any

from ._corrupt_reads import metadata_damage
from ._errors import CheckpointCorruptError, CheckpointNotFoundError
from ._formats import read_step
from ._store import OrbaxCheckpointStore


def _failure(item: str | None, leaf: str | None, error: BaseException) -> dict[str, Any]:
    corrupt = isinstance(error, CheckpointCorruptError)  # its own words, not its type
    words = str(error) if corrupt else f"{type(error).__name__}: {error}"
    return {"item": item, "leaf": leaf, "error": words}


def _dtype_failures(store: OrbaxCheckpointStore, step: int) -> list[dict[str, Any]]:
    """Leaves whose dtype in the step's dtypes record differs from their array's own metadata."""
    stored = store.describe(step)
    try:
        record = read_step(store.directory / str(step), step)
    except (OSError, ValueError) as error:
        if not (store.directory / str(step)).is_dir():
            raise CheckpointNotFoundError(
                step=step, directory=store.directory, deleted=True
            ) from error
        return []  # reading the metadata record failed, and was reported
    failures: list[dict[str, Any]] = []
    for item, saved in (record.dtypes or {}).items():
        actual = {leaf.path: leaf.dtype for leaf in stored.get(item, [])}
        for leaf, dtype in saved.items():
            found = actual.get(leaf)
            if found is None or found.startswith("key<") or found == dtype:
                continue
            failures.append(
                {
                    "item": item,
                    "leaf": leaf,
                    "error": f"the step's dtypes record says {dtype} but the array's metadata "
                    f"says {found}: one of them was changed on disk; restore an earlier step",
                }
            )
    return failures


def _metadata_failures(
    store: OrbaxCheckpointStore, step: int, reported: set[Path]
) -> list[dict[str, Any]]:
    """The step's damaged metadata files that no failed read reported.

    Orbax reads ``array_metadatas`` only when it writes a step, and reads past a
    ``_CHECKPOINT_METADATA`` that is not JSON: a restore never fails on them.
    """
    step_dir = store.directory / str(step)
    failures: list[dict[str, Any]] = []
    for path, damage in metadata_damage(step_dir):
        if path in reported:
            continue
        parts = path.relative_to(step_dir).parts
        failures.append(
            {
                "item": parts[0] if len(parts) > 1 else None,
                "leaf": "<root>",
                "error": f"{path} is damaged: {damage}; restore an earlier step",
            }
        )
    return failures


def verify_step(store: OrbaxCheckpointStore, step: int) -> list[dict[str, Any]] | None:
    """Read every item of ``step`` back (checksums checked); one entry per item that failed.

    A damaged metadata file that no read needs (orbax's ``array_metadatas``) fails it too.
    None when the step was deleted while it was verified (a live writer's retention).
    """
    try:
        items = store.read_metadata(step).items
    except CheckpointNotFoundError:
        return None
    except Exception as error:
        return [_failure(None, None, error)]
    failures: list[dict[str, Any]] = []
    reported: set[Path] = set()
    try:
        for item in items:
            try:
                store.restore(step, items=(item,), cast_dtypes=True)
            except CheckpointNotFoundError:
                raise
            except CheckpointCorruptError as error:
                failures.append(_failure(error.item, error.leaf, error))
                reported.add(error.path)
            except Exception as error:
                failures.append(_failure(item, None, error))
        failures += _dtype_failures(store, step)
        failures += _metadata_failures(store, step, reported)
    except CheckpointNotFoundError:
        return None
    except Exception as error:
        failures.append(_failure(None, None, error))
    unique = {(f["item"], f["leaf"], f["error"]): f for f in failures}  # one damaged dtypes record
    return list(unique.values())
