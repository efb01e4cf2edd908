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
import sys
import threading
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager
from types import CodeType, FrameType, MappingProxyType
from typing import Any, Final

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

ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {"jit_dispatch": DISPATCH, "device_put_leaves": HOST_TO_DEVICE}
)
"""substrax 0.1.22's names of two kinds, accepted wherever a kind is named. Its third,
``device_put`` (calls of ``jax.device_put``), is a started-function kind: weighting it counts
the calls of ``jax.device_put`` under that name."""

DEVICE_PUT: Final = "device_put"

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

type WeightFn = Callable[[FrameType], int]
"""Counts started Python functions: given the frame of each function started in the block, how
many to count under its kind (0: not counted)."""


class CallCounts(Counter[tuple[str, str]]):
    """Counts keyed by ``(kind, package)``; ``kind`` is one of :data:`KINDS` or a custom kind.

    A custom kind is one ``counted_calls`` was given a weight function for (``custom_kinds``);
    the names in :data:`ALIASES` stand for the kinds they name.

    Example:
        >>> from substrax.testing import CallCounts
        >>> counts = CallCounts({("dispatch", "substrax"): 2, ("dispatch", "other"): 1})
        >>> counts.of("dispatch"), counts.of("dispatch", "other"), counts.of("compile")
        (3, 1, 0)
        >>> counts.packages("dispatch")
        {'other': 1, 'substrax': 2}
        >>> CallCounts({("steps", "mylib"): 3}, custom_kinds=("steps",)).of("steps")
        3
    """

    custom_kinds: tuple[str, ...]

    def __init__(
        self,
        counts: Mapping[tuple[str, str], int] | None = None,
        /,
        *,
        custom_kinds: Sequence[str] = (),
    ) -> None:
        super().__init__(counts or {})
        self.custom_kinds = tuple(custom_kinds)

    def of(self, kind: str, package: str | None = None) -> int:
        """The count of one kind, overall or for one package.

        Args:
            kind: One of :data:`KINDS` (or :data:`ALIASES`), or a custom kind.
            package: A key the keys function returned; None sums over all of them.

        Returns:
            The count (0 when nothing of that kind was seen).

        Raises:
            ValueError: ``kind`` is none of these.
        """
        kind = _counted_kind(self, kind)
        if package is not None:
            return self[kind, package]
        return sum(count for (seen, _), count in self.items() if seen == kind)

    def kinds(self) -> dict[str, int]:
        """Every kind's overall count, zeros included: :data:`KINDS`, then the custom kinds.

        Returns:
            ``{kind: count}``.
        """
        return {kind: self.of(kind) for kind in (*KINDS, *self.custom_kinds)}

    def packages(self, kind: str) -> dict[str, int]:
        """One kind's counts by package, sorted by package.

        Args:
            kind: One of :data:`KINDS` (or :data:`ALIASES`), or a custom kind.

        Returns:
            ``{package: count}`` for the packages with a non-zero count.

        Raises:
            ValueError: ``kind`` is none of these.
        """
        kind = _counted_kind(self, kind)
        return {p: n for (k, p), n in sorted(self.items()) if k == kind and n}


def _check_kind(kind: str) -> str:
    kind = ALIASES.get(kind, kind)
    if kind not in KINDS:
        raise ValueError(
            f"unknown call kind {kind!r}; the kinds are {', '.join(KINDS)} (or 0.1.22's "
            f"{', '.join(ALIASES)}); count other calls with a weight function"
        )
    return kind


def _counted_kind(counts: CallCounts, kind: str) -> str:
    return kind if kind in counts.custom_kinds else _check_kind(kind)


def _module_of(frame: FrameType) -> str:
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else "?"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _function_of(frame: FrameType) -> str:
    """The dotted name of the function a frame runs: ``module.qualname``."""
    return f"{_module_of(frame)}.{frame.f_code.co_qualname}"


def _check_names(what: str, names: Sequence[str]) -> tuple[str, ...]:
    for name in names:
        if not isinstance(name, str) or not name:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f"{what} must be non-empty dotted names, like 'substrax.spmd', not {name!r}"
            )
    return tuple(names)


