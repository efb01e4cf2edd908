"""substrax.testing: fresh-interpreter runs, trace and compile counting, and a pytest plugin.

Importing this package imports no jax: the helpers that need jax import it when called, so a
test can still choose the JAX settings of its process. The pytest plugin is opt-in, from a
``conftest.py``: ``pytest_plugins = ["substrax.testing.pytest_plugin"]``.

Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from substrax.runtime import JaxRuntime
    >>> from substrax.testing import TraceCounter, expect_compiles, run_python
    >>> program = "import json, jax; print(json.dumps(jax.device_count()))"
    >>> run_python(program, runtime=JaxRuntime(cpu_devices=8), timeout=120).check().last_json()
    8
    >>> counter = TraceCounter()
    >>> step, x = jax.jit(counter.wrap(lambda x: x * 2)), jnp.ones(3)
    >>> with counter.expect(new_traces=1), expect_compiles(1):
    ...     for _ in range(3):
    ...         x = step(x)
"""

from ._child import (
    ChildResult as ChildResult,
    cuda_is_visible as cuda_is_visible,
    json_objects as json_objects,
    run_python as run_python,
)
from ._compiles import (
    compiled_programs as compiled_programs,
    expect_compiles as expect_compiles,
)
from ._distributed import free_port as free_port, run_distributed as run_distributed
from ._errors import (
    ChildFailedError as ChildFailedError,
    CompileCountError as CompileCountError,
    ExampleNotFoundError as ExampleNotFoundError,
    ExampleTimeoutError as ExampleTimeoutError,
    RetraceError as RetraceError,
    RunNotFinalError as RunNotFinalError,
)
from ._examples import ExampleRun as ExampleRun, run_example as run_example
from ._jax_config import restored_jax_config as restored_jax_config
from ._traces import TraceCounter as TraceCounter


__all__ = [
    "ChildFailedError",
    "ChildResult",
    "CompileCountError",
    "ExampleNotFoundError",
    "ExampleRun",
    "ExampleTimeoutError",
    "RetraceError",
    "RunNotFinalError",
    "TraceCounter",
    "compiled_programs",
    "cuda_is_visible",
    "expect_compiles",
    "free_port",
    "json_objects",
    "restored_jax_config",
    "run_distributed",
    "run_example",
    "run_python",
]
