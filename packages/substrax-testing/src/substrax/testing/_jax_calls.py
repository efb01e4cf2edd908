"""Count the jax calls a block makes: dispatches, host transfers and compilations, by package.

A training loop that reads a value on the host every step (``float(loss)``, printing, a
``np.asarray``), hands NumPy data to jax every step, or retraces, runs slower than it should and
gives no error. ``counted_calls`` counts these events in a block, attributed to the package
whose code made them, and ``per_iteration`` turns two loop lengths into an exact count per
iteration, so a test can assert a loop makes one dispatch and no host transfer per step.

The counting uses ``sys.monitoring`` (Python 3.12+) for the Python-level calls, jax's current
trace (read without importing anything, so warm functions stay warm) to leave out calls made
while tracing, and jax's own compile event
(``jax.monitoring``) for compilations; ``_call_hooks`` says which mechanism reports each kind.
The kinds and counts live in ``_call_counts``, the keys and weights in ``_call_keys``; the
public ones are importable from here too. Importing this module imports no jax; entering
``counted_calls`` does.
"""

import gc
import sys
import threading
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from typing import Any

from substrax.support import check_int

from ._call_counts import (
    COMPILE,
    DEVICE_PUT,
    DEVICE_TO_HOST,
    DISPATCH,
    CallCounts,
    counted_kind,
)
from ._call_hooks import Recorder, build_hooks, resolve_weights
from ._call_keys import Keys, WeightFn, by_package, started
from ._errors import (
    CountingFailedError,
    ToolIdsInUseError,
    TooManyCallsError,
    UnevenCountError,
)


__all__ = [  # CallCounts, Keys, WeightFn, by_package and started are importable from here too
    "CallCounts",
    "Keys",
    "WeightFn",
    "by_package",
    "counted_calls",
    "per_iteration",
    "started",
]

_TOOL_NAME = "substrax.testing.counted_calls"
# Tried in this order: the ids Python leaves unassigned first, then the optimizer's, the
# profiler's, coverage's and the debugger's.
_TOOL_ORDER = (3, 4, 5, 2, 1, 0)


def _claim_tool_id() -> int:
    monitoring = sys.monitoring
    for tool in _TOOL_ORDER:
        if monitoring.get_tool(tool) is None:
            try:
                monitoring.use_tool_id(tool, _TOOL_NAME)
            except ValueError:  # taken between the check and the claim
                continue
            return tool
    in_use = tuple(str(monitoring.get_tool(tool)) for tool in range(6))
    raise ToolIdsInUseError(in_use)


@contextmanager
def _listening(listener: Callable[..., None], *, listen: bool) -> Generator[None]:
    from jax import monitoring  # noqa: PLC0415

    if not listen:
        yield
        return
    monitoring.register_event_duration_secs_listener(listener)
    try:
        yield
    finally:
        monitoring.unregister_event_duration_listener(listener)