def by_package(
    *packages: str,
    named: Sequence[str] = (),
    excluded: Sequence[str] = DEFAULT_EXCLUDED,
    other: str = "other",
) -> Keys:
    """Build a keys function that names the package (or function) whose code made each call.

    The stack is walked outward from the call. A frame running one of the ``named`` functions
    (``"module.qualname"``) is counted under that name. With ``packages``, the key is the most
    specific listed package that the first matching frame's module belongs to
    (``"substrax.spmd"`` for code in ``substrax.spmd._train_step``), and ``other`` when no frame
    matches. Without ``packages``, the key is the top-level package of the first frame outside
    ``excluded``. For a started-function kind (a weight function), the walk begins at the
    started function's own frame.

    Args:
        *packages: Dotted package or module names to attribute calls to.
        named: Dotted function names (``"mylib.train.step"``) counted under their own name.
        excluded: Packages looked through (jax's own code, say) when no ``packages`` are given.
        other: The key of a call made by none of ``packages``.

    Returns:
        A keys function for :func:`counted_calls`.

    Raises:
        ValueError: A package or function name is empty.

    Example:
        >>> import sys
        >>> from substrax.testing import by_package
        >>> frame = eval("sys._getframe()", {"__name__": "mylib.train", "sys": sys})
        >>> by_package("mylib", "mylib.train")(frame), by_package("mylib")(frame)
        ('mylib.train', 'mylib')
        >>> by_package("json")(frame), by_package("mylib", named=("mylib.train.<module>",))(frame)
        ('other', 'mylib.train.<module>')
    """
    _check_names("packages", (*packages, *excluded))
    functions = frozenset(_check_names("named", named))
    listed = sorted(packages, key=len, reverse=True)  # the most specific first

    def keys(frame: FrameType) -> str:
        current: FrameType | None = frame
        while current is not None:
            if functions and (function := _function_of(current)) in functions:
                return function
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


def started(*names: str) -> WeightFn:
    """A weight function counting the starts of the named functions, or of any in a package.

    Give it to :func:`counted_calls` as the weight of a kind of your own: each Python function
    started in the block (called, or resumed as a generator) whose dotted name
    (``"module.qualname"``) is one of ``names``, or whose module is within one of them, counts
    once under that kind.

    Args:
        *names: Dotted function, module or package names.

    Returns:
        The weight function.

    Raises:
        ValueError: No name, or an empty one.

    Example:
        >>> import json
        >>> from substrax.testing import by_package, counted_calls, started
        >>> keys = by_package("json", named=("json.dumps",))
        >>> with counted_calls(keys, weights={"calls": started("json")}) as calls:
        ...     text = json.dumps([1])
        >>> calls.packages("calls")["json.dumps"]
        1
    """
    if not names:
        raise ValueError("started() needs at least one function or package name, like 'mylib'")
    chosen = _check_names("names", names)

    def weight(frame: FrameType) -> int:
        module = _module_of(frame)
        if any(_within(module, name) for name in chosen):
            return 1
        return int(_function_of(frame) in chosen)

    return weight


@dataclasses.dataclass(slots=True)
class _Recorder:
    """The state the callbacks share: what was counted, by whom, and the first failure."""

    keys: Keys
    weights: Mapping[str, int]
    custom: Mapping[str, WeightFn]
    thread: int
    counts: CallCounts
    failure: tuple[str, BaseException] | None = None
    pending: object = None  # an array NumPy was just asked to read (counted already)

    def counting(self) -> bool:
        return self.failure is None and threading.get_ident() == self.thread

    def record(self, kind: str, frame: FrameType, amount: int) -> None:
        if not amount or not self.counting():
            return
        try:
            key = self.keys(frame)
        except Exception as error:  # re-raised as CountingFailedError when the block exits
            self.failure = (kind, error)
            return
        if not isinstance(key, str):  # pyright: ignore[reportUnnecessaryIsInstance] - user code
            self.failure = (kind, TypeError(f"the keys function returned {key!r}, not a str"))
            return
        self.counts[kind, key] += amount

    def started(self, frame: FrameType) -> None:
        """Weigh a started function for each custom kind."""
        if not self.counting():
            return
        for kind, weight in self.custom.items():
            try:
                amount = weight(frame)
            except Exception as error:  # re-raised as CountingFailedError at exit
                self.failure = (kind, error)
                return
            if not isinstance(amount, int) or amount < 0:  # pyright: ignore[reportUnnecessaryIsInstance] - user code
                self.failure = (kind, TypeError(f"the weight returned {amount!r}, not an int >= 0"))
                return
            self.record(kind, frame, amount)


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


