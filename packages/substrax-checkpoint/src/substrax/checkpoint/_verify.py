"""Verifying a step: every file against its manifest, every dtype against its record.

``python -m substrax.checkpoint verify`` reports what this finds, one entry per failure.
"""

from pathlib import Path
from typing import Any

from ._errors import CheckpointCorruptError, CheckpointNotFoundError
from ._formats import read_step
from ._manifest import Manifest, check_manifest, read_manifest
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


def _manifest_failures(step_dir: Path, manifest: Manifest) -> list[dict[str, Any]]:
    """One entry per file that differs from the step's manifest."""
    return [
        {
            "item": damage.item,
            "leaf": (damage.array or "<root>").replace(".", "/"),
            "error": f"{step_dir / damage.file}: {damage.problem} against the step's manifest; "
            "restore an earlier step",
        }
        for damage in check_manifest(step_dir, manifest)
    ]


def _read_back(
    store: OrbaxCheckpointStore, step: int, items: tuple[str, ...]
) -> list[dict[str, Any]]:
    """A step without a manifest: every item read back, one entry per item orbax cannot read."""
    failures: list[dict[str, Any]] = []
    for item in items:
        try:
            store.restore(step, items=(item,), cast_dtypes=True)
        except CheckpointNotFoundError:
            raise
        except Exception as error:
            failures.append(_failure(item, None, error))
    return failures


def verify_step(store: OrbaxCheckpointStore, step: int) -> tuple[list[dict[str, Any]] | None, bool]:
    """Check ``step``: its failures (one entry each; None: deleted meanwhile), and whether verified.

    A step with a manifest has every file checked against it (size and CRC-32C) and is
    verified; one without (written before manifests, or interrupted between orbax's commit and
    its manifest) has every item read back instead, as far as orbax's reads can tell, and is
    unverified. Both have every leaf's dtype checked against the step's dtypes record. None when
    the step was deleted while it was verified (a live writer's retention).
    """
    try:
        items = store.read_metadata(step).items
    except CheckpointNotFoundError:
        return None, False
    except Exception as error:
        return [_failure(None, None, error)], False
    step_dir = store.directory / str(step)
    failures: list[dict[str, Any]] = []
    try:
        manifest = read_manifest(step_dir)
        if manifest is not None:
            failures += _manifest_failures(step_dir, manifest)
        else:
            failures += _read_back(store, step, items)
        failures += _dtype_failures(store, step)
    except CheckpointNotFoundError:
        return None, False
    except FileNotFoundError:
        if not step_dir.is_dir():
            return None, False
        raise
    except Exception as error:
        failures.append(_failure(None, None, error))
        manifest = None
    unique = {(f["item"], f["leaf"], f["error"]): f for f in failures}  # one damaged dtypes record
    return list(unique.values()), manifest is not None
