"""The errors of ``substrax.testing``: failed checks are ``AssertionError`` s, as pytest reports."""

import math
import signal
from collections.abc import Sequence
from pathlib import Path

from substrax.support import StructuredError

from ._child import ChildResult
from ._gradient_records import LeafGradientCheck
from ._output import STDERR_TAIL_LINES, describe, tail


class _TestingError(StructuredError, public_module="substrax.testing"):
    """The base of every error here: each shows as ``substrax.testing``'s, where users import it."""


class ChildFailedError(_TestingError, AssertionError):
    """A child interpreter exited with a non-zero status.

    Attributes:
        result: The failed run, with its full stdout and stderr.

    Example:
        >>> from substrax.testing import ChildFailedError, run_python
        >>> run = run_python("raise SystemExit(3)", timeout=60)
        >>> try:
        ...     run.check()
        ... except ChildFailedError as error:
        ...     error.result.returncode
        3
    """

    result: ChildResult

    def _message(self) -> str:
        result = self.result
        if result.returncode < 0:
            try:
                name = signal.Signals(-result.returncode).name
            except ValueError:
                name = f"signal {-result.returncode}"
            how = f"was killed by {name} (status {result.returncode})"
        else:
            how = f"exited with status {result.returncode}"
        return (
            f"child {describe(result.argv)} {how} after "
            f"{result.seconds:.1f} s; last {STDERR_TAIL_LINES} stderr lines:\n"
            f"{tail(result.stderr) or '(stderr was empty)'}"
        )


class ExampleNotFoundError(_TestingError, FileNotFoundError):
    """``run_example`` was given a script that does not exist.

    Attributes:
        path: The script it looked for (resolved against the repository root).

    Example:
        >>> from pathlib import Path
        >>> from substrax.testing import ExampleNotFoundError
        >>> print(ExampleNotFoundError(Path("/repo/examples/missing.py")))
        example /repo/examples/missing.py does not exist; check the path (relative paths are read from repo_root)
    """

    template = (
        "example {path} does not exist; check the path (relative paths are read from repo_root)"
    )

    path: Path


class ExampleTimeoutError(_TestingError, AssertionError):
    """An example ran past its timeout and was killed.

    Attributes:
        path: The example script.
        timeout: The limit it ran past, in seconds.
        stderr_tail: The last lines it wrote to stderr before it was killed.

    Example:
        >>> from pathlib import Path
        >>> from substrax.testing import ExampleTimeoutError
        >>> ExampleTimeoutError(Path("train.py"), 60, "step 3").timeout
        60
    """

    path: Path
    timeout: float
    stderr_tail: str

    def _message(self) -> str:
        return (
            f"example {self.path} ran past its {self.timeout:g} s timeout and was killed; make "
            f"it smaller or raise the timeout. Last stderr lines:\n{self.stderr_tail or '(none)'}"
        )


class RetraceError(_TestingError, AssertionError):
    """A block traced a function a different number of times than expected.

    Attributes:
        expected: The traces the block was expected to add.
        observed: The traces it added.

    Example:
        >>> from substrax.testing import RetraceError
        >>> print(RetraceError(1, 1 + 1))
        expected 1 new trace(s), observed 2; it retraced: look for changing shapes or dtypes, weakly typed values, Python scalars or new static arguments between calls
    """

    expected: int
    observed: int

    def _message(self) -> str:
        hint = (
            "; it retraced: look for changing shapes or dtypes, weakly typed values, "
            "Python scalars or new static arguments between calls"
            if self.observed > self.expected
            else ""
        )
        return f"expected {self.expected} new trace(s), observed {self.observed}{hint}"


class CompileCountError(_TestingError, AssertionError):
    """A block compiled a different number of programs than expected.

    Attributes:
        expected: The compilations the block was expected to make.
        names: The names of the programs it compiled, in order (e.g. ``"jit(step)"``).

    Example:
        >>> from substrax.testing import CompileCountError
        >>> CompileCountError(1, ["jit(step)", "jit(step)"]).names
        ('jit(step)', 'jit(step)')
    """

    expected: int
    names: Sequence[str]

    def _message(self) -> str:
        listed = ", ".join(self.names) or "none"
        return (
            f"expected {self.expected} compilation(s), observed {len(self.names)}: {listed}; "
            "a repeated name means a retrace (changing shapes, dtypes, weak types or static "
            "arguments), an unexpected one an op run eagerly outside the jitted step"
        )


