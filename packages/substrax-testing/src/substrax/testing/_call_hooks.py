"""What ``counted_calls`` watches, and the recorder its callbacks feed.

Each kind comes from the most public mechanism that reports it:

- ``compile``: jax's own monitoring event, ``/jax/core/compile/backend_compile_duration``,
  recorded each time a program goes to the XLA compiler (``jax.monitoring``).
- ``dispatch``: Python's ``sys.monitoring`` sees each call of a ``jax.jit`` function or a
  ``jax.stages.Compiled``, made from Python code directly or through a ``functools.partial``
  (eager ops run through jitted primitives; the jitted function a ``Compiled`` calls in turn is
  the same dispatch, not counted again). Its ``CALL`` event fires only for calls made by Python
  bytecode: no public jax event reports an execution, so a call made from C (``map``,
  ``operator.call``) is not seen. Jax's current trace
  (read by ``substrax.runtime.top_level_check``, which imports nothing new: a late import of
  ``jax.extend`` would make warm functions retrace) leaves out the calls made while tracing.
- ``host_to_device``: ``sys.monitoring`` sees ``jax.device_put`` start (its host leaves are
  counted with ``jax.tree.leaves``) and ``jnp.asarray`` or ``jnp.array`` start when called from
  outside jax on host data (one per call: a NumPy array, a Python scalar or a list holding one),
  outside every trace; a ``device_put`` those two make is theirs, not counted again.
- ``device_to_host``: no public hook reports a host read. ``jax.transfer_guard_device_to_host``
  can forbid reads on an accelerator, but it reports them only as a C++ log line, without the
  Python caller, and never on CPU, whose reads copy nothing. So the reads are seen where every
  read passes, jax's array host read and NumPy's entry points: its converters,
  ``np.concatenate``, its ufuncs (and their ``reduce``, ...: ``np.sum`` of a list) and scalar
  types (``np.float32(x)``). CPU arrays reach NumPy through the buffer protocol, out of
  Python's sight, so an entry point's first argument is looked at: an array, or the arrays in
  a list or tuple (the others, in C, are not seen: ``np.add(1, x)``, ``numpy_array + x``);
  ``substrax.runtime`` holds the reach into jax and says why.

Custom kinds weigh every started Python function (``sys.monitoring``'s ``PY_START``: a call; a
generator or coroutine starts once, when it first runs, its resumes are not starts). Importing
this module imports no jax; building the hooks does.
"""

import dataclasses
import functools
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from types import BuiltinMethodType, CodeType, FrameType, FunctionType, MethodType

from substrax.support import check_int

from ._call_counts import (
    ALIASES,
    COMPILE,
    DEVICE_PUT,
    DEVICE_TO_HOST,
    DISPATCH,
    HOST_TO_DEVICE,
    JAX_CALL_WEIGHTS,
    KINDS,
    CallCounts,
    check_kind,
)
from ._call_keys import Keys, WeightFn, jitted_name, module_of, named_functions, within
from ._compiles import BACKEND_COMPILE_EVENT


@dataclasses.dataclass(slots=True)
class Recorder:
    """The state the callbacks share: what was counted, by whom, and the first failure."""

    keys: Keys
    weights: Mapping[str, int]
    custom: Mapping[str, WeightFn]
    thread: int
    counts: CallCounts
    failure: tuple[str, BaseException, str] | None = None  # kind, error, culprit

    def counting(self) -> bool:
        return self.failure is None and threading.get_ident() == self.thread

    def record(self, kind: str, frame: FrameType, amount: int, key: str | None = None) -> None:
        """Count ``amount`` under ``key``, or (None) the key of ``frame``."""
        if not amount or not self.counting():
            return
        try:
            key = self.keys(frame) if key is None else key
        except Exception as error:  # re-raised as CountingFailedError when the block exits
            self.failure = (kind, error, "keys")
            return
        if not isinstance(key, str):  # pyright: ignore[reportUnnecessaryIsInstance] - user code
            self.failure = (kind, TypeError(f"it returned {key!r}, not a str"), "keys")
            return
        self.counts[kind, key] += amount

    def numpy_read(
        self, value: object, frame: FrameType, uncached: Callable[[object], bool], array: type
    ) -> None:
        """Count what NumPy reads of ``value``, given first, out of Python's sight.

        That is an array it reads through the buffer protocol (a CPU array), alone or in a
        list or tuple. The others (an accelerator's arrays, bfloat16 ones) NumPy reads through
        ``__array__``, which runs jax's host read: counted where that read starts, not here.
        """
        if isinstance(value, (list, tuple)):
            n = _listed_reads(value, uncached, array)  # pyright: ignore[reportUnknownArgumentType]
        else:
            n = int(uncached(value) and _buffer_read(value))
        self.record(DEVICE_TO_HOST, frame, self.weights[DEVICE_TO_HOST] * n)

    def started(self, frame: FrameType) -> None:
        """Weigh a started function for each custom kind."""
        if not self.counting():
            return
        for kind, weight in self.custom.items():
            try:
                amount = weight(frame)
            except Exception as error:  # re-raised as CountingFailedError at exit
                self.failure = (kind, error, "weight")
                return
            if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:  # pyright: ignore[reportUnnecessaryIsInstance] - user code
                what = "a bool, not an int (return 1 or 0)"
                what = what if isinstance(amount, bool) else "not an int >= 0"
                self.failure = (kind, TypeError(f"it returned {amount!r}, {what}"), "weight")
                return
            self.record(kind, frame, amount)


