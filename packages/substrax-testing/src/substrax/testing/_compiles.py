"""Count XLA compilations with jax's monitoring events.

jax records ``/jax/core/compile/backend_compile_duration`` each time it hands a program to
the XLA compiler (a persistent-cache hit still counts, an in-memory jit cache hit does not).
Listening to it proves a training step compiles once, whatever traced it. Importing this
module imports no jax; entering the context managers does.

Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from substrax.testing import expect_compiles
    >>> step, x = jax.jit(lambda x: x + 1), jnp.ones(3)
    >>> with expect_compiles(1):
    ...     x = step(x)
    ...     x = step(x)
"""

import threading
from collections.abc import Generator
from contextlib import contextmanager

from substrax.support import check_int

from ._errors import CompileCountError


BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextmanager
def compiled_programs() -> Generator[list[str]]:
    """Collect the names of the programs XLA compiles inside the block.

    The listener is process-wide: compilations started by other threads while the block runs
    are collected too.

    Yields:
        A list that fills with program names (``"jit(step)"``) as they compile.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from substrax.testing import compiled_programs
        >>> x = jnp.ones(2)
        >>> with compiled_programs() as names:
        ...     _ = jax.jit(lambda x: x * 3)(x)
        >>> names
        ['jit(<lambda>)']
    """
    from jax import monitoring  # noqa: PLC0415 - importing this module imports no jax

    names: list[str] = []
    lock = threading.Lock()

    def listen(event: str, duration_secs: float, **kwargs: str | int) -> None:
        del duration_secs
        if event == BACKEND_COMPILE_EVENT:
            with lock:
                names.append(str(kwargs.get("fun_name", "<unnamed>")))

    monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        monitoring.unregister_event_duration_listener(listen)


@contextmanager
def expect_compiles(count: int) -> Generator[list[str]]:
    """Assert that the block compiles exactly ``count`` programs.

    Args:
        count: Compilations the block must make (``0`` proves everything was cached).

    Yields:
        The list of compiled program names, filled as the block runs.

    Raises:
        TypeError: ``count`` is not an int.
        ValueError: ``count`` is negative.
        CompileCountError: The block compiled a different number of programs; the check runs
            when the block exits normally.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from substrax.testing import expect_compiles
        >>> step, x = jax.jit(lambda x: x - 1), jnp.ones(4)
        >>> with expect_compiles(1):
        ...     for _ in range(3):
        ...         x = step(x)
    """
    expected = check_int("count", count, minimum=0)
    with compiled_programs() as names:
        yield names
    if len(names) != expected:
        raise CompileCountError(expected, names)
