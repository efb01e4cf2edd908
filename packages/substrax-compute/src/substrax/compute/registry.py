"""Backends found through the ``substrax.compute.backends`` entry-point group.

A provider registers a factory (``Callable[[Mapping[str, JsonValue]], ComputeBackend]``)::

    [project.entry-points."substrax.compute.backends"]
    mycloud = "my_package.backend:MyCloudBackend"

Example:
    >>> "local" in backend_names()
    True
    >>> load_backend("local").name
    'local'
"""

from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import JsonValue

from .backend import ComputeBackend


GROUP = "substrax.compute.backends"

type Discover = Callable[..., Iterable[EntryPoint]]


class UnknownBackendError(LookupError):
    """No backend of that name is registered.

    Attributes:
        name: The name asked for.
        known: The registered names.
    """

    def __init__(self, name: str, known: list[str]) -> None:
        self.name, self.known = name, known
        super().__init__(
            f"no compute backend {name!r}; registered: {', '.join(known) or 'none'} "
            f"(a provider registers one in the {GROUP!r} entry-point group)"
        )


def _entries(discover: Discover) -> dict[str, EntryPoint]:
    return {entry.name: entry for entry in discover(group=GROUP)}


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
        TypeError: The factory returned something that is not a ``ComputeBackend``.
    """
    entries = _entries(discover)
    if name not in entries:
        raise UnknownBackendError(name, sorted(entries))
    factory: Any = entries[name].load()
    backend = factory(dict(settings or {}))
    if not isinstance(backend, ComputeBackend):
        raise TypeError(
            f"the {name!r} backend factory {entries[name].value} returned "
            f"{type(backend).__name__}, which is not a ComputeBackend"
        )
    return backend