@contextmanager
def counted_calls(
    keys: Keys | None = None, *, weights: Mapping[str, int | WeightFn] | None = None
) -> Generator[CallCounts]:
    """Count the jax calls (or any Python functions) the block makes, by kind and package.

    Counted, on the thread that entered the block, with the garbage collector paused (as in
    0.1.22: a finalizer run by a collection would add its calls): compiled programs run from
    Python at the top level (a ``jax.jit`` function, called directly or through
    ``functools.partial``, or an eager op; calls made while tracing are not dispatches), host
    values given to ``jax.device_put`` (one per leaf) or, by code outside jax, to
    ``jnp.asarray`` or ``jnp.array`` (one per call), reads of an array's value on the host
    that were not cached, and XLA compilations.

    Known limits: ``sys.monitoring`` sees the calls Python code makes, not those made from C.
    A jitted function that C calls (``map(step, xs)``) runs unseen, with no public jax event
    to report it: call it from Python (``[step(x) for x in xs]``, a ``for`` loop). On CPU,
    NumPy reads an array through the buffer protocol, out of Python's sight: what its
    converters, ``np.concatenate``, its ufuncs (and their ``reduce`` as ``np.sum`` calls it)
    and scalar types (``np.float32(x)``) are given first is counted, an array or the arrays in
    a list or tuple, but not a later argument (``np.add(1, x)``), a ufunc method called as
    ``np.add.reduce(x)`` (Python reports the ufunc, not ``x``), nor a read started from C
    (``numpy_array + x``); on other devices each such read runs jax's host read and is
    counted. A NumPy array passed straight to a jitted function (or a ``jnp`` op) is moved
    inside jax's C++ dispatch: forbid those with
    ``jax.transfer_guard_host_to_device("disallow")``.

    Any other kind is counted with a weight function (:data:`WeightFn`, :func:`started` builds
    one): every Python function started on that thread is weighed (once per call: a generator
    is weighed when it first runs, not at each resume), and counted under the key of its own
    frame. ``weights={"device_put": 1}`` (0.1.22's name) counts the calls of
    ``jax.device_put``, traced ones included.

    Args:
        keys: Names the package of each call from the frame it was made in; default:
            ``by_package()`` (the first package outside jax).
        weights: How much each kind counts, by kind (default :data:`JAX_CALL_WEIGHTS`): an int
            for the :data:`KINDS` (or their :data:`ALIASES`) and ``device_put``, a weight
            function for a kind of your own. A kind left out or weighted 0 is not counted.

    Yields:
        The counts, filled as the block runs; their ``uncounted`` names the built-in kinds
        ``weights`` left out or weighted 0.

    Raises:
        ValueError: An int weight names an unknown kind, or a kind and its alias get different
            weights.
        TypeError: A built-in kind's weight is not an int.
        ToolIdsInUseError: Every ``sys.monitoring`` tool id is taken (a debugger, profiler
            or coverage tool holds them all).
        CountingFailedError: The keys function raised (or returned a non-str), or a weight
            function raised (or returned no int >= 0, or a bool), inside the block; raised when
            the block exits normally, from that error.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from substrax.testing import by_package, counted_calls
        >>> double, x = jax.jit(lambda x: 2 * x), jnp.ones(3)
        >>> with counted_calls(by_package("doctest")) as calls:
        ...     y = double(double(x))  # the first call compiles
        ...     values = np.asarray(y)
        >>> calls.kinds()
        {'dispatch': 2, 'host_to_device': 0, 'device_to_host': 1, 'compile': 1}
    """
    chosen, custom = resolve_weights(weights)
    recorder = Recorder(
        keys=keys or by_package(),
        weights=chosen,
        custom=custom,
        thread=threading.get_ident(),
        counts=CallCounts(
            custom_kinds=tuple(custom), uncounted=tuple(k for k, n in chosen.items() if not n)
        ),
    )
    hooks = build_hooks(recorder)
    events = sys.monitoring.events
    tool = _claim_tool_id()
    collecting = gc.isenabled()
    gc.disable()  # no collection in the block: a finalizer's calls would be counted
    try:
        sys.monitoring.register_callback(tool, events.CALL, hooks.on_call)
        sys.monitoring.register_callback(tool, events.PY_START, hooks.on_start)
        with _listening(hooks.on_compile, listen=bool(chosen[COMPILE])):
            for code in hooks.local_codes:
                sys.monitoring.set_local_events(tool, code, events.PY_START)
            calls = events.CALL if chosen[DISPATCH] or chosen[DEVICE_TO_HOST] else 0
            sys.monitoring.set_events(tool, calls | (events.PY_START if custom else 0))
            try:
                yield recorder.counts
            finally:
                sys.monitoring.set_events(tool, 0)
                for code in hooks.local_codes:
                    sys.monitoring.set_local_events(tool, code, 0)
    finally:
        sys.monitoring.register_callback(tool, events.CALL, None)
        sys.monitoring.register_callback(tool, events.PY_START, None)
        sys.monitoring.free_tool_id(tool)
        if collecting:
            gc.enable()
    if recorder.failure is not None:
        kind, error, culprit = recorder.failure
        raise CountingFailedError(kind, f"{type(error).__name__}: {error}", culprit) from error


