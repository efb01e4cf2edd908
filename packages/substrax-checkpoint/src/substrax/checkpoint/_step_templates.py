"""Steps of a tree that orbax has written once, written again from that step's files.

Orbax's ``CheckpointManager.save`` runs the same machinery at every save: about 25 short-lived
threads and 14 new event loops, and about 30 ms of CPU for a 16 MB state on a 2-core VM, on
top of writing the arrays. In a training loop that CPU comes out of the step. Yet every file of
a step except its arrays' chunks, the store's metadata record and orbax's step metadata is the
same at every step of one tree: orbax derives those files from the tree's structure and each
leaf's shape, dtype and sharding, and the store's ``dtypes`` record from the dtypes.

So once orbax has written a step of a tree, :func:`capture` reads that step's files into a
:class:`StepTemplate`. :func:`write_step` writes a later step of the same tree (the same
:func:`signature`) itself:

* the template's files, byte for byte;
* the record;
* orbax's step metadata with the new step's timestamps;
* each array through TensorStore, with the zarr metadata orbax gave it.

It writes them in a temporary directory that one rename commits, as orbax commits. Orbax, and
the store's reads, read such a step as one of their own.

Example:
    >>> import tempfile
    >>> import numpy as np
    >>> from substrax.checkpoint import OrbaxCheckpointStore
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     with OrbaxCheckpointStore(directory) as store:
    ...         for step in (1, 2):  # orbax writes step 1; the store writes step 2 like it
    ...             _ = store.save(step, {"model": {"w": np.full(3, step, np.float32)}})
    ...         store.restore(2).items["model"]["w"].tolist()
    [2.0, 2.0, 2.0]
"""

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jax
import numpy as np
import tensorstore as ts

from . import _trees
from ._checksums import unsynced
from ._errors import CheckpointStoreRemovedError
from ._formats import DTYPES_ITEM, METADATA_ITEM
from ._protocol import PyTree


type Signature = tuple[object, ...]
"""What a step's files other than its arrays' chunks depend on: see :func:`signature`."""

STEP_METADATA: Final = "_CHECKPOINT_METADATA"
"""Orbax's step metadata file: its item handlers and the step's timestamps."""
_ZARR: Final = "zarr.json"
_RECORD: Final = f"{METADATA_ITEM}/metadata"  # the JSON handler's file in the ``metadata`` item
_DTYPES: Final = f"{DTYPES_ITEM}/metadata"
_CONTEXT: Final = unsynced(None)  # one TensorStore context for every save (no fsync, as orbax's)


def signature(items: Mapping[str, PyTree], dtypes: Mapping[str, Any]) -> Signature | None:
    """What the files of a step of ``items`` depend on, or None when only orbax writes them.

    The items' names, their tree structures, each leaf's kind, shape, dtype and (for a
    ``jax.Array``) sharding, and the step's ``dtypes`` record. A leaf other than a ``jax.Array``
    or a NumPy array (a Python scalar or string) leaves the step to orbax.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._step_templates import signature
        >>> a = signature({"model": {"w": np.zeros(2)}}, {})
        >>> a == signature({"model": {"w": np.ones(2)}}, {})
        True
        >>> a == signature({"model": {"w": np.zeros(3)}}, {})
        False
        >>> signature({"model": {"w": 1.0}}, {}) is None
        True
    """
    parts: list[object] = [json.dumps(dtypes, sort_keys=True)]
    for name in sorted(items):
        leaves, treedef = jax.tree_util.tree_flatten(items[name])
        described: list[tuple[object, ...]] = []
        for leaf in leaves:
            if isinstance(leaf, jax.Array):
                described.append(("jax", leaf.shape, leaf.dtype, leaf.sharding))
            elif isinstance(leaf, np.ndarray):
                described.append(("numpy", leaf.shape, leaf.dtype))  # pyright: ignore[reportUnknownMemberType]
            else:
                return None
        parts.append((name, treedef, tuple(described)))
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class StepTemplate:
    """The files orbax wrote for one step of a tree, to write later steps of the same tree.

    Attributes:
        signature: the :func:`signature` of the tree.
        source: the step directory the files were read from (its path, as the files name it).
        files: every file but the arrays', the record and the step metadata, by relative path.
        arrays: each item's array directories, in the order of its leaves, with their zarr
            metadata.
        step_metadata: orbax's step metadata, to be written with the new step's timestamps.
    """

    signature: Signature
    source: Path
    files: dict[str, bytes]
    arrays: dict[str, tuple[tuple[str, dict[str, Any]], ...]]
    step_metadata: dict[str, Any]


def _array_value(leaf: object) -> object:
    """The values of ``leaf`` as stored: a typed PRNG key's key data."""
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf)
    return leaf


def _fits(metadata: Mapping[str, Any], leaf: object) -> bool:
    """Whether the zarr ``metadata`` stores ``leaf``: its shape and dtype."""
    value = _array_value(leaf)
    shape = list(getattr(value, "shape", ()))
    dtype = str(np.dtype(getattr(value, "dtype", None)))
    return metadata.get("shape") == shape and metadata.get("data_type") == dtype


