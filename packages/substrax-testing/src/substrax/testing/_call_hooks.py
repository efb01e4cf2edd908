"""What ``counted_calls`` watches, and the recorder its callbacks feed.

Each kind comes from the most public mechanism that reports it:

- ``compile``: jax's own monitoring event, ``/jax/core/compile/backend_compile_duration``,
  recorded each time a program goes to the XLA compiler (``jax.monitoring``).
- ``dispatch``: Python's ``sys.monitoring`` sees each call of a ``jax.jit`` function or a
  ``jax.stages.Compiled`` (eager ops run through jitted primitives; the jitted function a
  ``Compiled`` calls in turn is the same dispatch, not counted again); jax's current trace
  (read by ``substrax.runtime.top_level_check``, which imports nothing new: a late import of
  ``jax.extend`` would make warm functions retrace) leaves out the calls made while tracing.
- ``host_to_device``: ``sys.monitoring`` sees ``jax.device_put`` start; its host leaves are
  counted with ``jax.tree.leaves``, outside every trace.
- ``device_to_host``: no public hook reports a host read. ``jax.transfer_guard_device_to_host``
  can forbid reads on an accelerator, but it reports them only as a C++ log line, without the
  Python caller, and never on CPU, whose reads copy nothing. So the reads are seen where every
  read passes, jax's array host read and NumPy's converters (CPU arrays reach NumPy through the
  buffer protocol, out of Python's sight); ``substrax.runtime`` holds that reach into jax and
  says why.

Custom kinds weigh every started Python function (``sys.monitoring``'s ``PY_START``: a call; a
generator or coroutine starts once, when it first runs, its resumes are not starts). Importing
this module imports no jax; building the hooks does.
"""

import dataclasses
import sys
import threading
from collections.abc import Callable, Mapping
from types import CodeType, FrameType

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
from ._call_keys import Keys, WeightFn
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
    pending: object = None  # an array NumPy was just asked to read (counted already)

    def counting(self) -> bool:
        return self.failure is None and threading.get_ident() == self.thread

    def record(self, kind: str, frame: FrameType, amount: int) -> None:
        if not amount or not self.counting():
            return
        try:
            key = self.keys(frame)
        except Exception as error:  # re-raised as CountingFailedError when the block exits
            self.failure = (kind, error, "keys")
            return
        if not isinstance(key, str):  # pyright: ignore[reportUnnecessaryIsInstance] - user code
            self.failure = (kind, TypeError(f"it returned {key!r}, not a str"), "keys")
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
                self.failure = (kind, error, "weight")
                return
            if not isinstance(amount, int) or amount < 0:  # pyright: ignore[reportUnnecessaryIsInstance] - user code
                self.failure = (
                    kind,
                    TypeError(f"it returned {amount!r}, not an int >= 0"),
                    "weight",
                )
                return
            self.record(kind, frame, amount)


def resolve_weights(
    weights: Mapping[str, int | WeightFn] | None,
) -> tuple[dict[str, int], dict[str, WeightFn]]:
    """The built-in kinds' weights (aliases resolved) and the custom kinds' weight functions.

    Raises:
        ValueError: An int weight names an unknown kind, or is negative.
        TypeError: A built-in kind's weight is not an int.
    """
    chosen: dict[str, int] = {}
    custom: dict[str, WeightFn] = {}
    for kind, weight in (JAX_CALL_WEIGHTS if weights is None else weights).items():
        if kind == DEVICE_PUT and not callable(weight):
            custom[kind] = _device_put_weight(check_int(f"weights[{kind!r}]", weight, minimum=0))
        elif kind in KINDS or kind in ALIASES or not callable(weight):
            chosen[check_kind(kind)] = check_int(f"weights[{kind!r}]", weight, minimum=0)
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


def _numpy_readers() -> tuple[object, ...]:
    import numpy as np  # noqa: PLC0415

    return (np.asarray, np.array, np.asanyarray, np.ascontiguousarray)


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
    is_top_level, uncached = top_level_check(), uncached_read_check()

    def on_call(code: CodeType, offset: int, callee: object, arg0: object) -> None:
        del code, offset
        recorder.pending = None
        if isinstance(callee, dispatchers):
            caller = _frame(1)  # the calling frame
            if chosen[DISPATCH] and caller.f_code is not compiled_call and is_top_level():
                recorder.record(DISPATCH, caller, chosen[DISPATCH])
        elif id(callee) in readers and uncached(arg0):
            # NumPy reads a CPU array through the buffer protocol, out of Python's sight; on
            # other devices it calls __array__, which runs the host read: count that read here
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
            elif uncached(array):  # not read before: a transfer
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
    return Hooks(on_call=on_call, on_start=on_start, on_compile=on_compile, local_codes=codes)