def per_iteration[K](
    count_fn: Callable[[int], Mapping[K, int]],
    *,
    short: int,
    long: int,
    at_most: Mapping[str, int] | None = None,
) -> dict[K, int]:
    """The calls one loop iteration makes, from two runs of different lengths.

    ``count_fn(n)`` runs ``n`` iterations inside :func:`counted_calls` and returns the counts.
    What the two runs share (setup, a final read) cancels out; what is left must grow by a
    whole number per iteration, key by key. Warm the loop up first: a first iteration that
    compiles makes the first run differ from the second. Counts of another shape (any mapping
    from a key to a count, like 0.1.22's ``Counter``) are taken key by key, and ``at_most``
    then limits keys. The first run's counts are copied before the second run, so ``count_fn``
    may return the same counter both times.

    Args:
        count_fn: Runs ``n`` iterations and returns their counts.
        short: Iterations of the first run (at least 0).
        long: Iterations of the second run (more than ``short``).
        at_most: The most calls one iteration may make, by kind (by key for other counts).

    Returns:
        The counts of one iteration: a :class:`CallCounts` (by kind and package) when
        ``count_fn`` returns those, else a dict by key; zero counts are left out.

    Raises:
        ValueError: ``long`` is not more than ``short``, or ``at_most`` names an unknown kind
            or one ``count_fn``'s ``counted_calls`` did not count, or (for counts of another
            shape) a key neither run's counts hold: its limit could not fail.
        TypeError: ``count_fn`` returned something other than a mapping of counts.
        UnevenCountError: A count did not grow by a whole, non-negative number per iteration.
        TooManyCallsError: An iteration made more calls of a kind than ``at_most`` allows.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from substrax.testing import counted_calls, per_iteration
        >>> step, x = jax.jit(lambda x: x + 1), jnp.ones(3)
        >>> x = step(x)  # warm up: the first call compiles
        >>> def count(n):
        ...     global x
        ...     with counted_calls() as calls:
        ...         for _ in range(n):
        ...             x = step(x)
        ...     return calls
        >>> per_iteration(count, short=1, long=3, at_most={"device_to_host": 0}).kinds()
        {'dispatch': 1, 'host_to_device': 0, 'device_to_host': 0, 'compile': 0}
        >>> per_iteration(lambda n: {"steps": 2 * n + 1}, short=1, long=3)
        {'steps': 2}
    """
    first = check_int("short", short, minimum=0)
    second = check_int("long", long, minimum=0)
    if second <= first:
        raise ValueError(f"long={long} must be more than short={short}")
    limits = {
        kind: check_int(f"at_most[{kind!r}]", n, minimum=0) for kind, n in (at_most or {}).items()
    }
    before = _kept(count_fn(first))  # a copy: count_fn may return one counter twice
    after = _kept(count_fn(second))
    if not (isinstance(before, CallCounts) and isinstance(after, CallCounts)):
        grown = _grow(before, after, first=first, second=second, keyed=False)
        for key, limit in limits.items():
            if key not in before and key not in after:  # a misspelled key would limit nothing
                seen = ", ".join(sorted(map(repr, {*before, *after}))) or "none"
                raise ValueError(
                    f"at_most names {key!r}, which neither run's counts hold (their keys: "
                    f"{seen}), so its limit cannot fail; correct the key, or have count_fn "
                    f"return it with a 0 count when nothing is counted under it"
                )
            if grown.get(key, 0) > limit:
                raise TooManyCallsError(key, limit, grown[key], ((key, grown[key]),))
        return grown
    result = CallCounts(
        custom_kinds=tuple(dict.fromkeys((*before.custom_kinds, *after.custom_kinds))),
        uncounted=(*before.uncounted, *after.uncounted),
    )
    result.update(_grow(before, after, first=first, second=second, keyed=True))
    for named, n in limits.items():
        kind = counted_kind(result, named)
        if kind in result.uncounted or (kind == DEVICE_PUT and kind not in result.custom_kinds):
            raise ValueError(  # a limit that cannot fail
                f"at_most names {named}, which was not counted (count_fn's counted_calls "
                f"weights left it out or weighted it 0), so its limit cannot fail: weight it, "
                f"counted_calls(weights={{{kind!r}: 1, ...}}), or leave it out of at_most"
            )
        if (observed := result.of(kind)) > n:
            raise TooManyCallsError(kind, n, observed, tuple(result.packages(kind).items()))
    return result  # pyright: ignore[reportReturnType] - K is (kind, package) here


def _kept(counts: Mapping[Any, int]) -> Mapping[Any, int]:
    """A copy of ``counts`` (a :class:`CallCounts` stays one, its kinds kept)."""
    if isinstance(counts, CallCounts):
        return counts.copy()
    if not isinstance(counts, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance] - user code
        raise TypeError(
            f"count_fn must return a mapping of counts (the CallCounts counted_calls yields, "
            f"or a Counter), not {counts!r}"
        )
    return dict(counts)


def _grow(
    before: Mapping[Any, int], after: Mapping[Any, int], *, first: int, second: int, keyed: bool
) -> dict[Any, int]:
    """Each key's growth per iteration from ``first`` to ``second`` iterations (zeros left out).

    ``keyed``: the keys are ``(kind, package)`` pairs, named so in an ``UnevenCountError``.
    """
    span, grown = second - first, dict[Any, int]()
    for key in sorted(set(before) | set(after), key=repr):
        was, now = before.get(key, 0), after.get(key, 0)
        if now - was < 0 or (now - was) % span:
            kind, package = key if keyed else (str(key), "the counted block")
            raise UnevenCountError(kind, package, first, was, second, now)
        if now - was:
            grown[key] = (now - was) // span
    return grown
