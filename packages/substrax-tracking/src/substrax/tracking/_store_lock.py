"""One process at a time creates (or migrates) a local MLflow store: a file lock beside the db."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Generator
from pathlib import Path


__all__ = ["sqlite_path", "store_lock"]

_THREAD_LOCK = threading.RLock()  # flock is per open file: threads of one process queue here


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI, read as SQLAlchemy reads it.

    None for any other store, an in-memory database and a SQLite URI filename (``?uri=true``).

    Example:
        >>> from substrax.tracking._store_lock import sqlite_path
        >>> sqlite_path("sqlite:////runs/my%20runs/mlflow.db"), sqlite_path("http://127.0.0.1:5000")
        (PosixPath('/runs/my runs/mlflow.db'), None)
    """
    if not tracking_uri.startswith("sqlite:///"):
        return None
    from sqlalchemy.engine import make_url  # noqa: PLC0415 - MLflow's own dependency

    url = make_url(tracking_uri)
    if not url.database or url.database == ":memory:" or url.query.get("uri") == "true":
        return None
    return Path(url.database)


@contextlib.contextmanager
def store_lock(tracking_uri: str) -> Generator[None]:
    """Hold ``<db>.lock`` while setting up the sqlite store of ``tracking_uri`` (others: no lock).

    Jobs of a sweep starting together would otherwise race in MLflow's migration of the store.

    Example:
        >>> import tempfile
        >>> from substrax.tracking._store_lock import store_lock
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     with store_lock(f"sqlite:///{directory}/mlflow.db"):
        ...         pass  # open the store, create the experiment
    """
    lock = None
    if (db := sqlite_path(tracking_uri)) is not None:
        with contextlib.suppress(OSError):  # a read-only directory: MLflow reports that itself
            db.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(f"{db}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    if lock is None:
        yield
        return
    with _THREAD_LOCK:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)  # before the close: a forked child holds a copy
            os.close(lock)
