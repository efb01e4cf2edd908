"""The errors of ``substrax.testing``: failed checks are ``AssertionError`` s, as pytest reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from substrax.support import StructuredError

from ._output import STDERR_TAIL_LINES, describe, tail


if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from ._child import ChildResult


class ChildFailedError(StructuredError, AssertionError):
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

    __module__ = "substrax.testing"

    result: ChildResult

    def _message(self) -> str:
        result = self.result
        return (
            f"child {describe(result.argv)} exited with status {result.returncode} after "
            f"{result.seconds:.1f} s; last {STDERR_TAIL_LINES} stderr lines:\n"
            f"{tail(result.stderr) or '(stderr was empty)'}"
        )


class ExampleNotFoundError(StructuredError, FileNotFoundError):
    """``run_example`` was given a script that does not exist.

    Attributes:
        path: The script it looked for (resolved against the repository root).

    Example:
        >>> from pathlib import Path
        >>> from substrax.testing import ExampleNotFoundError
        >>> print(ExampleNotFoundError(Path("/repo/examples/missing.py")))
        example /repo/examples/missing.py does not exist; check the path (relative paths are read from repo_root)
    """

    __module__ = "substrax.testing"
    template = (
        "example {path} does not exist; check the path (relative paths are read from repo_root)"
    )

    path: Path


class ExampleTimeoutError(StructuredError, AssertionError):
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

    __module__ = "substrax.testing"

    path: Path
    timeout: float
    stderr_tail: str

    def _message(self) -> str:
        return (
            f"example {self.path} ran past its {self.timeout:g} s timeout and was killed; make "
            f"it smaller or raise the timeout. Last stderr lines:\n{self.stderr_tail or '(none)'}"
        )


class RetraceError(StructuredError, AssertionError):
    """A block traced a function a different number of times than expected.

    Attributes:
        expected: The traces the block was expected to add.
        observed: The traces it added.

    Example:
        >>> from substrax.testing import RetraceError
        >>> print(RetraceError(1, 1 + 1))
        expected 1 new trace(s), observed 2; it retraced: look for changing shapes or dtypes, weakly typed values, Python scalars or new static arguments between calls
    """

    __module__ = "substrax.testing"

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


class CompileCountError(StructuredError, AssertionError):
    """A block compiled a different number of programs than expected.

    Attributes:
        expected: The compilations the block was expected to make.
        names: The names of the programs it compiled, in order (e.g. ``"jit(step)"``).

    Example:
        >>> from substrax.testing import CompileCountError
        >>> CompileCountError(1, ["jit(step)", "jit(step)"]).names
        ('jit(step)', 'jit(step)')
    """

    __module__ = "substrax.testing"

    expected: int
    names: Sequence[str]

    def __post_init__(self) -> None:
        self.names = tuple(self.names)
        super().__post_init__()

    def _message(self) -> str:
        listed = ", ".join(self.names) or "none"
        return (
            f"expected {self.expected} compilation(s), observed {len(self.names)}: {listed}; "
            "a repeated name means a retrace (changing shapes, dtypes, weak types or static "
            "arguments), an unexpected one an op run eagerly outside the jitted step"
        )


class RunNotFinalError(StructuredError, TimeoutError):
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

    __module__ = "substrax.testing"
    template = (
        "run {run_id} is still {state} after {timeout:.0f} s; raise the timeout or look at its logs"
    )

    run_id: str
    state: str
    timeout: float
