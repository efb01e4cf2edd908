"""The one place substrax reaches into ``jax._src``, each use because no public path exists (jax 0.12).

- jax's distributed coordination client: jax starts it in ``jax.distributed.initialize`` for its
  own barriers; substrax needs it for agreement between processes (the checkpoint store's
  decisions, the preemption vote) and to watch peers.
- whether jax is tracing: the testing part's call counting tells a real dispatch or transfer
  from a call made while tracing; ``jax.core`` exports no such test.
- the code of a jax array's host read: the call counting counts reads that transfer, not cached
  ones; no public hook reports them.

When jax moves one of these, one import breaks, loudly, here (``test_runtime_distributed`` and
the testing part's call-counting tests call each).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import CodeType
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


def top_level_check() -> Callable[[], bool]:
    """A function telling whether jax is outside every trace (a call dispatches for real).

    Example:
        >>> import jax
        >>> from substrax.runtime import top_level_check
        >>> is_top_level, inside = top_level_check(), []
        >>> _ = jax.jit(lambda x: inside.append(is_top_level()) or x)(1.0)
        >>> is_top_level(), inside
        (True, [False])
    """
    from jax._src import core  # noqa: PLC0415 - no public test for "not tracing" (jax 0.12)

    return core.trace_ctx.is_top_level


def array_read_code() -> CodeType:
    """The code object of a jax array's host read (what ``np.asarray`` of an array runs).

    Example:
        >>> from substrax.runtime import array_read_code
        >>> array_read_code().co_name
        '_value'
    """
    from jax._src.array import ArrayImpl  # noqa: PLC0415 - no public path for the host read

    getter: Any = inspect.unwrap(ArrayImpl._value.fget)  # pyright: ignore[reportPrivateUsage, reportOptionalMemberAccess, reportAttributeAccessIssue, reportArgumentType, reportUnknownArgumentType]
    return getter.__code__
