# The public names of substrax.runtime, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._apply import apply_runtime as apply_runtime
from ._cache import default_compilation_cache_dir as default_compilation_cache_dir
from ._config import JaxRuntime as JaxRuntime, MatmulPrecision as MatmulPrecision
from ._distributed import (
    DistributedInfo as DistributedInfo,
    initialize_distributed as initialize_distributed,
)
from ._environment import (
    child_environment as child_environment,
    runtime_environment as runtime_environment,
)
from ._errors import (
    CoordinatorPortError as CoordinatorPortError,
    DistributedStartupError as DistributedStartupError,
    EnvironmentConflictError as EnvironmentConflictError,
    RuntimeConfigurationError as RuntimeConfigurationError,
    XlaFlagConflictError as XlaFlagConflictError,
)
from ._jax_client import (
    NO_OVERRIDE as NO_OVERRIDE,
    array_read_code as array_read_code,
    config_settings as config_settings,
    distributed_state as distributed_state,
    set_config_override as set_config_override,
    top_level_check as top_level_check,
    uncached_read_check as uncached_read_check,
)
from ._launchers import (
    DEFAULT_COORDINATOR_PORT as DEFAULT_COORDINATOR_PORT,
    LaunchSettings as LaunchSettings,
    launch_from_environment as launch_from_environment,
    launch_from_modal_cluster as launch_from_modal_cluster,
)
from ._logging import configure_entry_point_logging as configure_entry_point_logging
from ._peer_watch import PEER_FAILURE_EXIT_CODE as PEER_FAILURE_EXIT_CODE
from ._test_runtime import resolve_test_runtime as resolve_test_runtime
from ._xla_flags import merge_xla_flags as merge_xla_flags, parse_xla_flags as parse_xla_flags
