"""The job spec's records, at the import path substrax 0.1.22 gave them.

This module's path is an interface: ``substrax.compute.spec`` is where 0.1.22 users import the
job spec from. It holds no logic; every name is also in :mod:`substrax.compute`, and the
implementation lives in ``substrax.compute._spec``.

Example:
    >>> from substrax.compute.spec import JOB_SPEC_VERSION, parse_accelerator
    >>> parse_accelerator("H100:8").count
    8
    >>> JOB_SPEC_VERSION >= 2
    True
"""

from ._spec import (
    JOB_SPEC_VERSION,
    Accelerator,
    JobSpec,
    Mount,
    MountAccess,
    Resources,
    Task,
    example_tasks,
    parse_accelerator,
    read_job_spec,
)


__all__ = [
    "JOB_SPEC_VERSION",
    "Accelerator",
    "JobSpec",
    "Mount",
    "MountAccess",
    "Resources",
    "Task",
    "example_tasks",
    "parse_accelerator",
    "read_job_spec",
]
