"""The backend protocol, run handles and state directories, at their 0.1.22 import path.

This module's path is an interface: ``substrax.compute.backend`` is where 0.1.22 users and
backend authors import the protocol from. It holds no logic; the implementation lives in
``substrax.compute._backend``.

Example:
    >>> from substrax.compute.backend import ComputeBackend, RunState
    >>> RunState.SUCCEEDED.is_final
    True
"""

from ._backend import (
    STATE_DIR_ENV,
    BackendFactory,
    ComputeBackend,
    NewRun,
    RunHandle,
    RunState,
    RunStore,
    backend_state_dir,
    default_state_dir,
    new_run,
    new_run_id,
    stage_run,
)


__all__ = [
    "STATE_DIR_ENV",
    "BackendFactory",
    "ComputeBackend",
    "NewRun",
    "RunHandle",
    "RunState",
    "RunStore",
    "backend_state_dir",
    "default_state_dir",
    "new_run",
    "new_run_id",
    "stage_run",
]