def _weights(
    weights: Mapping[str, int | WeightFn] | None,
) -> tuple[dict[str, int], dict[str, WeightFn]]:
    """The built-in kinds' weights (aliases resolved) and the custom kinds' weight functions."""
    chosen: dict[str, int] = {}
    custom: dict[str, WeightFn] = {}
    for kind, weight in (JAX_CALL_WEIGHTS if weights is None else weights).items():
        if kind == DEVICE_PUT and not callable(weight):
            custom[kind] = _device_put_weight(check_int(f"weights[{kind!r}]", weight, minimum=0))
        elif kind in KINDS or kind in ALIASES or not callable(weight):
            chosen[_check_kind(kind)] = check_int(f"weights[{kind!r}]", weight, minimum=0)
        else:
            custom[kind] = weight
    return {kind: chosen.get(kind, 0) for kind in KINDS}, custom


def _device_put_weight(weight: int) -> WeightFn:
    """0.1.22's ``device_put`` kind: each call of ``jax.device_put`` counts ``weight``."""
    import jax  # noqa: PLC0415 - importing this module imports no jax

    code = jax.device_put.__code__

    def device_put(frame: FrameType) -> int:
        return weight if frame.f_code is code else 0

    return device_put


@dataclasses.dataclass(frozen=True, slots=True)
class _Hooks:
    on_call: Callable[[CodeType, int, object, object], None]
    on_start: Callable[[CodeType, int], None]
    on_compile: Callable[..., None]
    local_codes: tuple[CodeType, ...]


