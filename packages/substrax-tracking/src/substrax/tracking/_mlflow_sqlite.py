"""Metric values of keys MLflow already holds, inserted into its SQLite tables in one statement.

MLflow's SQL store spends about 0.2 ms of CPU per metric value (SQLAlchemy's ORM: an object,
its attribute events and its flush per row) and about 10 ms per batch. Logging one value per
14 ms training step, that alone is more than 1% of the step. The writer child
(``substrax.tracking._mlflow_child``) hands a SQLite store's batches to ``SqliteMetricRows``
instead: one transaction that checks the run is active, inserts every row with one
``executemany`` and moves each key's latest value forward as MLflow does (the newest by step,
then timestamp, then value). That costs about 1 ms per batch and 0.02 ms per value. The
statements are compiled once from MLflow's own table models, so the SQL follows the installed
MLflow's schema, which MLflow itself checked when it opened the store.

It only takes what MLflow has already taken: keys of a run whose first batch went through
MLflow's ``log_batch`` in this process (``learn``), so MLflow validated the key and made its
latest-value row. Anything else (a new key, a run no longer active, a row already there: a
retried batch), ``write`` leaves untouched and answers False, and the caller sends the batch
through ``log_batch``, which answers as MLflow does.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from ._store_lock import sqlite_path


__all__ = ["SqliteMetricRows"]

_BUSY_TIMEOUT: Final = 10.0  # seconds a batch waits for another writer's transaction to end
_ACTIVE: Final = "active"
_INT64: Final = 2**63  # SQLite's integers are 64-bit
_ACTIVE_MODEL_VARIABLES: Final = ("MLFLOW_ACTIVE_MODEL_ID", "_MLFLOW_ACTIVE_MODEL_ID")

type Row = tuple[str, float, int, int]
"""One metric value: key, value, timestamp (ms) and step."""
type Metric = tuple[str, str, float, int, int, bool]
"""A row of MLflow's ``metrics`` table: run id, key, value as stored, timestamp, step, is_nan."""
_COLUMNS: Final = ("run_uuid", "key", "value", "timestamp", "step", "is_nan")
_KEY, _VALUE, _TIMESTAMP, _STEP = 1, 2, 3, 4  # where a Metric holds them


class SqliteMetricRows:
    """Write the metric values of known keys into an MLflow SQLite store.

    Example:
        >>> from substrax.tracking._mlflow_sqlite import SqliteMetricRows
        >>> SqliteMetricRows.open("http://127.0.0.1:5000") is None  # only SQLite stores
        True
    """

    def __init__(self, database: Path, statements: dict[str, tuple[str, tuple[str, ...]]]) -> None:
        self.database = database
        self._statements = statements
        self._insert, order = statements["insert"]
        # a Metric tuple rearranged into the insert's parameters (the table's column order)
        self._arrange = operator.itemgetter(*map(_COLUMNS.index, order))
        self._known: set[tuple[str, str]] = set()  # (run id, key) MLflow wrote in this process
        self._held: tuple[sqlite3.Connection, tuple[int, int] | None] | None = None

    @classmethod
    def open(cls, tracking_uri: str) -> SqliteMetricRows | None:
        """A writer for a ``sqlite:///`` store, or None.

        None for another store, a SQLite URI filename, an active logged model (MLflow links
        each value to it, in a table of its own), or an MLflow without the table models the
        statements are compiled from: every batch then goes through MLflow.
        """
        database = sqlite_path(tracking_uri)
        if database is None or _active_model():
            return None
        try:
            statements = _compile()
        except (ImportError, AttributeError):
            return None
        return cls(database, statements)

    def learn(self, run_id: str, rows: Sequence[Row]) -> None:
        """Note that MLflow's ``log_batch`` wrote ``rows`` into run ``run_id``."""
        self._known.update((run_id, row[0]) for row in rows)

    def write(self, run_id: str, rows: Sequence[Row]) -> bool:
        """Insert ``rows`` into run ``run_id`` in one transaction; whether it did.

        False, with nothing written, for a key MLflow has not written into the run yet, a value
        that is not a float (or an int a float holds), a timestamp before 1970, a step that is
        not an int, a run that is no longer active, or a row already there: MLflow's
        ``log_batch`` converts, refuses or skips those as it does.

        Raises:
            sqlite3.Error: the database could not be written (locked past the busy timeout,
                full, damaged, removed); nothing of the batch is in it.
        """
        if not rows or not all((run_id, row[0]) in self._known and _plain(row) for row in rows):
            return False
        values = [_metric(run_id, key, value, stamp, step) for key, value, stamp, step in rows]
        connection = self._connected()
        try:
            connection.execute("BEGIN IMMEDIATE")  # the latest values are read under the lock
            written = self._write(connection, run_id, values)
            connection.execute("COMMIT" if written else "ROLLBACK")
        except sqlite3.IntegrityError:  # a row already there: MLflow's log_batch skips it
            connection.execute("ROLLBACK")
            return False
        except BaseException:
            self.close()  # the next batch starts from a new connection
            raise
        return written

    def close(self) -> None:
        """Close the connection (if one is open); a later batch opens another."""
        held, self._held = self._held, None
        if held is not None:
            with contextlib.suppress(sqlite3.Error):
                held[0].close()

    def _connected(self) -> sqlite3.Connection:
        """The open connection, or a new one where the file at ``database`` is another.

        A connection is kept between batches (a new one reads MLflow's schema again, about
        2 ms of CPU), as long as the path still names the file it opened: a database removed
        meanwhile fails the batch (mode=rw makes no new one), and one put in its place is
        opened anew.
        """
        identity = _identity(self.database)
        if self._held is not None and self._held[1] != identity:
            self.close()
        if self._held is None:
            connection = sqlite3.connect(
                f"{self.database.absolute().as_uri()}?mode=rw",
                uri=True,
                timeout=_BUSY_TIMEOUT,
                isolation_level=None,
            )
            self._held = (connection, identity)
        return self._held[0]

    def _write(self, connection: sqlite3.Connection, run_id: str, values: list[Metric]) -> bool:
        stage = connection.execute(*self._bind("stage", run_uuid=run_id)).fetchone()
        if stage is None or stage[0] != _ACTIVE:
            return False
        latest: dict[str, tuple[int, int, float]] = {}
        for key in {value[_KEY] for value in values}:  # a run may hold thousands of keys
            held = connection.execute(*self._bind("latest", run_uuid=run_id, key=key)).fetchone()
            if held is not None:
                latest[key] = held  # (step, timestamp, value): compared as _order compares
        newest: dict[str, Metric] = {}
        for value in values:
            key = value[_KEY]
            if key not in latest:  # MLflow made no latest-value row for it: its log_batch does
                return False
            if key not in newest or _order(value) > _order(newest[key]):
                newest[key] = value
        connection.executemany(self._insert, map(self._arrange, values))
        for key, value in newest.items():
            if _order(value) > latest[key]:
                connection.execute(
                    *self._bind("advance", **dict(zip(_COLUMNS, value, strict=True)))
                )
        return True

    def _bind(self, name: str, **params: object) -> tuple[str, tuple[object, ...]]:
        sql, order = self._statements[name]
        return sql, _ordered(order, **params)