def _is_int(value: object) -> bool:
    """Whether ``value`` is an int: what a caller gives is not checked by its annotation."""
    return isinstance(value, int)


def resolve_weights(
    weights: Mapping[str, int | WeightFn] | None,
) -> tuple[dict[str, int], dict[str, WeightFn]]:
    """The built-in kinds' weights (aliases resolved) and the custom kinds' weight functions.

    Raises:
        ValueError: An int weight names an unknown kind, or is negative, or a kind and its
            alias (``dispatch`` and ``jit_dispatch``) are given different weights.
        TypeError: A built-in kind's weight is not an int, or another's neither an int nor a
            weight function.
    """
    chosen: dict[str, int] = {}
    named: dict[str, str] = {}  # each built-in kind: the name its weight was given under
    custom: dict[str, WeightFn] = {}
    for name, weight in (JAX_CALL_WEIGHTS if weights is None else weights).items():
        if name == DEVICE_PUT and not callable(weight):
            if n := check_int(f"weights[{name!r}]", weight, minimum=0):  # 0: as if left out
                custom[name] = _device_put_weight(n)
        elif not (name in KINDS or name in ALIASES or callable(weight) or _is_int(weight)):
            raise TypeError(
                f"weights[{name!r}] must be a weight function (a kind of your own) or, for a "
                f"built-in kind, an int; not {weight!r}"
            )
        elif name in KINDS or name in ALIASES or not callable(weight):
            kind, value = check_kind(name), check_int(f"weights[{name!r}]", weight, minimum=0)
            if kind in chosen and chosen[kind] != value:
                first = named[kind]
                raise ValueError(
                    f"weights gives {kind} two weights: {first}={chosen[kind]} and "
                    f"{name}={value} ({'an alias' if first in ALIASES else 'the kind'} and "
                    f"{'an alias' if name in ALIASES else 'the kind'}); give one of them"
                )
            chosen[kind], named[kind] = value, name
        else:
            custom[name] = weight
    return {kind: chosen.get(kind, 0) for kind in KINDS}, custom


def _device_put_weight(weight: int) -> WeightFn:
    """0.1.22's ``device_put`` kind: each call of ``jax.device_put`` counts ``weight``."""
    import jax  # noqa: PLC0415 - importing this module imports no jax

    code = jax.device_put.__code__

    def device_put(frame: FrameType) -> int:
        return weight if frame.f_code is code else 0

    return device_put


def _numpy_readers() -> tuple[object, ...]:
    """NumPy's entry points that read their first argument on the host, watched by identity."""
    import numpy as np  # noqa: PLC0415

    converters = (np.asarray, np.array, np.asanyarray, np.ascontiguousarray, np.concatenate)
    ufuncs = (value for value in vars(np).values() if isinstance(value, np.ufunc))
    numbers = {t for t in np.sctypeDict.values() if issubclass(t, (np.number, np.bool_))}
    return (*converters, *ufuncs, *numbers)  # the numeric scalar types too: np.float32(x)


