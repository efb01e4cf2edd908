"""jax's distributed coordination client: the one place substrax reaches into ``jax._src``.

jax starts a key-value coordination client in ``jax.distributed.initialize`` and uses it for
its own barriers, but exposes it under no public path (jax 0.12). substrax needs it for
agreement between processes (the checkpoint store's decisions, the preemption vote) and to
watch peers; every part reads it through :func:`distributed_state`, so when jax moves it one
import breaks, loudly, here (``test_runtime_distributed`` imports it).
"""

from __future__ import annotations

from typing import Any


def distributed_state() -> Any:  # noqa: ANN401  (jax's private GlobalState)
    """Jax's distributed global state; its ``client`` is None until ``jax.distributed`` starts.

    Example:
        >>> from substrax.runtime import distributed_state
        >>> distributed_state().client is None  # a single process
        True
    """
    from jax._src import distributed  # noqa: PLC0415 - no public path (jax 0.12)

    return distributed.global_state
