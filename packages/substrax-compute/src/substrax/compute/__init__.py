"""substrax.compute: a project's jobs declared once in pyproject.toml, run on a backend.

Jobs live in ``[tool.substrax.compute]``; ``substrax-compute run JOB`` submits one to a backend
(``local``, ``modal``, ``skypilot`` or any registered in the ``substrax.compute.backends``
entry-point group), every backend runs the same worker, and the outputs come back to this
machine. Importing this package imports no jax, and nothing else either: each name is loaded
from its module when first used (PEP 562), so pydantic is imported only when a config or a job
spec is validated. Every name users import comes from here; the only public submodules are the
entry points ``substrax.compute.cli`` (the ``substrax-compute`` console script) and
``substrax.compute.worker`` (``python -m substrax.compute.worker``), and the import paths
substrax 0.1.22 documented (``substrax.compute.spec``, ``.backend``, ``.registry``,
``.config``, ``.local``, ``.modal_backend``, ``.skypilot_backend``), which re-export names from
here.

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

from typing import TYPE_CHECKING

from substrax.support import lazy_exports


if TYPE_CHECKING:
    from ._backend import (
        ComputeBackend as ComputeBackend,
        RunHandle as RunHandle,
        RunState as RunState,
        RunStore as RunStore,
        default_state_dir as default_state_dir,
    )
    from ._config import (
        ComputeConfig as ComputeConfig,
        JobConfig as JobConfig,
        read_compute_config as read_compute_config,
        resolve_job as resolve_job,
    )
    from ._errors import (
        AcceleratorFormatError as AcceleratorFormatError,
        BackendFactoryError as BackendFactoryError,
        ComputeConfigError as ComputeConfigError,
        ComputeTableMissingError as ComputeTableMissingError,
        ConfigFileError as ConfigFileError,
        DirectoryPathError as DirectoryPathError,
        FetchToolNotFoundError as FetchToolNotFoundError,
        JobNotFoundError as JobNotFoundError,
        MountDirectoryNotFoundError as MountDirectoryNotFoundError,
        MountNotConfiguredError as MountNotConfiguredError,
        MountPathError as MountPathError,
        OutputPathError as OutputPathError,
        ProjectDirectoryError as ProjectDirectoryError,
        ProjectFileNotFoundError as ProjectFileNotFoundError,
        RecordFormatError as RecordFormatError,
        RecordVersionError as RecordVersionError,
        RunDirectoryGoneError as RunDirectoryGoneError,
        RunNotFoundError as RunNotFoundError,
        RunRecordError as RunRecordError,
        RunStoreError as RunStoreError,
        RuntimeFieldError as RuntimeFieldError,
        SecretNotSetError as SecretNotSetError,
        SubstraxNotLockedError as SubstraxNotLockedError,
        UnknownBackendError as UnknownBackendError,
        UnknownPlatformError as UnknownPlatformError,
        UploadFileNotFoundError as UploadFileNotFoundError,
    )
    from ._local import LocalBackend as LocalBackend
    from ._manifest import (
        DEVICES_LOG as DEVICES_LOG,
        MANIFEST_NAME as MANIFEST_NAME,
        STDERR_LOG as STDERR_LOG,
        STDOUT_LOG as STDOUT_LOG,
        JobManifest as JobManifest,
        RunDevices as RunDevices,
        TaskOutcome as TaskOutcome,
        TaskStatus as TaskStatus,
        read_manifest as read_manifest,
    )
    from ._modal_backend import ModalBackend as ModalBackend
    from ._registry import (
        ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,
        backend_names as backend_names,
        load_backend as load_backend,
    )
    from ._skypilot_backend import SkyPilotBackend as SkyPilotBackend
    from ._spec import (
        JOB_SPEC_VERSION as JOB_SPEC_VERSION,
        KNOWN_PLATFORMS as KNOWN_PLATFORMS,
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
    from ._upload import (
        ALWAYS_LEFT_OUT as ALWAYS_LEFT_OUT,
        NEVER_UPLOADED as NEVER_UPLOADED,
        UPLOAD_IGNORE_FILE as UPLOAD_IGNORE_FILE,
        UploadSet as UploadSet,
        UploadsProject as UploadsProject,
        collect_upload as collect_upload,
    )
    from ._worker import run_job as run_job


_ERRORS = (
    "AcceleratorFormatError",
    "BackendFactoryError",
    "ComputeConfigError",
    "ComputeTableMissingError",
    "ConfigFileError",
    "DirectoryPathError",
    "FetchToolNotFoundError",
    "JobNotFoundError",
    "MountDirectoryNotFoundError",
    "MountNotConfiguredError",
    "MountPathError",
    "OutputPathError",
    "ProjectDirectoryError",
    "ProjectFileNotFoundError",
    "RecordFormatError",
    "RecordVersionError",
    "RunDirectoryGoneError",
    "RunNotFoundError",
    "RunRecordError",
    "RunStoreError",
    "RuntimeFieldError",
    "SecretNotSetError",
    "SubstraxNotLockedError",
    "UnknownBackendError",
    "UnknownPlatformError",
    "UploadFileNotFoundError",
)

# Each public name and the private module that defines it.
_HOMES: dict[str, str] = {
    **dict.fromkeys(_ERRORS, "_errors"),
    **dict.fromkeys(
        ("ComputeBackend", "RunHandle", "RunState", "RunStore", "default_state_dir"), "_backend"
    ),
    **dict.fromkeys(
        ("ComputeConfig", "JobConfig", "read_compute_config", "resolve_job"), "_config"
    ),
    **dict.fromkeys(
        (
            "DEVICES_LOG",
            "MANIFEST_NAME",
            "STDERR_LOG",
            "STDOUT_LOG",
            "JobManifest",
            "RunDevices",
            "TaskOutcome",
            "TaskStatus",
            "read_manifest",
        ),
        "_manifest",
    ),
    **dict.fromkeys(("ENTRY_POINT_GROUP", "backend_names", "load_backend"), "_registry"),
    **dict.fromkeys(
        (
            "JOB_SPEC_VERSION",
            "KNOWN_PLATFORMS",
            "Accelerator",
            "JobSpec",
            "Mount",
            "MountAccess",
            "Resources",
            "Task",
            "example_tasks",
            "parse_accelerator",
            "read_job_spec",
        ),
        "_spec",
    ),
    **dict.fromkeys(
        (
            "ALWAYS_LEFT_OUT",
            "NEVER_UPLOADED",
            "UPLOAD_IGNORE_FILE",
            "UploadSet",
            "UploadsProject",
            "collect_upload",
        ),
        "_upload",
    ),
    "LocalBackend": "_local",
    "ModalBackend": "_modal_backend",
    "SkyPilotBackend": "_skypilot_backend",
    "run_job": "_worker",
}

__all__ = [
    "ALWAYS_LEFT_OUT",
    "DEVICES_LOG",
    "ENTRY_POINT_GROUP",
    "JOB_SPEC_VERSION",
    "KNOWN_PLATFORMS",
    "MANIFEST_NAME",
    "NEVER_UPLOADED",
    "STDERR_LOG",
    "STDOUT_LOG",
    "UPLOAD_IGNORE_FILE",
    "Accelerator",
    "AcceleratorFormatError",
    "BackendFactoryError",
    "ComputeBackend",
    "ComputeConfig",
    "ComputeConfigError",
    "ComputeTableMissingError",
    "ConfigFileError",
    "DirectoryPathError",
    "FetchToolNotFoundError",
    "JobConfig",
    "JobManifest",
    "JobNotFoundError",
    "JobSpec",
    "LocalBackend",
    "ModalBackend",
    "Mount",
    "MountAccess",
    "MountDirectoryNotFoundError",
    "MountNotConfiguredError",
    "MountPathError",
    "OutputPathError",
    "ProjectDirectoryError",
    "ProjectFileNotFoundError",
    "RecordFormatError",
    "RecordVersionError",
    "Resources",
    "RunDevices",
    "RunDirectoryGoneError",
    "RunHandle",
    "RunNotFoundError",
    "RunRecordError",
    "RunState",
    "RunStore",
    "RunStoreError",
    "RuntimeFieldError",
    "SecretNotSetError",
    "SkyPilotBackend",
    "SubstraxNotLockedError",
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
    "run_job",
]


# Each name is loaded from its module on first use (PEP 562), then kept here.
lazy_exports(__name__, _HOMES, __all__)
