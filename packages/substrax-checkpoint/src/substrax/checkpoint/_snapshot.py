"""Snapshots: a save's items held still while a background thread hands them to orbax.

An asynchronous save must not return before the values it saves are safe from the training
step that follows (which may donate, so delete, the very buffers saved). On CPU devices a
``jax.Array`` already lives in host memory: holding a NumPy view of every buffer is enough (jax
leaves a donated argument alone while a host view of it exists), and costs nothing. An array on
an accelerator is copied on its own device, with its sharding (one batched ``jax.device_put``,
dispatched without waiting: the device's copy is far faster than the copy to host memory that
orbax then makes on the writer thread). The copy holds as much device memory as the state until
orbax has it in host memory; where the device has no room for it the save falls back to orbax's
own blocking copy on the caller's thread. NumPy leaves are copied (the caller may write into
them), the containers are rebuilt, and Python scalars are immutable.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from substrax.typing import PyTree


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Items frozen for a background write, with the views that keep CPU buffers in place.

    Attributes:
        items: the items, with accelerator arrays and NumPy leaves copied, containers rebuilt.
        pins: host views of every CPU array buffer; drop them once the writer holds its own.
    """

    items: dict[str, PyTree]
    pins: tuple[np.ndarray[Any, Any], ...]


def _on_host(leaf: jax.Array) -> bool:
    return all(device.platform == "cpu" for device in leaf.sharding.device_set)


def _views(leaf: jax.Array) -> list[np.ndarray[Any, Any]]:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)  # the key's own uint32 buffer, not a copy
    return [np.asarray(shard.data) for shard in leaf.addressable_shards]


def snapshot(items: Mapping[str, PyTree]) -> Snapshot | None:
    """Freeze ``items`` for a background write; None when the device has no room for a copy.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._snapshot import snapshot
        >>> weights = np.ones(3, np.float32)
        >>> frozen = snapshot({"model": {"w": weights}})
        >>> weights[:] = 0.0
        >>> frozen.items["model"]["w"].tolist()
        [1.0, 1.0, 1.0]
    """
    leaves, treedef = jax.tree.flatten(dict(items))
    on_device = [
        i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array) and not _on_host(leaf)
    ]
    if on_device:
        originals = [leaves[i] for i in on_device]
        try:
            copies = jax.device_put(
                originals, [leaf.sharding for leaf in originals], may_alias=False
            )
        except jax.errors.JaxRuntimeError:  # no device memory for a copy of the state
            return None
        for i, copy in zip(on_device, copies, strict=True):
            leaves[i] = copy
    pins = tuple(
        view
        for leaf in leaves
        if isinstance(leaf, jax.Array) and _on_host(leaf)
        for view in _views(leaf)
    )
    frozen = [leaf.copy() if isinstance(leaf, np.ndarray) else leaf for leaf in leaves]
    return Snapshot(jax.tree.unflatten(treedef, frozen), pins)
