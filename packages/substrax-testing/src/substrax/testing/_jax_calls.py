"""Count the jax calls a block makes: dispatches, host transfers and compilations, by package.

A training loop that reads a value on the host every step (``float(loss)``, printing, a
``np.asarray``), hands NumPy data to jax every step, or retraces, runs slower than it should and
gives no error. ``counted_calls`` counts these events in a block, attributed to the package
whose code made them, and ``per_iteration`` turns two loop lengths into an exact count per
iteration, so a test can assert a loop makes one dispatch and no host transfer per step.

The counting uses ``sys.monitoring`` (Python 3.12+) for the Python-level calls and jax's own
compile event for compilations. Importing this module imports no jax; entering
``counted_calls`` does.
"""

import dataclasses
import inspect
import sys
import threading
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager
from types import CodeType, FrameType, MappingProxyType
from typing import Final

from substrax.support import check_int

from ._compiles import BACKEND_COMPILE_EVENT
from ._errors import (
    CountingFailedError,
    ToolIdsInUseError,
    TooManyCallsError,
    UnevenCountError,
)


DISPATCH: Final = "dispatch"
HOST_TO_DEVICE: Final = "host_to_device"
DEVICE_TO_HOST: Final = "device_to_host"
COMPILE: Final = "compile"
KINDS: Final = (DISPATCH, HOST_TO_DEVICE, DEVICE_TO_HOST, COMPILE)
"""What is counted: a compiled program run from Python at the top level (``dispatch``), a host
value handed to ``jax.device_put`` (``host_to_device``, one per leaf), an array's value read on
the host (``device_to_host``: ``float()``, ``np.asarray``, ``.tolist()``, printing) and an XLA
compilation (``compile``)."""

JAX_CALL_WEIGHTS: Final[Mapping[str, int]] = MappingProxyType(dict.fromkeys(KINDS, 1))
"""The default weights: every kind counts once per event. A kind weighted 0 is not counted."""

DEFAULT_EXCLUDED: Final = (
    "jax",
    "jaxlib",
    "numpy",
    "threading",
    "queue",
    "contextlib",
    "functools",
)
"""Packages ``by_package`` looks through to find the code that made a call."""

_TOOL_NAME = "substrax.testing.counted_calls"
# Tried in this order: the ids Python leaves unassigned first, then the optimizer's, the
# profiler's, coverage's and the debugger's.
_TOOL_ORDER = (3, 4, 5, 2, 1, 0)

type Keys = Callable[[FrameType], str]
"""Maps the frame a call was made in (the innermost one) to the key it is counted under."""


class CallCounts(Counter[tuple[str, str]]):
    """Counts keyed by ``(kind, package)``; ``kind`` is one of :data:`KINDS`.

    Example:
        >>> from substrax.testing import CallCounts
        >>> counts = CallCounts({("dispatch", "substrax"): 2, ("dispatch", "other"): 1})
        >>> counts.of("dispatch"), counts.of("dispatch", "other"), counts.of("compile")
        (3, 1, 0)
        >>> counts.packages("dispatch")
        {'other': 1, 'substrax': 2}
    """

    def of(self, kind: str, package: str | None = None) -> int:
        """The count of one kind, overall or for one package.

        Args:
            kind: One of :data:`KINDS`.
            package: A key the keys function returned; None sums over all of them.

        Returns:
            The count (0 when nothing of that kind was seen).

        Raises:
            ValueError: ``kind`` is not one of :data:`KINDS`.
        """
        _check_kind(kind)
        if package is not None:
            return self[kind, package]
        return sum(count for (seen, _), count in self.items() if seen == kind)

    def kinds(self) -> dict[str, int]:
        """Every kind's overall count, zeros included, in the order of :data:`KINDS`.

        Returns:
            ``{kind: count}``.
        """
        return {kind: self.of(kind) for kind in KINDS}

    def packages(self, kind: str) -> dict[str, int]:
        """One kind's counts by package, sorted by package.

        Args:
            kind: One of :data:`KINDS`.

        Returns:
            ``{package: count}`` for the packages with a non-zero count.

        Raises:
            ValueError: ``kind`` is not one of :data:`KINDS`.
        """
        _check_kind(kind)
        return {p: n for (k, p), n in sorted(self.items()) if k == kind and n}


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown call kind {kind!r}; the kinds are {', '.join(KINDS)}")
    return kind


