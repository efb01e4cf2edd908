# The public names of substrax.compute, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._backend import (
    STATE_DIR_ENV as STATE_DIR_ENV,
    BackendFactory as BackendFactory,
    ComputeBackend as ComputeBackend,
    NewRun as NewRun,
    RunHandle as RunHandle,
    RunState as RunState,
    RunStore as RunStore,
    backend_state_dir as backend_state_dir,
    default_state_dir as default_state_dir,
    new_run as new_run,
    new_run_id as new_run_id,
    stage_run as stage_run,
)
from ._config import (
    ComputeConfig as ComputeConfig,
    JobConfig as JobConfig,
    read_compute_config as read_compute_config,
    require_locked_substrax as require_locked_substrax,
    resolve_job as resolve_job,
)
from ._errors import (
    AcceleratorFormatError as AcceleratorFormatError,
    BackendFactoryError as BackendFactoryError,
    BackendRequestError as BackendRequestError,
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
    RuntimeFieldError as RuntimeFieldError,
    SecretNotSetError as SecretNotSetError,
    SubstraxNotLockedError as SubstraxNotLockedError,
    UnknownBackendError as UnknownBackendError,
    UnknownPlatformError as UnknownPlatformError,
    UploadFileNotFoundError as UploadFileNotFoundError,
)
from ._local import LocalBackend as LocalBackend, LocalSettings as LocalSettings
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
from ._modal_backend import ModalBackend as ModalBackend, ModalSettings as ModalSettings
from ._registry import (
    ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,
    backend_names as backend_names,
    load_backend as load_backend,
)
from ._run_errors import (
    RecordFormatError as RecordFormatError,
    RecordVersionError as RecordVersionError,
    RunDirectoryGoneError as RunDirectoryGoneError,
    RunNotFoundError as RunNotFoundError,
    RunRecordError as RunRecordError,
    RunStoreError as RunStoreError,
)
from ._skypilot_backend import (
    SkyPilotBackend as SkyPilotBackend,
    SkyPilotSettings as SkyPilotSettings,
)
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