def capture(
    step_dir: Path,
    items: Mapping[str, PyTree],
    dtypes: Mapping[str, Any],
    key: Signature,
) -> StepTemplate | None:
    """The template of the committed step ``step_dir``, which orbax wrote from ``items``.

    None when its files are not what :func:`write_step` can write again: a ``dtypes`` record
    other than ``dtypes``, an array directory that no leaf names, a leaf without an array of
    its shape and dtype, an unreadable file.
    """
    files: dict[str, bytes] = {}
    zarr: dict[str, dict[str, Any]] = {}
    step_metadata: dict[str, Any] | None = None
    try:
        for root, folders, names in os.walk(step_dir):
            relative = Path(root).relative_to(step_dir).as_posix()
            if _ZARR in names:  # an array: its metadata, never its chunks (nor their folders)
                zarr[relative] = json.loads((Path(root) / _ZARR).read_bytes())
                folders.clear()
                continue
            for name in names:
                path = (Path(relative) / name).as_posix()
                if path == STEP_METADATA:
                    step_metadata = json.loads((step_dir / path).read_bytes())
                elif path != _RECORD:
                    files[path] = (step_dir / path).read_bytes()
    except (OSError, ValueError):
        return None
    try:
        recorded = json.loads(files.get(_DTYPES, b"null"))
    except ValueError:
        return None
    if step_metadata is None or recorded != json.loads(json.dumps(dtypes)):
        return None
    arrays: dict[str, tuple[tuple[str, dict[str, Any]], ...]] = {}
    for name, tree in items.items():
        found: list[tuple[str, dict[str, Any]]] = []
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            directory = f"{name}/" + ".".join(
                [_trees.WRAPPER, *(_trees.key_name(entry) for entry in path)]
            )
            metadata = zarr.get(directory)
            if metadata is None or not _fits(metadata, leaf):
                return None
            found.append((directory, metadata))
        arrays[name] = tuple(found)
    if sum(len(found) for found in arrays.values()) != len(zarr):
        return None
    return StepTemplate(key, step_dir, files, arrays, step_metadata)


def _writes(store: ts.TensorStore, leaf: object) -> list[ts.WriteFutures]:
    """Write ``leaf`` into ``store``: a ``jax.Array`` shard by shard, each replica once."""
    value = _array_value(leaf)
    if not isinstance(value, jax.Array):
        return [store.write(np.asarray(value), can_reference_source_data_indefinitely=True)]
    return [
        store[shard.index].write(
            np.asarray(shard.data), can_reference_source_data_indefinitely=True
        )
        for shard in value.addressable_shards
        if shard.replica_id == 0
    ]


def _settle(futures: list[Any]) -> None:
    """Wait for every TensorStore future in ``futures``, whatever each ends in."""
    for future in futures:
        with contextlib.suppress(Exception):  # the write's own error is the one raised
            future.result()


def _write_into(
    temporary: Path,
    template: StepTemplate,
    final: Path,
    items: Mapping[str, PyTree],
    record: Mapping[str, Any],
    *,
    pending: list[Any],
) -> None:
    """Write every file of the step under ``temporary``; ``pending`` collects the futures."""
    started = time.time_ns()
    old, new = os.fsencode(template.source), os.fsencode(final)
    if temporary.exists():  # what a failed write of this step left
        shutil.rmtree(temporary)
    arrays = [entry for found in template.arrays.values() for entry in found]
    folders = {str(Path(path).parent) for path in template.files} | {d for d, _ in arrays}
    folders.add(METADATA_ITEM)
    for folder in sorted(folders):
        (temporary / folder).mkdir(parents=True, exist_ok=True)
    opening = [
        ts.open(
            {
                "driver": "zarr3",
                "kvstore": {"driver": "file", "path": f"{temporary / directory}/"},
                "metadata": metadata,
                "store_data_equal_to_fill_value": True,
            },
            create=True,
            context=_CONTEXT,
        )
        for directory, metadata in arrays
    ]
    pending.extend(opening)
    for path, data in template.files.items():
        (temporary / path).write_bytes(data.replace(old, new))
    (temporary / _RECORD).write_text(json.dumps(record))
    leaves = [leaf for name in template.arrays for leaf in jax.tree.leaves(items[name])]
    for opened, leaf in zip(opening, leaves, strict=True):
        pending.extend(_writes(opened.result(), leaf))
    for write in pending:
        write.result()
    step_metadata = dict(
        template.step_metadata, init_timestamp_nsecs=started, commit_timestamp_nsecs=time.time_ns()
    )
    (temporary / STEP_METADATA).write_text(json.dumps(step_metadata))


def _commit(temporary: Path, final: Path, template: StepTemplate, *, intact: bool) -> None:
    """Rename ``temporary`` to ``final`` when it holds every file and the store still stands.

    Raises:
        CheckpointStoreRemovedError: the store's directory was removed (or its writer lock file
            replaced) during the write: its files are missing, or the lock is.
    """
    missing = [path for path in (*template.files, _RECORD) if not (temporary / path).is_file()]
    if missing or not intact:
        raise CheckpointStoreRemovedError(directory=final.parent)
    temporary.rename(final)


def write_step(
    template: StepTemplate,
    final: Path,
    temporary: Path,
    items: Mapping[str, PyTree],
    record: Mapping[str, Any],
    *,
    intact: Callable[[], bool] = lambda: True,
) -> None:
    """Write ``items`` (of ``template``'s signature) and ``record`` as the step ``final``.

    Everything is written under ``temporary``, which one rename makes ``final`` once every
    file is there and ``intact()`` says the store still stands (it is not renamed into a store
    that was removed meanwhile: TensorStore would have made its folders again). A failed write
    waits for the writes it started, removes ``temporary`` and raises. The arrays' buffers must
    stay in place until this returns.
    """
    pending: list[Any] = []
    try:
        _write_into(temporary, template, final, items, record, pending=pending)
        _commit(temporary, final, template, intact=intact())
    except BaseException:
        _settle(pending)
        shutil.rmtree(temporary, ignore_errors=True)
        raise