def _module_of(frame: FrameType) -> str:
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else "?"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def by_package(
    *packages: str, excluded: Sequence[str] = DEFAULT_EXCLUDED, other: str = "other"
) -> Keys:
    """Build a keys function that names the package whose code made each call.

    The stack is walked outward from the call. With ``packages``, the key is the most specific
    listed package that the first matching frame's module belongs to (``"substrax.spmd"`` for
    code in ``substrax.spmd._train_step``), and ``other`` when no frame matches. Without
    ``packages``, the key is the top-level package of the first frame outside ``excluded``.

    Args:
        *packages: Dotted package or module names to attribute calls to.
        excluded: Packages looked through (jax's own code, say) when no ``packages`` are given.
        other: The key of a call made by none of ``packages``.

    Returns:
        A keys function for :func:`counted_calls`.

    Raises:
        ValueError: A package name is empty.

    Example:
        >>> import sys
        >>> from substrax.testing import by_package
        >>> frame = eval("sys._getframe()", {"__name__": "mylib.train", "sys": sys})
        >>> by_package("mylib", "mylib.train")(frame), by_package("mylib")(frame)
        ('mylib.train', 'mylib')
        >>> by_package("json")(frame)
        'other'
    """
    if any(not name for name in (*packages, *excluded)):
        raise ValueError("package names must be non-empty dotted names, like 'substrax.spmd'")
    listed = sorted(packages, key=len, reverse=True)  # the most specific first

    def keys(frame: FrameType) -> str:
        current: FrameType | None = frame
        while current is not None:
            module = _module_of(current)
            if listed:
                for package in listed:
                    if _within(module, package):
                        return package
            elif not any(_within(module, skipped) for skipped in excluded):
                return module.partition(".")[0]
            current = current.f_back
        return other

    return keys


@dataclasses.dataclass(slots=True)
class _Recorder:
    """The state the callbacks share: what was counted, by whom, and the first failure."""

    keys: Keys
    weights: Mapping[str, int]
    thread: int
    counts: CallCounts
    failure: tuple[str, BaseException] | None = None
    pending: object = None  # an array NumPy was just asked to read (counted already)

    def record(self, kind: str, frame: FrameType, events: int = 1) -> None:
        if self.failure is not None or threading.get_ident() != self.thread:
            return
        try:
            key = self.keys(frame)
        except Exception as error:  # re-raised as CountingFailedError when the block exits
            self.failure = (kind, error)
            return
        if not isinstance(key, str):  # pyright: ignore[reportUnnecessaryIsInstance] - user code
            self.failure = (kind, TypeError(f"the keys function returned {key!r}, not a str"))
            return
        self.counts[kind, key] += self.weights[kind] * events


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


def _numpy_readers() -> tuple[object, ...]:
    import numpy as np  # noqa: PLC0415

    return (np.asarray, np.array, np.asanyarray, np.ascontiguousarray)


def _frame(depth: int) -> FrameType:
    """The frame ``depth`` levels above the caller (the frame a monitoring event came from)."""
    return sys._getframe(depth + 1)  # pyright: ignore[reportPrivateUsage] - no public equivalent


def _value_code() -> CodeType:
    from jax._src.array import ArrayImpl  # noqa: PLC0415 - no public path for the host read

    getter = inspect.unwrap(ArrayImpl._value.fget)  # pyright: ignore[reportPrivateUsage, reportOptionalMemberAccess, reportAttributeAccessIssue, reportArgumentType]
    return getter.__code__


