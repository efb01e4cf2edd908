"""A save's TensorStore writes, started together and awaited once rather than one array at a time.

Orbax writes each array of a tree in a coroutine of its own (open the array to create its
metadata, open it again, write each fragment) and the sharding file one array after another;
every TensorStore future it awaits wakes its event loop through a pipe, so a tree's write costs
a few milliseconds of Python per array beyond TensorStore's own work. Here every array is
opened at once, every fragment written once they are open, and the save waits for them all in
one place: the same files (the same specs, the same sharding file entries), with the Python of
a handful of calls. The writes run on the thread of the save's commit future, whose event loop
runs nothing else that could wait on them.
"""

from collections.abc import Sequence
from typing import Any

import jax
import tensorstore as ts
from orbax.checkpoint._src.metadata import sharding as sharding_metadata
from orbax.checkpoint._src.serialization import limits, replica_slices, tensorstore_utils


type Spec = dict[str, Any]
type Write = tuple[replica_slices.ReplicaSlices, Spec, ts.Context]
"""One array's write: its host slices, its TensorStore spec and the context to open it in."""


def batches(writes: Sequence[Write], limiter: limits.ByteLimiter) -> list[tuple[int, list[Write]]]:
    """``writes`` in order, in batches of fewer bytes than ``limiter`` lets be in flight at once.

    Each batch comes with its bytes, to reserve from ``limiter`` while it is written; an
    unlimited limiter takes all in one batch. An array of more bytes than the limit gets a
    batch of its own, whose reservation raises orbax's own error.
    """
    limit = limiter.max_bytes if isinstance(limiter, limits.LimitInFlightBytes) else None
    grouped: list[tuple[int, list[Write]]] = []
    total, batch = 0, list[Write]()
    for write in writes:
        nbytes = sum(fragment.nbytes for fragment in write[0].to_fragments().fragments)
        if batch and limit is not None and total + nbytes >= limit:
            grouped.append((total, batch))
            total, batch = 0, []
        total += nbytes
        batch.append(write)
    if batch:
        grouped.append((total, batch))
    return grouped


def write_arrays(
    writes: Sequence[Write],
    *,
    transaction: ts.Transaction | None,
    primary: bool,
) -> None:
    """Write each array's host slices with its spec and context; return once all are committed.

    The primary process creates each array (its metadata file); the others open it assuming
    that metadata, as orbax's per-array write does. With a ``transaction`` (an OCDBT
    checkpoint) the writes join it and the caller commits it.
    """
    opening = [
        ts.open(
            ts.Spec(spec),
            create=primary,
            open=True,
            assume_metadata=not primary,
            context=context,
            transaction=transaction,
        )
        for _, spec, context in writes
    ]
    written = [
        store[fragment.index].write(fragment.value, can_reference_source_data_indefinitely=True)
        for (slices, _, _), opened in zip(writes, opening, strict=True)
        for store in (opened.result(),)
        for fragment in slices.to_fragments().fragments
    ]
    for write in written:
        write.result()


def write_shardings(
    shardings: Sequence[tuple[jax.sharding.Sharding, str, str]], *, context: ts.Context | None
) -> None:
    """Write the ``_sharding`` file entries, ``(sharding, directory, name)`` each, in one commit.

    Only the primary process calls this, as in orbax; an entry orbax cannot describe is left
    out, as orbax leaves it out.
    """
    entries = [
        (tensorstore_utils.get_sharding_tensorstore_spec(directory, name), described)
        for sharding, directory, name in shardings
        if (described := sharding_metadata.from_jax_sharding(sharding)) is not None
    ]
    if not entries:
        return
    transaction = ts.Transaction()
    opening = [ts.open(spec, open=True, context=context) for spec, _ in entries]
    written = [
        opened.result().with_transaction(transaction).write(described.to_serialized_string())
        for opened, (_, described) in zip(opening, entries, strict=True)
    ]
    for write in written:
        write.result()
    transaction.commit_async().result()
