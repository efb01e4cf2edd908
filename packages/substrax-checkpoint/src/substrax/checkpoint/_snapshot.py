"""Host snapshots: a save's items held still in host memory while a background thread writes them.

On CPU devices a ``jax.Array`` already lives in host memory, so the copy off the device that an
asynchronous save must finish before returning costs nothing: holding a NumPy view of every
buffer is enough. A buffer with a view outstanding is never donated (jax leaves a donated
argument alone while a host view of it exists) nor freed, so the values the writer reads are the
values at the time of the save. NumPy leaves are copied (the caller may write into them), the
containers are rebuilt, and Python scalars are immutable. Arrays on accelerators need a real
copy to host, which orbax's own save makes; they get no snapshot here.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from substrax.typing import PyTree


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """Items frozen for a background write, with the views that keep their buffers in place.

    Attributes:
        items: the items, with the caller's containers and NumPy leaves copied.
        pins: host views of every array buffer; drop them once the writer holds its own.
    """

    items: dict[str, PyTree]
    pins: tuple[np.ndarray[Any, Any], ...]


def _on_host(leaf: jax.Array) -> bool:
    return all(device.platform == "cpu" for device in leaf.sharding.device_set)


def _views(leaf: jax.Array) -> list[np.ndarray[Any, Any]]:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)  # the key's own uint32 buffer, not a copy
    return [np.asarray(shard.data) for shard in leaf.addressable_shards]


def host_snapshot(items: Mapping[str, PyTree]) -> HostSnapshot | None:
    """Freeze ``items`` in host memory, or None when an array lives on an accelerator.

    Example:
        >>> import numpy as np
        >>> from substrax.checkpoint._snapshot import host_snapshot
        >>> weights = np.ones(3, np.float32)
        >>> snapshot = host_snapshot({"model": {"w": weights}})
        >>> weights[:] = 0.0
        >>> snapshot.items["model"]["w"].tolist()
        [1.0, 1.0, 1.0]
    """
    leaves = jax.tree.leaves(dict(items))
    arrays = [leaf for leaf in leaves if isinstance(leaf, jax.Array)]
    if not all(_on_host(array) for array in arrays):
        return None
    pins = tuple(view for array in arrays for view in _views(array))

    def freeze(leaf: object) -> object:
        return leaf.copy() if isinstance(leaf, np.ndarray) else leaf

    return HostSnapshot({name: jax.tree.map(freeze, tree) for name, tree in items.items()}, pins)
