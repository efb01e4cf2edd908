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
- a config option's thread-local override: a config context manager (``jax.enable_x64(True)``)
  overrides an option for its thread until it exits. ``jax.config.values`` shows the value as
  this thread sees it, which cannot tell a global value from an override, and
  ``jax.config.update`` sets the global value only, under an override that stays in force; so
  the testing part's config isolation reads both from jax's option holders and clears a leaked
  override the way the context manager's own exit does.

- whether jax started its backends: jax reads ``JAX_PLATFORMS``' option, ``XLA_FLAGS`` and the
  client's memory settings only then, so ``apply_runtime`` may still set them on an imported jax
  until then. No public query says so without starting them (``jax.devices()`` does).

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


def backends_started() -> bool:
    """Whether jax has started its backends (its first device query, array or compile does).

    Example:
        >>> import jax
        >>> from substrax.runtime._jax_client import backends_started
        >>> _ = jax.devices()
        >>> backends_started()
        True
    """
    from jax._src import xla_bridge  # noqa: PLC0415 - no public query that starts nothing (jax 0.12)

    return bool(xla_bridge.backends_are_initialized())


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


NO_OVERRIDE: object = object()
"""The thread-local value :func:`config_settings` gives an option that cannot have one (a flag)."""


def _config_holders() -> dict[str, Any]:
    import jax  # noqa: PLC0415 - importing this module imports no jax

    return dict(jax.config._value_holders)  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType, reportUnknownArgumentType, reportAttributeAccessIssue]


def config_settings() -> dict[str, tuple[Any, Any]]:
    """Each jax config option's global value and this thread's override of it.

    The override is jax's own "unset" marker when this thread has none, and :data:`NO_OVERRIDE`
    for an option that cannot have one.

    Example:
        >>> import jax
        >>> from substrax.runtime import config_settings
        >>> global_value, override = config_settings()["jax_enable_x64"]
        >>> with jax.enable_x64(not global_value):
        ...     config_settings()["jax_enable_x64"] == (global_value, not global_value)
        True
    """
    settings: dict[str, tuple[Any, Any]] = {}
    for name, holder in _config_holders().items():
        if hasattr(holder, "get_local"):  # a state: its context manager overrides it per thread
            settings[name] = (holder.get_global(), holder.get_local())
        else:
            settings[name] = (holder.value, NO_OVERRIDE)
    return settings


def set_config_override(name: str, value: object) -> None:
    """Set this thread's override of option ``name`` back to ``value`` (jax's unset marker too).

    Only the context manager that set an override can clear it, on exit, where it sets the
    override back to what it was and tells jax's runtime (transfer guards, NaN checks) whether
    one is still in force: a context manager of the option is made and exited as if it had been
    entered when the override was ``value``, so that jax's own exit does both.

    Example:
        >>> import jax
        >>> from substrax.runtime import config_settings, set_config_override
        >>> before = config_settings()["jax_enable_x64"][1]
        >>> jax.enable_x64(True).__enter__()  # entered, never exited
        >>> set_config_override("jax_enable_x64", before)
        >>> config_settings()["jax_enable_x64"][1] is before
        True
    """
    state: Any = _config_holders()[name]  # a jax ``State``, which jax types only privately
    manager = state(state.get_global())  # its value is unused: it is never entered
    manager.prev = value
    manager.__exit__(None, None, None)
