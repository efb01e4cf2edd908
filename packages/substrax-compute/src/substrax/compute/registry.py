"""The backend registry (the ``substrax.compute.backends`` entry points), at its 0.1.22 path.

This module's path is an interface: ``substrax.compute.registry`` is where 0.1.22 users import
the registry from. It holds no logic; the implementation lives in ``substrax.compute._registry``.

Example:
    >>> from substrax.compute.registry import ENTRY_POINT_GROUP, backend_names
    >>> ENTRY_POINT_GROUP
    'substrax.compute.backends'
    >>> "local" in backend_names()
    True
"""

from ._errors import (
    BackendFactoryError,
    UnknownBackendError,
)
from ._registry import ENTRY_POINT_GROUP, backend_names, load_backend


__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendFactoryError",
    "UnknownBackendError",
    "backend_names",
    "load_backend",
]
