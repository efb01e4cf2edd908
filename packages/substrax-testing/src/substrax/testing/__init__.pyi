# The public names of substrax.testing, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._child import (
    ChildResult as ChildResult,
    cuda_is_visible as cuda_is_visible,
    json_objects as json_objects,
    run_python as run_python,
)
from ._compiles import compiled_programs as compiled_programs, expect_compiles as expect_compiles
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
from ._gradient_records import (
    GRADIENT_TOLERANCES as GRADIENT_TOLERANCES,
    GradientTolerance as GradientTolerance,
    LeafGradientCheck as LeafGradientCheck,
)
from ._gradients import (
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