def _weights(weights: Mapping[str, int] | None) -> dict[str, int]:
    chosen = dict(JAX_CALL_WEIGHTS if weights is None else weights)
    for kind, weight in chosen.items():
        _check_kind(kind)
        check_int(f"weights[{kind!r}]", weight, minimum=0)
    return {kind: chosen.get(kind, 0) for kind in KINDS}


@dataclasses.dataclass(frozen=True, slots=True)
class _Hooks:
    on_call: Callable[[CodeType, int, object, object], None]
    on_start: Callable[[CodeType, int], None]
    on_compile: Callable[..., None]
    local_codes: tuple[CodeType, ...]


def _hooks(recorder: _Recorder) -> _Hooks:
    """The callbacks that feed ``recorder``: sys.monitoring's and jax's compile listener."""
    import jax  # noqa: PLC0415 - importing this module imports no jax
    from jax._src import api, core  # noqa: PLC0415 - the device_put and trace-state code

    chosen = recorder.weights
    dispatchers = (type(jax.jit(lambda: None)), jax.stages.Compiled)
    readers = frozenset(map(id, _numpy_readers()))
    value_code, put_code = _value_code(), api.device_put.__code__

    def on_call(code: CodeType, offset: int, callee: object, arg0: object) -> None:
        del code, offset
        recorder.pending = None
        if isinstance(callee, dispatchers):
            if chosen[DISPATCH] and core.trace_ctx.is_top_level():
                recorder.record(DISPATCH, _frame(1))  # the calling frame
        elif id(callee) in readers and getattr(arg0, "_npy_value", False) is None:
            # NumPy reads a CPU array through the buffer protocol, out of Python's sight; on
            # other devices it calls __array__, which reads ``_value``: count that read here
            recorder.pending = arg0
            if chosen[DEVICE_TO_HOST]:
                recorder.record(DEVICE_TO_HOST, _frame(1))

    def on_start(code: CodeType, offset: int) -> None:
        del offset
        frame = _frame(1)  # the frame of the monitored function
        if code is value_code:
            array = frame.f_locals["self"]
            if array is recorder.pending:  # counted when NumPy was called
                recorder.pending = None
            elif array._npy_value is None:  # not read before: a transfer
                recorder.record(DEVICE_TO_HOST, frame)
        elif code is put_code and core.trace_ctx.is_top_level():
            leaves = jax.tree.leaves(frame.f_locals["x"])
            hosted = sum(not isinstance(leaf, jax.Array) for leaf in leaves)
            if hosted:
                recorder.record(HOST_TO_DEVICE, frame, hosted)

    def on_compile(event: str, duration_secs: float, **kwargs: object) -> None:
        del duration_secs, kwargs
        if event == BACKEND_COMPILE_EVENT:
            recorder.record(COMPILE, _frame(1))  # the compiling frame

    local = ((value_code, DEVICE_TO_HOST), (put_code, HOST_TO_DEVICE))
    codes = tuple(code for code, kind in local if chosen[kind])
    return _Hooks(on_call=on_call, on_start=on_start, on_compile=on_compile, local_codes=codes)


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
    keys: Keys | None = None, *, weights: Mapping[str, int] | None = None
) -> Generator[CallCounts]:
    """Count the jax calls the block makes, by kind and by the package that made them.

    Counted, on the thread that entered the block: compiled programs run from Python at the
    top level (a ``jax.jit`` function or an eager op; calls made while tracing are not
    dispatches), host values given to ``jax.device_put`` (one per leaf), reads of an array's
    value on the host that were not cached, and XLA compilations. A NumPy array passed straight
    to a jitted function is moved inside jax's C++ dispatch, out of Python's sight: forbid
    those with ``jax.transfer_guard_host_to_device("disallow")``.

    Args:
        keys: Names the package of each call from the frame it was made in; default:
            ``by_package()`` (the first package outside jax).
        weights: How much each kind counts, by kind (default :data:`JAX_CALL_WEIGHTS`); a kind
            left out or weighted 0 is not counted.

    Yields:
        The counts, filled as the block runs.

    Raises:
        ValueError: A weight names an unknown kind.
        TypeError: A weight is not an int.
        ToolIdsInUseError: Every ``sys.monitoring`` tool id is taken (a debugger, profiler
            or coverage tool holds them all).
        CountingFailedError: The keys function raised (or returned a non-str) inside the
            block; raised when the block exits normally, from that error.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from substrax.testing import by_package, counted_calls
        >>> double, x = jax.jit(lambda x: 2 * x), jnp.ones(3)
        >>> with counted_calls(by_package("doctest")) as calls:
        ...     y = double(double(x))
        ...     total = float(y.sum())
        >>> calls.kinds()
        {'dispatch': 3, 'host_to_device': 0, 'device_to_host': 1, 'compile': 2}
    """
    chosen = _weights(weights)
    recorder = _Recorder(
        keys=keys or by_package(),
        weights=chosen,
        thread=threading.get_ident(),
        counts=CallCounts(),
    )
    hooks = _hooks(recorder)
    events = sys.monitoring.events
    tool = _claim_tool_id()
    try:
        sys.monitoring.register_callback(tool, events.CALL, hooks.on_call)
        sys.monitoring.register_callback(tool, events.PY_START, hooks.on_start)
        with _listening(hooks.on_compile, listen=bool(chosen[COMPILE])):
            for code in hooks.local_codes:
                sys.monitoring.set_local_events(tool, code, events.PY_START)
            if chosen[DISPATCH] or chosen[DEVICE_TO_HOST]:
                sys.monitoring.set_events(tool, events.CALL)
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
    if recorder.failure is not None:
        kind, error = recorder.failure
        raise CountingFailedError(kind, f"{type(error).__name__}: {error}") from error


