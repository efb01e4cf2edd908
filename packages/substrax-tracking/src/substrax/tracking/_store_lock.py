"""One process at a time creates (or migrates) a local MLflow store: a file lock beside the db."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Generator
from pathlib import Path


__all__ = ["sqlite_path", "store_lock"]

_SQLITE = "sqlite:///"
_THREAD_LOCK = threading.RLock()  # flock is per open file: threads of one process queue here


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for any other store).

    The path is read as SQLAlchemy, and so MLflow, reads it: percent-escapes decoded. None for
    an in-memory database, and for a SQLite URI filename (``sqlite:///file:...?uri=true``),
    whose file SQLite itself finds.

    Example:
        >>> from substrax.tracking._store_lock import sqlite_path
        >>> sqlite_path("sqlite:////runs/my%20runs/mlflow.db"), sqlite_path("http://127.0.0.1:5000")
        (PosixPath('/runs/my runs/mlflow.db'), None)
    """
    if not tracking_uri.startswith(_SQLITE):
        return None
    from sqlalchemy.engine import make_url  # noqa: PLC0415 - MLflow's own dependency

    url = make_url(tracking_uri)
    path = url.database
    if not path or path == ":memory:" or url.query.get("uri") == "true":
        return None
    return Path(path)


@contextlib.contextmanager
def store_lock(tracking_uri: str) -> Generator[None]:
    """Hold ``<db>.lock`` (``fcntl.flock``) while setting up the sqlite store of ``tracking_uri``.

    MLflow creates and migrates a sqlite store's tables when a client first opens it; jobs of a
    sweep that start together on one store would otherwise race in that migration (alembic's
    "duplicate column name") and in creating the same experiment. Other stores: no lock.

    Example:
        >>> import tempfile
        >>> from substrax.tracking._store_lock import store_lock
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     with store_lock(f"sqlite:///{directory}/mlflow.db"):
        ...         pass  # open the store, create the experiment
    """
    db = sqlite_path(tracking_uri)
    if db is None:
        yield
        return
    try:
        db.parent.mkdir(parents=True, exist_ok=True)  # as MLflow would, but before the lock
        lock = os.open(f"{db}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only directory: MLflow reports that itself
        yield
        return
    try:
        with _THREAD_LOCK:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)
