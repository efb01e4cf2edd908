"""Which process this is, without importing jax: only process 0 logs unless asked otherwise."""

from __future__ import annotations

import os
import sys

from substrax.support import check_int

from ._errors import ProcessIndexVariableError


__all__ = ["PROCESS_INDEX_ENV_VARS", "current_process_index"]

PROCESS_INDEX_ENV_VARS = ("SUBSTRAX_PROCESS_INDEX", "JAX_PROCESS_ID", "RANK")
"""Environment variables read, in order, for the process index when jax is not imported."""


def current_process_index(explicit: int | None = None) -> int:
    """This process's index: ``explicit``, else jax's if known, else the environment, else 0.

    Jax's (``jax.process_index()``) when jax is imported and ``jax.distributed`` started, or
    when no variable of :data:`PROCESS_INDEX_ENV_VARS` is set (a TPU pod's); otherwise the first
    of them set. Asking jax before ``jax.distributed.initialize`` would start its backend,
    which then can no longer join the job, and answer 0 on every process.

    Example:
        >>> from substrax.tracking import current_process_index
        >>> current_process_index(3)
        3
    """
    if explicit is not None:
        return check_int("process_index", explicit, minimum=0)
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "process_index"):
        set_here = any(os.environ.get(var) for var in PROCESS_INDEX_ENV_VARS)
        if jax.distributed.is_initialized() or not set_here:
            return int(jax.process_index())
    for var in PROCESS_INDEX_ENV_VARS:
        if value := os.environ.get(var):
            try:
                return int(value)
            except ValueError:
                raise ProcessIndexVariableError(var, value) from None
    return 0