def per_iteration(
    count_fn: Callable[[int], CallCounts],
    *,
    short: int,
    long: int,
    at_most: Mapping[str, int] | None = None,
) -> CallCounts:
    """The calls one loop iteration makes, from two runs of different lengths.

    ``count_fn(n)`` runs ``n`` iterations inside :func:`counted_calls` and returns the counts.
    What the two runs share (setup, a final read) cancels out; what is left must grow by a
    whole number per iteration. Warm the loop up first: a first iteration that compiles makes
    the first run differ from the second.

    Args:
        count_fn: Runs ``n`` iterations and returns their counts.
        short: Iterations of the first run (at least 0).
        long: Iterations of the second run (more than ``short``).
        at_most: The most calls of each kind one iteration may make, by kind.

    Returns:
        The counts of one iteration, by kind and package.

    Raises:
        ValueError: ``long`` is not more than ``short``, or ``at_most`` names an unknown kind.
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
    """
    first = check_int("short", short, minimum=0)
    second = check_int("long", long, minimum=0)
    if second <= first:
        raise ValueError(f"long={long} must be more than short={short}")
    limits = {
        _check_kind(kind): check_int(f"at_most[{kind!r}]", n, minimum=0)
        for kind, n in (at_most or {}).items()
    }
    before, after = count_fn(first), count_fn(second)
    span = second - first
    result = CallCounts()
    for kind, package in sorted(set(before) | set(after)):
        grown = after[kind, package] - before[kind, package]
        if grown < 0 or grown % span:
            raise UnevenCountError(
                kind, package, first, before[kind, package], second, after[kind, package]
            )
        if grown:
            result[kind, package] = grown // span
    for kind, limit in limits.items():
        observed = result.of(kind)
        if observed > limit:
            raise TooManyCallsError(kind, limit, observed, tuple(result.packages(kind).items()))
    return result
