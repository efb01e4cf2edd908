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

import difflib
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from ._backend import ComputeBackend
from ._errors import BackendFactoryError, UnknownBackendError
from ._records import JsonValue
from ._toml import toml_path


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


def unknown_backend_tables(
    names: Iterable[str], *, discover: Discover = entry_points
) -> list[tuple[str, str]]:
    """Each ``[tool.substrax.compute.backends.<name>]`` table no registered backend reads.

    A misspelled table (``backends.modl``) would be ignored, its backend run without its
    settings. Each comes as (its TOML path, why), naming the closest registered backend.

    Example:
        >>> from substrax.compute._registry import unknown_backend_tables
        >>> [why for _, why in unknown_backend_tables(["local", "modl"])]
        ["no compute backend 'modl' is registered (registered: local, modal, skypilot); did you mean 'modal'? rename the table"]
    """
    known = backend_names(discover=discover)
    problems: list[tuple[str, str]] = []
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            fix = (
                f"did you mean {close[0]!r}? rename the table"
                if close
                else "rename the table, or install the package that registers it"
            )
            registered = ", ".join(known) or "none"
            problems.append(
                (
                    toml_path(("backends", name)),
                    f"no compute backend {name!r} is registered (registered: {registered}); {fix}",
                )
            )
    return problems
