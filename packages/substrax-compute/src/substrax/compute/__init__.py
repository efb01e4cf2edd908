"""substrax.compute: a project's jobs declared once in pyproject.toml, run on a backend.

Jobs live in ``[tool.substrax.compute]``; ``substrax-compute run JOB`` submits one to a backend
(``local``, ``modal``, ``skypilot`` or any registered in the ``substrax.compute.backends``
entry-point group), every backend runs the same worker, and the outputs come back to this
machine. Importing this package imports no jax.

Example:
    >>> from substrax.compute import JobSpec, Task, load_backend
    >>> spec = JobSpec(
    ...     name="hello",
    ...     tasks=(Task(name="hi", argv=("python", "-c", "print('hi')"), timeout_seconds=60),),
    ...     timeout_seconds=60,
    ... )
    >>> load_backend("local").name
    'local'
"""

from .backend import (
    ComputeBackend as ComputeBackend,
    RunHandle as RunHandle,
    RunState as RunState,
    RunStore as RunStore,
    default_state_dir as default_state_dir,
)
from .config import (
    ComputeConfig as ComputeConfig,
    ComputeConfigError as ComputeConfigError,
    JobConfig as JobConfig,
    read_compute_config as read_compute_config,
    resolve_job as resolve_job,
)
from .manifest import (
    JobManifest as JobManifest,
    RunDevices as RunDevices,
    TaskOutcome as TaskOutcome,
    TaskStatus as TaskStatus,
    read_manifest as read_manifest,
)
from .registry import (
    UnknownBackendError as UnknownBackendError,
    backend_names as backend_names,
    load_backend as load_backend,
)
from .spec import (
    JOB_SPEC_VERSION as JOB_SPEC_VERSION,
    Accelerator as Accelerator,
    JobSpec as JobSpec,
    Mount as Mount,
    MountAccess as MountAccess,
    Resources as Resources,
    Task as Task,
    example_tasks as example_tasks,
    parse_accelerator as parse_accelerator,
    read_job_spec as read_job_spec,
)


__all__ = [
    "JOB_SPEC_VERSION",
    "Accelerator",
    "ComputeBackend",
    "ComputeConfig",
    "ComputeConfigError",
    "JobConfig",
    "JobManifest",
    "JobSpec",
    "Mount",
    "MountAccess",
    "Resources",
    "RunDevices",
    "RunHandle",
    "RunState",
    "RunStore",
    "Task",
    "TaskOutcome",
    "TaskStatus",
    "UnknownBackendError",
    "backend_names",
    "default_state_dir",
    "example_tasks",
    "load_backend",
    "parse_accelerator",
    "read_compute_config",
    "read_job_spec",
    "read_manifest",
    "resolve_job",
]