class RunNotFinalError(_TestingError, TimeoutError):
    """A compute run was still not final when ``wait_until_final`` gave up on it.

    Attributes:
        run_id: the run's id.
        state: its last state.
        timeout: the seconds waited.

    Example:
        >>> from substrax.testing import RunNotFinalError
        >>> str(RunNotFinalError("demo-1", "running", 30))
        'run demo-1 is still running after 30 s; raise the timeout or look at its logs'
    """

    template = (
        "run {run_id} is still {state} after {timeout:.0f} s; raise the timeout or look at its logs"
    )

    run_id: str
    state: str
    timeout: float


class ToolIdsInUseError(_TestingError, RuntimeError):
    """``counted_calls`` found every ``sys.monitoring`` tool id taken.

    Attributes:
        in_use: The name of the tool holding each of the six ids.

    Example:
        >>> from substrax.testing import ToolIdsInUseError
        >>> ToolIdsInUseError(("debugger", "coverage", "profiler", "a", "b", "optimizer")).in_use[1]
        'coverage'
    """

    template = (
        "every sys.monitoring tool id is taken ({in_use}); count calls without a debugger, "
        "profiler or coverage tool attached, or leave a counted_calls block open fewer times"
    )

    in_use: tuple[str, ...]


class CountingFailedError(_TestingError, RuntimeError):
    """A keys or weight function of ``counted_calls`` failed inside the block; counting stopped.

    Attributes:
        kind: The kind of call it was attributing (``"dispatch"``, ...).
        reason: What the function raised or returned.
        culprit: Which function failed: ``"keys"`` or ``"weight"``.

    Example:
        >>> from substrax.testing import CountingFailedError
        >>> print(CountingFailedError("dispatch", "KeyError: 'x'"))
        counting stopped: the keys function failed on a dispatch (KeyError: 'x'); it gets the frame the call was made in and must return a str (by_package builds one)
    """

    kind: str
    reason: str
    culprit: str = "keys"

    def _message(self) -> str:
        if self.culprit == "weight":
            hint = "it gets the frame of each started function and must return an int >= 0"
        else:
            hint = "it gets the frame the call was made in and must return a str"
            hint += " (by_package builds one)"
        return (
            f"counting stopped: the {self.culprit} function failed on a {self.kind} "
            f"({self.reason}); {hint}"
        )


class UnevenCountError(_TestingError, AssertionError):
    """A count did not grow by a whole number per loop iteration (``per_iteration``).

    Attributes:
        kind: The kind of call.
        package: The package it was counted under.
        short: Iterations of the shorter run.
        short_count: Its count there.
        long: Iterations of the longer run.
        long_count: Its count there.

    Example:
        >>> from substrax.testing import UnevenCountError
        >>> UnevenCountError("compile", "substrax", 2, 1, 5, 0).long_count
        0
    """

    template = (
        "{kind} calls by {package}: {short_count} over {short} iteration(s) but {long_count} "
        "over {long}, {uneven}; warm the loop up before counting (a first step compiles) and "
        "look for work done only on some iterations (a retrace, a host read every k steps)"
    )

    kind: str
    package: str
    short: int
    short_count: int
    long: int
    long_count: int

    def _message(self) -> str:
        fewer = self.long_count < self.short_count  # a counter reset, or a count taken apart
        uneven = "fewer in the longer run" if fewer else "not a whole number per iteration"
        return self.template.format_map(self._fields() | {"uneven": uneven})


_CALL_HINTS = {
    "dispatch": "more programs run per step than expected: look for eager jnp ops outside the "
    "jitted step",
    "host_to_device": "host data is sent every step: keep the state on the device and place "
    "batches once",
    "device_to_host": "a value is read on the host every step (float(), np.asarray, printing, "
    "an `if` on an array), which waits for the device: read metrics every k steps",
    "compile": "the step compiles again every iteration: look for changing shapes, dtypes, "
    "weak types or static arguments",
}


class TooManyCallsError(_TestingError, AssertionError):
    """A loop iteration made more calls of a kind than allowed (``per_iteration``'s ``at_most``).

    Attributes:
        kind: The kind of call (``"device_to_host"``, ...).
        limit: The most allowed per iteration.
        observed: The calls one iteration made.
        packages: ``(package, calls)`` pairs: who made them.

    Example:
        >>> from substrax.testing import TooManyCallsError
        >>> TooManyCallsError("device_to_host", 0, 1, (("train", 1),)).observed
        1
    """

    kind: str
    limit: int
    observed: int
    packages: tuple[tuple[str, int], ...]

    def _message(self) -> str:
        who = ", ".join(f"{package}: {calls}" for package, calls in self.packages) or "none"
        known = self.kind in _CALL_HINTS  # a kind of your own (a weight function) has no hint
        what = f"{self.kind} call(s)" if known else f"call(s) of the kind {self.kind!r}"
        hint = f"; {_CALL_HINTS[self.kind]}" if known else ""
        return (
            f"each iteration makes {self.observed} {what}, more than the {self.limit} allowed "
            f"(by package: {who}){hint}"
        )


