"""The one place substrax reaches into ``jax._src``, each use because no public path exists (jax 0.12).

- jax's distributed coordination client: jax starts it in ``jax.distributed.initialize`` for its
  own barriers; substrax needs it for agreement between processes (the checkpoint store's
  decisions, the preemption vote) and to watch peers.
- a jax array's host read: the testing part's call counting counts reads of an array's value
  on the host. No public hook reports one: ``jax.transfer_guard_device_to_host`` only logs
  (from C++, without the Python caller) or raises, and never fires on CPU, whose reads copy
  nothing; so the counting watches the property every read runs (``np.asarray``, ``float``,
  ``tolist``, printing) and asks whether the array's host copy is cached.

- whether jax is tracing: the public way to ask, ``jax.extend.core.get_opaque_trace_state``,
  costs a retrace. Importing ``jax.extend.core`` imports pallas, which registers settings that
  are part of every jit cache key: each warm jitted function of the process would retrace and
  recompile once (a first ``counted_calls`` block would count those compiles). So the current
  trace is read here from ``jax._src.core``, which jax has imported already, setting nothing.

When jax moves one of these, a call here breaks, loudly (``test_runtime_jax_client`` calls each;
``test_runtime_distributed`` and the testing part's call-counting tests use them).
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

    It reads jax's current trace on the calling thread and compares it with jax's evaluation
    trace. It imports no jax module jax has not imported already and sets nothing, so the jit
    cache keys stay as they were: warm jitted functions stay warm.

    Example:
        >>> import jax
        >>> from substrax.runtime import top_level_check
        >>> is_top_level, inside = top_level_check(), []
        >>> _ = jax.jit(lambda x: inside.append(is_top_level()) or x)(1.0)
        >>> is_top_level(), inside
        (True, [False])
    """
    from jax._src import core  # noqa: PLC0415 - no read-only public query (jax 0.12)

    context, evaluation = core.trace_ctx, core.eval_trace

    def is_top_level() -> bool:
        return context.trace is evaluation

    return is_top_level


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


def uncached_read_check() -> Callable[[object], bool]:
    """A function telling whether reading a value on the host reads a jax array's buffer.

    True for a jax array with no cached host copy (on CPU, always: its reads copy nothing, so
    jax caches none); False for a cached one and for anything else.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from substrax.runtime import uncached_read_check
        >>> uncached = uncached_read_check()
        >>> uncached(jnp.ones(2)), uncached(np.ones(2))
        (True, False)
    """
    from jax._src.array import ArrayImpl  # noqa: PLC0415 - no public path for the host cache

    # a jax that renamed its host cache fails here, when counting starts, not by counting nothing
    _ = ArrayImpl._npy_value  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue, reportUnknownMemberType]

    def uncached(value: object) -> bool:
        return isinstance(value, ArrayImpl) and value._npy_value is None  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue, reportUnknownMemberType]

    return uncached
