"""Backends found through the ``substrax.compute.backends`` entry-point group.

A provider registers a factory (``Callable[[Mapping[str, JsonValue]], ComputeBackend]``)::

    [project.entry-points."substrax.compute.backends"]
    mycloud = "my_package.backend:MyCloudBackend"

Example:
    >>> from substrax.compute import backend_names, load_backend
    >>> "local" in backend_names()
    True
    >>> load_backend("local").name
    'local'
"""

from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from ._backend import ComputeBackend
from ._errors import BackendFactoryError, UnknownBackendError
from ._records import JsonValue


ENTRY_POINT_GROUP = "substrax.compute.backends"
"""The entry-point group a backend factory is registered in (the name 0.1.22 gave it)."""

type Discover = Callable[..., Iterable[EntryPoint]]


def _entries(discover: Discover) -> dict[str, EntryPoint]:
    return {entry.name: entry for entry in discover(group=ENTRY_POINT_GROUP)}


def backend_names(*, discover: Discover = entry_points) -> list[str]:
    """The registered backend names, sorted."""
    return sorted(_entries(discover))


def load_backend(
    name: str,
    settings: Mapping[str, JsonValue] | None = None,
    *,
    discover: Discover = entry_points,
) -> ComputeBackend:
    """Build the backend registered as ``name`` from its settings table.

    Raises:
        UnknownBackendError: ``name`` is not registered.
        BackendFactoryError: The factory returned something that is not a ``ComputeBackend``.
    """
    entries = _entries(discover)
    if name not in entries:
        raise UnknownBackendError(name, sorted(entries), ENTRY_POINT_GROUP)
    factory: Any = entries[name].load()
    backend = factory(dict(settings or {}))
    if not isinstance(backend, ComputeBackend):
        raise BackendFactoryError(name, entries[name].value, type(backend).__name__)
    return backend
