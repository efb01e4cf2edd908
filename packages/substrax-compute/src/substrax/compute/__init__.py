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

from ._paths import DirectoryPathError as DirectoryPathError
from ._toml import ConfigFileError as ConfigFileError
from ._upload import (
    ALWAYS_LEFT_OUT as ALWAYS_LEFT_OUT,
    NEVER_UPLOADED as NEVER_UPLOADED,
    UPLOAD_IGNORE_FILE as UPLOAD_IGNORE_FILE,
    UploadFileNotFoundError as UploadFileNotFoundError,
    UploadSet as UploadSet,
    UploadsProject as UploadsProject,
    collect_upload as collect_upload,
)
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
    KNOWN_PLATFORMS as KNOWN_PLATFORMS,
    Accelerator as Accelerator,
    JobSpec as JobSpec,
    Mount as Mount,
    MountAccess as MountAccess,
    Resources as Resources,
    Task as Task,
    UnknownPlatformError as UnknownPlatformError,
    example_tasks as example_tasks,
    parse_accelerator as parse_accelerator,
    read_job_spec as read_job_spec,
)


__all__ = [
    "ALWAYS_LEFT_OUT",
    "JOB_SPEC_VERSION",
    "KNOWN_PLATFORMS",
    "NEVER_UPLOADED",
    "UPLOAD_IGNORE_FILE",
    "Accelerator",
    "ComputeBackend",
    "ComputeConfig",
    "ComputeConfigError",
    "ConfigFileError",
    "DirectoryPathError",
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
    "UnknownPlatformError",
    "UploadFileNotFoundError",
    "UploadSet",
    "UploadsProject",
    "backend_names",
    "collect_upload",
    "default_state_dir",
    "example_tasks",
    "load_backend",
    "parse_accelerator",
    "read_compute_config",
    "read_job_spec",
    "read_manifest",
    "resolve_job",
]
