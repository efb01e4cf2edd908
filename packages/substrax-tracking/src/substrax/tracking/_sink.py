"""Sink: one backend run records are sent to, and the registry that rebuilds one from a spool's target."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ._errors import NotARecordError, StoreDirectoryMissingError, UnknownBackendError
from ._records import Record
from ._store_lock import sqlite_path


__all__ = ["Sink", "build_sink", "register_sink_factory"]


class Sink(Protocol):
    """Where a remote logger's records go: one run of one backend.

    ``target()`` is JSON data naming the backend (``"backend"``) and the run, enough to build
    the sink again; ``is_permanent`` says whether an error will not go away by retrying.
    """

    def target(self) -> dict[str, Any]: ...
    def deliver(self, records: list[Record]) -> None: ...
    def is_permanent(self, error: BaseException) -> bool: ...
    def finish(self) -> None: ...


_FACTORIES: dict[str, Callable[[Mapping[str, Any]], Sink]] = {}


def register_sink_factory(backend: str, factory: Callable[[Mapping[str, Any]], Sink]) -> None:
    """Register how to rebuild a sink for ``backend`` from its spooled ``target`` data."""
    _FACTORIES[backend] = factory


def build_sink(target: Mapping[str, Any]) -> Sink:
    """The sink that ``target`` (a spool line's target data) names.

    Raises:
        UnknownBackendError: no backend of that name is known (a ``ValueError``).
        StoreDirectoryMissingError: the target is a sqlite store in a directory that is gone.
        NotARecordError: the target lacks a field its backend needs (a damaged line).
    """
    backend = target.get("backend")
    if backend not in _FACTORIES:  # the backends register themselves when imported
        for module in ("._mlflow_sink", "._wandb_sink"):
            importlib.import_module(module, __package__)
    if backend not in _FACTORIES:
        raise UnknownBackendError(backend, sorted(_FACTORIES))
    uri = target.get("tracking_uri")
    if isinstance(uri, str) and (db := sqlite_path(uri)) is not None and not db.parent.is_dir():
        raise StoreDirectoryMissingError(uri, db.parent)
    try:
        return _FACTORIES[backend](target)
    except KeyError as error:
        raise NotARecordError(
            f"its {backend} target has no {error.args[0]!r} (a line written by hand, or damaged)"
        ) from None