def _plain(row: Row) -> bool:
    """Whether MLflow would store ``row`` as it is.

    That is a float (or an int within a float's range, not a bool) at a step that is a 64-bit
    int, with a timestamp from 1970 on.
    """
    _, value, stamp, step = row
    number = type(value) is float or (type(value) is int and abs(value) <= sys.float_info.max)
    return number and type(stamp) is int and 0 <= stamp < _INT64 and _is_int64(step)


def _is_int64(number: object) -> bool:
    return type(number) is int and -_INT64 <= number < _INT64


def _active_model() -> bool:
    """Whether MLflow has an active logged model here.

    Set in this thread, or in the environment a child process starts from
    (``MLFLOW_ACTIVE_MODEL_ID``).
    """
    if any(os.environ.get(name) for name in _ACTIVE_MODEL_VARIABLES):
        return True
    import mlflow  # noqa: PLC0415

    get_active_model_id = getattr(mlflow, "get_active_model_id", None)
    return get_active_model_id is not None and get_active_model_id() is not None


def _identity(path: Path) -> tuple[int, int] | None:
    """The device and inode of the file at ``path`` (None when there is none)."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


def _stored(value: float) -> float:
    """``value`` as MLflow's SQL store keeps it.

    NaN is kept as 0 (flagged ``is_nan``), an infinity as the largest finite float of its sign.
    """
    if math.isnan(value):
        return 0.0
    if math.isinf(value):
        return math.copysign(sys.float_info.max, value)
    return value


def _metric(run_id: str, key: str, value: float, stamp: int, step: int) -> Metric:
    """A row of MLflow's ``metrics`` table, in :data:`_COLUMNS`' order."""
    number = float(value)
    return run_id, key, _stored(number), stamp, step, math.isnan(number)


def _order(value: Metric) -> tuple[int, int, float]:
    """What makes a value a key's latest in MLflow: its step, then timestamp, then value."""
    return value[_STEP], value[_TIMESTAMP], value[_VALUE]


def _ordered(order: tuple[str, ...], **params: object) -> tuple[object, ...]:
    return tuple(params[name] for name in order)


def _compile() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The four statements, as SQLite SQL with their parameters' order, from MLflow's models."""
    from mlflow.store.tracking.dbmodels.models import (  # noqa: PLC0415
        SqlLatestMetric,
        SqlMetric,
        SqlRun,
    )
    from sqlalchemy import bindparam, insert, select, update  # noqa: PLC0415
    from sqlalchemy.dialects import sqlite  # noqa: PLC0415

    runs: Any = SqlRun.__table__
    metrics: Any = SqlMetric.__table__
    latest: Any = SqlLatestMetric.__table__
    statements = {
        "stage": select(runs.c.lifecycle_stage).where(runs.c.run_uuid == bindparam("run_uuid")),
        "latest": select(latest.c.step, latest.c.timestamp, latest.c.value).where(
            latest.c.run_uuid == bindparam("run_uuid"), latest.c.key == bindparam("key")
        ),
        "insert": insert(metrics).values({name: bindparam(name) for name in _COLUMNS}),
        "advance": update(latest)
        .where(latest.c.run_uuid == bindparam("run_uuid"), latest.c.key == bindparam("key"))
        .values({name: bindparam(name) for name in _COLUMNS if name not in ("run_uuid", "key")}),
    }
    dialect = sqlite.dialect()
    compiled: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name, statement in statements.items():
        done: Any = statement.compile(dialect=dialect)
        compiled[name] = (str(done), tuple(done.positiontup))
    return compiled
