r"""substrax.runtime: the settings a JAX process starts with. Importing it imports no jax.

``JaxRuntime`` declares backends, emulated CPU devices, 64-bit types, matmul precision, the
compilation cache, XLA flags and accelerator memory. ``runtime_environment`` renders them for a
process that has not imported jax, ``child_environment`` builds a child's whole environment, and
``apply_runtime`` applies them to this process, refusing any setting jax would no longer read.
``initialize_distributed`` starts ``jax.distributed`` from arguments or a launcher's environment.

Example:
    >>> import os, subprocess, sys
    >>> from substrax.runtime import JaxRuntime, child_environment
    >>> runtime = JaxRuntime(platforms=("cpu",), cpu_devices=4)
    >>> env = child_environment(runtime)
    >>> program = "import jax; print(jax.device_count())"
    >>> subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
    ...                text=True, check=True).stdout  # doctest: +SKIP
    '4\n'
"""

from typing import TYPE_CHECKING

from substrax.support import lazy_exports

from ._cache import default_compilation_cache_dir as default_compilation_cache_dir
from ._config import JaxRuntime as JaxRuntime, MatmulPrecision as MatmulPrecision
from ._environment import (
    apply_runtime as apply_runtime,
    child_environment as child_environment,
    runtime_environment as runtime_environment,
)
from ._errors import (
    CoordinatorPortError as CoordinatorPortError,
    DistributedStartupError as DistributedStartupError,
    RuntimeConfigurationError as RuntimeConfigurationError,
    XlaFlagConflictError as XlaFlagConflictError,
)
from ._test_runtime import resolve_test_runtime as resolve_test_runtime
from ._xla_flags import merge_xla_flags as merge_xla_flags, parse_xla_flags as parse_xla_flags


if TYPE_CHECKING:
    from ._distributed import (
        DistributedInfo as DistributedInfo,
        initialize_distributed as initialize_distributed,
    )
    from ._jax_client import (
        array_read_code as array_read_code,
        distributed_state as distributed_state,
        top_level_check as top_level_check,
    )
    from ._launchers import (
        DEFAULT_COORDINATOR_PORT as DEFAULT_COORDINATOR_PORT,
        LaunchSettings as LaunchSettings,
        launch_from_environment as launch_from_environment,
        launch_from_modal_cluster as launch_from_modal_cluster,
    )
    from ._logging import configure_entry_point_logging as configure_entry_point_logging
    from ._peer_watch import PEER_FAILURE_EXIT_CODE as PEER_FAILURE_EXIT_CODE

# Imported on first use (PEP 562): they bring logging, ipaddress and re, which a process that only
# renders or applies settings before starting jax never needs.
_LAZY = {
    "DistributedInfo": "_distributed",
    "initialize_distributed": "_distributed",
    **dict.fromkeys(("array_read_code", "distributed_state", "top_level_check"), "_jax_client"),
    "DEFAULT_COORDINATOR_PORT": "_launchers",
    "LaunchSettings": "_launchers",
    "launch_from_environment": "_launchers",
    "launch_from_modal_cluster": "_launchers",
    "PEER_FAILURE_EXIT_CODE": "_peer_watch",
    "configure_entry_point_logging": "_logging",
}


__all__ = [
    "DEFAULT_COORDINATOR_PORT",
    "PEER_FAILURE_EXIT_CODE",
    "CoordinatorPortError",
    "DistributedInfo",
    "DistributedStartupError",
    "JaxRuntime",
    "LaunchSettings",
    "MatmulPrecision",
    "RuntimeConfigurationError",
    "XlaFlagConflictError",
    "apply_runtime",
    "array_read_code",
    "child_environment",
    "configure_entry_point_logging",
    "default_compilation_cache_dir",
    "distributed_state",
    "initialize_distributed",
    "launch_from_environment",
    "launch_from_modal_cluster",
    "merge_xla_flags",
    "parse_xla_flags",
    "resolve_test_runtime",
    "runtime_environment",
    "top_level_check",
]

lazy_exports(__name__, _LAZY, __all__)
