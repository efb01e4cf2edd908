"""substrax.testing: fresh-interpreter runs, trace and compile counting, and a pytest plugin.

Importing this package imports no jax: each name is loaded from its module when first used
(PEP 562), and the helpers that need jax import it when called, so a test can still choose the
JAX settings of its process. The pytest plugin is opt-in, from a
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

from typing import TYPE_CHECKING

from substrax.support import lazy_exports


if TYPE_CHECKING:
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
        CountingFailedError as CountingFailedError,
        ExampleNotFoundError as ExampleNotFoundError,
        ExampleTimeoutError as ExampleTimeoutError,
        GradientMismatchError as GradientMismatchError,
        RetraceError as RetraceError,
        RunNotFinalError as RunNotFinalError,
        ToolIdsInUseError as ToolIdsInUseError,
        TooManyCallsError as TooManyCallsError,
        UnevenCountError as UnevenCountError,
        ZeroGradientError as ZeroGradientError,
    )
    from ._examples import (
        EXIT_UNAVAILABLE as EXIT_UNAVAILABLE,
        ExampleRun as ExampleRun,
        run_example as run_example,
        unavailable_reason as unavailable_reason,
    )
    from ._gradients import (
        GRADIENT_TOLERANCES as GRADIENT_TOLERANCES,
        GradientTolerance as GradientTolerance,
        LeafGradientCheck as LeafGradientCheck,
        check_input_gradients as check_input_gradients,
        check_parameter_gradients as check_parameter_gradients,
    )
    from ._jax_calls import (
        CallCounts as CallCounts,
        by_package as by_package,
        counted_calls as counted_calls,
        per_iteration as per_iteration,
        started as started,
    )
    from ._jax_config import restored_jax_config as restored_jax_config
    from ._traces import TraceCounter as TraceCounter


# Each public name and the private module that defines it.
_HOMES: dict[str, str] = {
    **dict.fromkeys(("ChildResult", "cuda_is_visible", "json_objects", "run_python"), "_child"),
    **dict.fromkeys(("compiled_programs", "expect_compiles"), "_compiles"),
    **dict.fromkeys(("free_port", "run_distributed"), "_distributed"),
    **dict.fromkeys(
        (
            "ChildFailedError",
            "CompileCountError",
            "CountingFailedError",
            "ExampleNotFoundError",
            "ExampleTimeoutError",
            "GradientMismatchError",
            "RetraceError",
            "RunNotFinalError",
            "TooManyCallsError",
            "ToolIdsInUseError",
            "UnevenCountError",
            "ZeroGradientError",
        ),
        "_errors",
    ),
    **dict.fromkeys(
        ("EXIT_UNAVAILABLE", "ExampleRun", "run_example", "unavailable_reason"), "_examples"
    ),
    **dict.fromkeys(
        (
            "GRADIENT_TOLERANCES",
            "GradientTolerance",
            "LeafGradientCheck",
            "check_input_gradients",
            "check_parameter_gradients",
        ),
        "_gradients",
    ),
    **dict.fromkeys(
        ("CallCounts", "by_package", "counted_calls", "per_iteration", "started"), "_jax_calls"
    ),
    "restored_jax_config": "_jax_config",
    "TraceCounter": "_traces",
}

__all__ = [
    "EXIT_UNAVAILABLE",
    "GRADIENT_TOLERANCES",
    "CallCounts",
    "ChildFailedError",
    "ChildResult",
    "CompileCountError",
    "CountingFailedError",
    "ExampleNotFoundError",
    "ExampleRun",
    "ExampleTimeoutError",
    "GradientMismatchError",
    "GradientTolerance",
    "LeafGradientCheck",
    "RetraceError",
    "RunNotFinalError",
    "TooManyCallsError",
    "ToolIdsInUseError",
    "TraceCounter",
    "UnevenCountError",
    "ZeroGradientError",
    "by_package",
    "check_input_gradients",
    "check_parameter_gradients",
    "compiled_programs",
    "counted_calls",
    "cuda_is_visible",
    "expect_compiles",
    "free_port",
    "json_objects",
    "per_iteration",
    "restored_jax_config",
    "run_distributed",
    "run_example",
    "run_python",
    "started",
    "unavailable_reason",
]


# Each name is loaded from its module on first use (PEP 562), then kept here.
lazy_exports(__name__, _HOMES, __all__)
