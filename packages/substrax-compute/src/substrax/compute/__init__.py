"""substrax.compute: a project's jobs declared once in pyproject.toml, run on a backend.

Jobs live in ``[tool.substrax.compute]``; ``substrax-compute run JOB`` submits one to a backend
(``local``, ``modal``, ``skypilot`` or any registered in the ``substrax.compute.backends``
entry-point group), every backend runs the same worker, and the outputs come back to this
machine. Importing this package imports no jax, and nothing else either: each name is loaded
from its module when first used (PEP 562), so pydantic is imported only when a config or a job
spec is validated. Every name users import comes from here; the only public submodules are the
entry points ``substrax.compute.cli`` (the ``substrax-compute`` console script) and
``substrax.compute.worker`` (``python -m substrax.compute.worker``). The import paths substrax
0.1.22 documented (``substrax.compute.spec``, ``.backend``, ``.registry``, ``.config``,
``.local``, ``.modal_backend``, ``.skypilot_backend``) still import, served from one map in this
package's ``__init__``, and each warns once (``DeprecationWarning``) with the import to use
instead (``from substrax.compute import JobSpec``).

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

from substrax.support import lazy_exports, moved_modules


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read);
# each loads from its module on first use (PEP 562), then is kept here.
lazy_exports(__name__)

# substrax 0.1.22's module paths: each name they served, under the module it lives in now.
# Importing one warns once per process, naming the import to use; the objects are the same.
moved_modules(
    {
        f"substrax.compute.{old}": {"substrax.compute": tuple(names.split())}
        for old, names in {
            "backend": "ComputeBackend RunHandle RunState RunStore default_state_dir STATE_DIR_ENV"
            " BackendFactory NewRun backend_state_dir new_run new_run_id stage_run",
            "config": "ComputeConfig JobConfig parse_accelerator read_compute_config resolve_job"
            " require_locked_substrax",
            "local": "LocalBackend LocalSettings",
            "modal_backend": "ModalBackend ModalSettings",
            "registry": "ENTRY_POINT_GROUP BackendFactoryError UnknownBackendError backend_names"
            " load_backend",
            "skypilot_backend": "SkyPilotBackend SkyPilotSettings",
            "spec": "JOB_SPEC_VERSION Accelerator JobSpec Mount MountAccess Resources Task"
            " example_tasks parse_accelerator read_job_spec",
        }.items()
    }
)