class GradientMismatchError(_TestingError, AssertionError):
    """jax's gradient disagrees with central finite differences beyond the dtype's tolerance.

    Attributes:
        worst: The worst leaf: its path, mode, dtype, element, both values and errors.
        leaves: Every checked leaf's summary, in order (one per leaf and mode).

    Example:
        >>> from substrax.testing import GradientMismatchError, LeafGradientCheck
        >>> leaf = LeafGradientCheck(
        ...     path="kernel", mode="rev", dtype="float32", index=(0,), analytic=2.0,
        ...     numeric=1.0, max_abs_error=1.0, max_rel_error=1.0, checked=3, failing=1,
        ... )
        >>> GradientMismatchError(leaf, (leaf,)).worst.path
        'kernel'
    """

    worst: LeafGradientCheck
    leaves: tuple[LeafGradientCheck, ...]

    def _message(self) -> str:
        others = [leaf for leaf in self.leaves if leaf.failing and leaf != self.worst]
        also = f"; {len(others)} other leaf check(s) failed too" if others else ""
        if not self.worst.failing and not math.isnan(self.worst.analytic):
            also += (
                "; each element was within tolerance, and only jax's check_grads along a random "
                "direction of them was not (its numbers are in the cause below): small gradients "
                "whose float32 rounding adds up, or a small error in many elements"
            )
        return (
            f"gradient check failed, worst leaf {self.worst.describe()}{also}. Look in the "
            "loss for a non-differentiable step (argmax, rounding, an integer cast), a "
            "stop_gradient or custom_vjp, or a kink within the finite-difference step (relu "
            "at 0); pass tolerance= when the dtype's default is too strict for this model"
        )


class ZeroGradientError(_TestingError, AssertionError):
    """Every gradient of a gradient check is zero, or too small to check: it proves nothing.

    Too small: below the absolute tolerance, or within the central difference's rounding of a
    loss much larger than it (``1e10 + sum(w * b)``), which lets a wrong gradient pass as well.

    Attributes:
        what: ``"parameters"`` or ``"input"``.
        leaves: How many leaves were all zero (or too small to check).
        largest: The largest gradient's magnitude: 0.0 when every gradient is zero.
        atol: The absolute tolerance every gradient is below (0.0 when they are zero).
        rounding: The rounding allowance at the largest gradient, where that is what hid it
            (more than a tenth of it; 0.0 otherwise).
        where: The leaf and element of the largest gradient (``"w[7]"``; ``""`` when unknown).
        loss: The loss's value, which the rounding grows with (0.0 when unknown).

    Example:
        >>> from substrax.testing import ZeroGradientError
        >>> print(ZeroGradientError("parameters", 2))
        every gradient with respect to the parameters is zero (2 leaves): the loss does not depend on them (a stop_gradient, an integer cast, a saturated activation, an unused branch); pass allow_zero=True if that is intended
    """

    template = (
        "every gradient with respect to the {what} is zero ({leaves} leaves): the loss does not "
        "depend on them (a stop_gradient, an integer cast, a saturated activation, an unused "
        "branch); pass allow_zero=True if that is intended"
    )

    what: str
    leaves: int
    largest: float = 0.0
    atol: float = 0.0
    rounding: float = 0.0
    where: str = ""
    loss: float = 0.0

    def _message(self) -> str:
        if not self.largest:
            return super()._message()
        if self.rounding:
            return (
                f"every gradient with respect to the {self.what} is too small beside the loss "
                f"({self.loss:.6g}) to be checked by finite differences ({self.leaves} leaves): "
                f"the largest, {self.largest:.3g} at {self.where}, passes off by up to "
                f"{self.rounding:.3g}, the difference's rounding (10 * eps * |loss| / step, "
                "more than a tenth of the gradient), so a wrong gradient would pass as well: "
                "subtract the loss's constant part for the check (its gradient is the same), "
                "or allow_zero=True"
            )
        return (
            f"every gradient with respect to the {self.what} is below the absolute tolerance "
            f"({self.leaves} leaves, the largest {self.largest:.3g}, atol={self.atol:g}), so a "
            "wrong gradient would pass as well: scale the loss up for the check (the gradients "
            "scale with it), pass a tolerance with a smaller atol, or allow_zero=True"
        )
