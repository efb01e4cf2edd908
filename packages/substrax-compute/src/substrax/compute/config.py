"""Reading ``[tool.substrax.compute]`` and resolving a job, at the import path 0.1.22 gave it.

This module's path is an interface: ``substrax.compute.config`` is where 0.1.22 users and docs
import the config readers from. It holds no logic; every name is also in
:mod:`substrax.compute`, and the implementation lives in ``substrax.compute._config``.

Example:
    >>> from substrax.compute.config import parse_accelerator
    >>> parse_accelerator("L4").kind
    'L4'
"""

from ._config import (
    ComputeConfig,
    JobConfig,
    read_compute_config,
    require_locked_substrax,
    resolve_job,
)
from ._spec import parse_accelerator


__all__ = [
    "ComputeConfig",
    "JobConfig",
    "parse_accelerator",
    "read_compute_config",
    "require_locked_substrax",
    "resolve_job",
]
