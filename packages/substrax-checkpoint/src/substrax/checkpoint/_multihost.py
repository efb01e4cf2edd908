"""Multi-process agreement: one process decides, every process acts on the same decision."""

import itertools
from typing import Final

import jax

from substrax.runtime import distributed_state

from ._errors import DistributedNotInitializedError


_TIMEOUT_MS: Final = 300_000
_decisions = itertools.count()


def agree(value: str, *, topic: str = "save") -> str:
    """Return process 0's ``value`` on every process (the value itself on one process).

    Every refusal of a save is decided from process 0's view of the directory, so all processes
    raise the same error or all enter the collective write. The value travels through
    ``jax.distributed``'s key-value store (no device collective), keyed by a counter that
    advances in the same order on every process.

    Example:
        >>> from substrax.checkpoint._multihost import agree
        >>> agree("exists")
        'exists'
    """
    if jax.process_count() == 1:
        return value
    client = distributed_state().client
    if client is None:
        raise DistributedNotInitializedError(
            process_count=jax.process_count(), needed_by="the checkpoint store"
        )
    key = f"substrax_checkpoint/{topic}/{next(_decisions)}"
    if jax.process_index() == 0:
        client.key_value_set(key, value)
        return value
    return str(client.blocking_key_value_get(key, _TIMEOUT_MS))


def is_primary() -> bool:
    """Whether this process writes the store's own files (the index).

    Example:
        >>> from substrax.checkpoint._multihost import is_primary
        >>> is_primary()
        True
    """
    return jax.process_index() == 0