def _hooks(recorder: _Recorder) -> _Hooks:
    """The callbacks that feed ``recorder``: sys.monitoring's and jax's compile listener."""
    import jax  # noqa: PLC0415 - importing this module imports no jax

    from substrax.runtime import array_read_code, top_level_check  # noqa: PLC0415 - imports jax

    chosen = recorder.weights
    dispatchers = (type(jax.jit(lambda: None)), jax.stages.Compiled)
    readers = frozenset(map(id, _numpy_readers()))
    value_code, put_code = array_read_code(), jax.device_put.__code__
    is_top_level = top_level_check()

    def on_call(code: CodeType, offset: int, callee: object, arg0: object) -> None:
        del code, offset
        recorder.pending = None
        if isinstance(callee, dispatchers):
            if chosen[DISPATCH] and is_top_level():
                recorder.record(DISPATCH, _frame(1), chosen[DISPATCH])  # the calling frame
        elif id(callee) in readers and getattr(arg0, "_npy_value", False) is None:
            # NumPy reads a CPU array through the buffer protocol, out of Python's sight; on
            # other devices it calls __array__, which reads ``_value``: count that read here
            recorder.pending = arg0
            recorder.record(DEVICE_TO_HOST, _frame(1), chosen[DEVICE_TO_HOST])

    def on_start(code: CodeType, offset: int) -> None:
        del offset
        frame = _frame(1)  # the frame of the monitored function
        if recorder.custom:
            recorder.started(frame)
        if code is value_code and chosen[DEVICE_TO_HOST]:
            array = frame.f_locals["self"]
            if array is recorder.pending:  # counted when NumPy was called
                recorder.pending = None
            elif array._npy_value is None:  # not read before: a transfer
                recorder.record(DEVICE_TO_HOST, frame, chosen[DEVICE_TO_HOST])
        elif code is put_code and chosen[HOST_TO_DEVICE] and is_top_level():
            leaves = jax.tree.leaves(frame.f_locals["x"])
            hosted = sum(not isinstance(leaf, jax.Array) for leaf in leaves)
            if hosted:
                recorder.record(HOST_TO_DEVICE, frame, chosen[HOST_TO_DEVICE] * hosted)

    def on_compile(event: str, duration_secs: float, **kwargs: object) -> None:
        del duration_secs, kwargs
        if event == BACKEND_COMPILE_EVENT:
            recorder.record(COMPILE, _frame(1), chosen[COMPILE])  # the compiling frame

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
    keys: Keys | None = None, *, weights: Mapping[str, int | WeightFn] | None = None
) -> Generator[CallCounts]:
    """Count the jax calls (or any Python functions) the block makes, by kind and package.

    Counted, on the thread that entered the block: compiled programs run from Python at the
    top level (a ``jax.jit`` function or an eager op; calls made while tracing are not
    dispatches), host values given to ``jax.device_put`` (one per leaf), reads of an array's
    value on the host that were not cached, and XLA compilations. A NumPy array passed straight
    to a jitted function is moved inside jax's C++ dispatch, out of Python's sight: forbid
    those with ``jax.transfer_guard_host_to_device("disallow")``.

    Any other kind is counted with a weight function (:data:`WeightFn`, :func:`started` builds
    one): every Python function started on that thread is weighed, and counted under the key
    of its own frame. ``weights={"device_put": 1}`` (0.1.22's name) counts the calls of
    ``jax.device_put``, traced ones included.

    Args:
        keys: Names the package of each call from the frame it was made in; default:
            ``by_package()`` (the first package outside jax).
        weights: How much each kind counts, by kind (default :data:`JAX_CALL_WEIGHTS`): an int
            for the :data:`KINDS` (or their :data:`ALIASES`) and ``device_put``, a weight
            function for a kind of your own. A kind left out or weighted 0 is not counted.

    Yields:
        The counts, filled as the block runs.

    Raises:
        ValueError: An int weight names an unknown kind.
        TypeError: A built-in kind's weight is not an int.
        ToolIdsInUseError: Every ``sys.monitoring`` tool id is taken (a debugger, profiler
            or coverage tool holds them all).
        CountingFailedError: The keys function raised (or returned a non-str), or a weight
            function raised (or returned no int >= 0), inside the block; raised when the block
            exits normally, from that error.

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
    chosen, custom = _weights(weights)
    recorder = _Recorder(
        keys=keys or by_package(),
        weights=chosen,
        custom=custom,
        thread=threading.get_ident(),
        counts=CallCounts(custom_kinds=tuple(custom)),
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
    if recorder.failure is not None:
        kind, error = recorder.failure
        raise CountingFailedError(kind, f"{type(error).__name__}: {error}") from error


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
    then limits keys.

    Args:
        count_fn: Runs ``n`` iterations and returns their counts.
        short: Iterations of the first run (at least 0).
        long: Iterations of the second run (more than ``short``).
        at_most: The most calls one iteration may make, by kind (by key for other counts).

    Returns:
        The counts of one iteration: a :class:`CallCounts` (by kind and package) when
        ``count_fn`` returns those, else a dict by key; zero counts are left out.

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
    before, after = count_fn(first), count_fn(second)
    if not (isinstance(before, CallCounts) and isinstance(after, CallCounts)):
        grown = _grow(before, after, first=first, second=second, keyed=False)
        for key, limit in limits.items():
            if grown.get(key, 0) > limit:
                raise TooManyCallsError(key, limit, grown[key], ((key, grown[key]),))
        return grown
    result = CallCounts(
        custom_kinds=tuple(dict.fromkeys((*before.custom_kinds, *after.custom_kinds)))
    )
    result.update(_grow(before, after, first=first, second=second, keyed=True))
    for named, n in limits.items():
        kind = _counted_kind(result, named)
        if (observed := result.of(kind)) > n:
            raise TooManyCallsError(kind, n, observed, tuple(result.packages(kind).items()))
    return result  # pyright: ignore[reportReturnType] - K is (kind, package) here


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