def _nested(value: list[object] | tuple[object, ...]) -> Iterator[object]:
    """The items of a (nested) list or tuple, as NumPy and ``jnp.array`` read them."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))  # pyright: ignore[reportUnknownArgumentType]
        else:
            yield item


def _buffer_read(array: object) -> bool:
    """Whether NumPy reads ``array`` through the buffer protocol, so no jax read runs.

    The others (an accelerator's arrays, bfloat16 ones) NumPy reads through ``__array__``,
    whose host read is seen where it starts.
    """
    try:
        with memoryview(array):  # pyright: ignore[reportArgumentType] - any object
            return True
    except Exception:  # NumPy falls back to __array__ on any failure
        return False


def _listed_reads(
    value: list[object] | tuple[object, ...], uncached: Callable[[object], bool], array: type
) -> int:
    """How many arrays in a list or tuple ``value`` NumPy reads out of Python's sight.

    A list of host data only (the usual one, of numbers) is told apart by its items' types,
    without looking at each item in Python.
    """
    if not any(issubclass(t, (array, list, tuple)) for t in set(map(type, value))):
        return 0
    return sum(1 for item in _nested(value) if uncached(item) and _buffer_read(item))  # pyright: ignore[reportUnknownArgumentType]


def _given_host_data(frame: FrameType, makers: tuple[CodeType, ...], array: type) -> bool:
    """Whether ``jnp.asarray`` or ``jnp.array``, started in ``frame``, was given host data.

    Only a call from outside jax counts: ``jnp.asarray`` calls ``jnp.array``, and jax's own
    conversions are its implementation's, not the caller's.
    """
    caller = frame.f_back
    if caller is None or caller.f_code in makers:
        return False
    if any(within(module_of(caller), package) for package in ("jax", "jaxlib")):
        return False
    value = frame.f_locals[frame.f_code.co_varnames[0]]
    items = _nested(value) if isinstance(value, (list, tuple)) else (value,)  # pyright: ignore[reportUnknownArgumentType]
    return any(not isinstance(v, array) and not hasattr(v, "__jax_array__") for v in items)


def _frame(depth: int) -> FrameType:
    """The frame ``depth`` levels above the caller (the frame a monitoring event came from)."""
    return sys._getframe(depth + 1)  # pyright: ignore[reportPrivateUsage] - no public equivalent


@dataclasses.dataclass(frozen=True, slots=True)
class Hooks:
    """The callbacks of one counted block, and the code objects watched on their own."""

    on_call: Callable[[CodeType, int, object, object], None]
    on_start: Callable[[CodeType, int], None]
    on_compile: Callable[..., None]
    local_codes: tuple[CodeType, ...]


def build_hooks(recorder: Recorder) -> Hooks:
    """The callbacks that feed ``recorder``: sys.monitoring's and jax's compile listener."""
    import jax  # noqa: PLC0415 - importing this module imports no jax
    from numpy import ufunc  # noqa: PLC0415

    from substrax.runtime import (  # noqa: PLC0415 - imports jax
        array_read_code,
        top_level_check,
        uncached_read_check,
    )

    chosen = recorder.weights
    dispatchers = (type(jax.jit(lambda: None)), jax.stages.Compiled)
    compiled_call = jax.stages.Compiled.__call__.__code__  # calls a jitted function in turn
    readers = frozenset(map(id, _numpy_readers()))
    value_code, put_code = array_read_code(), jax.device_put.__code__
    makers = (jax.numpy.asarray.__code__, jax.numpy.array.__code__)
    is_top_level, uncached = top_level_check(), uncached_read_check()

    named = named_functions(recorder.keys)  # a jitted one's dispatch is counted under it

    def dispatched(caller: FrameType, callee: object) -> None:
        if chosen[DISPATCH] and caller.f_code is not compiled_call and is_top_level():
            name = jitted_name(callee) if named else None
            recorder.record(DISPATCH, caller, chosen[DISPATCH], name if name in named else None)

    def on_call(code: CodeType, offset: int, callee: object, arg0: object) -> None:
        del code, offset
        kind = type(callee)
        if kind is FunctionType or kind is MethodType:
            return  # Python code, most calls: neither a dispatch nor NumPy's
        if isinstance(callee, dispatchers):
            dispatched(_frame(1), callee)  # the calling frame
        elif isinstance(callee, functools.partial) and isinstance(callee.func, dispatchers):  # pyright: ignore[reportUnknownMemberType]
            dispatched(_frame(1), callee.func)  # pyright: ignore[reportUnknownMemberType]
        elif (
            chosen[DEVICE_TO_HOST]
            and (type(arg0) in (list, tuple) or uncached(arg0))  # else NumPy reads no jax array
            and (
                id(callee) in readers  # a NumPy entry point, or a ufunc's reduce, accumulate, ...
                or (type(callee) is BuiltinMethodType and isinstance(callee.__self__, ufunc))
            )
        ):
            recorder.numpy_read(arg0, _frame(1), uncached, jax.Array)

    def on_start(code: CodeType, offset: int) -> None:
        del offset
        frame = _frame(1)  # the frame of the monitored function
        if recorder.custom:
            recorder.started(frame)
        if code is value_code and chosen[DEVICE_TO_HOST]:
            if uncached(frame.f_locals["self"]):  # not read before: a transfer
                recorder.record(DEVICE_TO_HOST, frame, chosen[DEVICE_TO_HOST])
        elif code is put_code and chosen[HOST_TO_DEVICE] and is_top_level():
            if frame.f_back is None or frame.f_back.f_code not in makers:  # else counted there
                leaves = jax.tree.leaves(frame.f_locals["x"])
                hosted = sum(not isinstance(leaf, jax.Array) for leaf in leaves)
                recorder.record(HOST_TO_DEVICE, frame, chosen[HOST_TO_DEVICE] * hosted)
        elif code in makers and chosen[HOST_TO_DEVICE] and is_top_level():
            hosted = _given_host_data(frame, makers, jax.Array)  # one array made: one transfer
            recorder.record(HOST_TO_DEVICE, frame, chosen[HOST_TO_DEVICE] * hosted)

    def on_compile(event: str, duration_secs: float, **kwargs: object) -> None:
        del duration_secs, kwargs
        if event == BACKEND_COMPILE_EVENT:
            recorder.record(COMPILE, _frame(1), chosen[COMPILE])  # the compiling frame

    local = ((value_code, DEVICE_TO_HOST), (put_code, HOST_TO_DEVICE))
    local += tuple((maker, HOST_TO_DEVICE) for maker in makers)
    codes = tuple(code for code, kind in local if chosen[kind])
    return Hooks(on_call=on_call, on_start=on_start, on_compile=on_compile, local_codes=codes)
