r"""Write and show a shell file of managed JAX settings: ``python -m substrax.runtime.managed_env``.

This module's path is an interface: ``python -m substrax.runtime.managed_env`` runs its
``main()``, and its helpers are importable from here as they always were. The logic lives in
``_managed_env`` (the file's contents) and ``_managed_env_cli`` (the command line).

``write`` renders a file that ``export``\ s or ``unset``\ s ``<P>_BACKEND``, ``<P>_ENV_ROOT`` and
the JAX variables for a backend (``auto`` resolves it from the machine), listing every variable it
manages in ``<P>_MANAGED_ENV_VARS``; an activation script sources it. ``show`` prints what a
shell would end up with after sourcing it and then any user env files (``NAME=value`` lines).
Exit 0 when done, 1 when the file cannot be written, 2 for bad usage or input, with one line
``python -m substrax.runtime.managed_env: error: <message>``.

Example:
    >>> from substrax.runtime.managed_env import managed_environment, render
    >>> env = managed_environment("PROJ", "cuda12", env_root="/srv/proj")
    >>> env["XLA_PYTHON_CLIENT_PREALLOCATE"], env["XLA_CLIENT_MEM_FRACTION"]
    ('false', '0.75')
    >>> print(render(managed_environment("PROJ", "cpu", env_root="/p")).splitlines()[3])
    export JAX_PLATFORMS=cpu
"""

import sys

from ._managed_env import (
    BACKEND_CHOICES,
    Backend,
    BackendChoice,
    managed_environment,
    nvidia_gpu_visible,
    render,
    resolve_backend,
)
from ._managed_env_cli import main


__all__ = [
    "BACKEND_CHOICES",
    "Backend",
    "BackendChoice",
    "main",
    "managed_environment",
    "nvidia_gpu_visible",
    "render",
    "resolve_backend",
]


if __name__ == "__main__":
    sys.exit(main())
