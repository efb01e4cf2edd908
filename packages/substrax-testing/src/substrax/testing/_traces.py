"""``TraceCounter``: count how many times a function is traced, and assert it."""

import functools
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager

from substrax.support import check_int

from ._errors import RetraceError


class TraceCounter:
    """Counts executions of a function body; under ``jax.jit`` that is once per trace.

    Wrap the Python function *before* jitting it: jit runs the body only when it traces, so
    the count is the number of traces (and, barring cache hits, of compilations).

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from substrax.testing import TraceCounter
        >>> counter = TraceCounter()
        >>> step = jax.jit(counter.wrap(lambda x: x * 2))
        >>> with counter.expect(new_traces=1):
        ...     _ = step(jnp.ones(3))
        ...     _ = step(jnp.zeros(3))  # same shape and dtype: no retrace
        >>> counter.count
        1
    """

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """How many times the wrapped functions' bodies ran so far."""
        return self._count

    def wrap[**P, R](self, fn: Callable[P, R]) -> Callable[P, R]:
        """Return ``fn`` counting each execution of its body on this counter.

        Args:
            fn: The function to count (one counter may wrap several).

        Returns:
            A function with ``fn``'s signature and metadata.

        Raises:
            TypeError: ``fn`` is not callable.
        """
        if not callable(fn):
            raise TypeError(
                f"fn={fn!r:.80} must be a callable (the function whose body to count), "
                f"not {type(fn).__name__}"
            )

        @functools.wraps(fn)
        def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            with self._lock:
                self._count += 1
            return fn(*args, **kwargs)

        return counted

    @contextmanager
    def expect(self, *, new_traces: int) -> Generator[None]:
        """Assert that the block adds exactly ``new_traces`` traces.

        Args:
            new_traces: Traces the block must add (``0`` proves nothing retraces).

        Yields:
            Nothing; the check runs when the block exits normally.

        Raises:
            TypeError: ``new_traces`` is not an int.
            ValueError: ``new_traces`` is negative.
            RetraceError: The block added a different number of traces.
        """
        expected = check_int("new_traces", new_traces, minimum=0)
        before = self._count
        yield
        observed = self._count - before
        if observed != expected:
            raise RetraceError(expected, observed)
