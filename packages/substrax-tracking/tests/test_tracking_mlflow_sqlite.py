"""Metric rows written straight into MLflow's SQLite tables: compared with MLflow's own writes."""

import contextlib
import math
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from substrax.tracking import _mlflow_sqlite
from substrax.tracking._mlflow_sqlite import SqliteMetricRows
from substrax.tracking._store_lock import sqlite_path


mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is needed for MLFlowLogger")
from mlflow.entities import Metric  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402


NOW = 1_800_000_000_000


def new_run(uri):
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(f"rows-{uuid.uuid4().hex}")
    return client, client.create_run(experiment).info.run_id


def through_mlflow(client, run_id, rows):
    client.log_batch(run_id, metrics=[Metric(k, v, t, s) for k, v, t, s in rows])


def metric_rows(uri, run_id):
    """The run's rows of MLflow's ``metrics`` and ``latest_metrics`` tables, as stored."""
    with sqlite3.connect(sqlite_path(uri)) as db:
        history = db.execute(
            "SELECT key, value, timestamp, step, is_nan FROM metrics WHERE run_uuid = ? "
            "ORDER BY key, step, timestamp, value",
            (run_id,),
        ).fetchall()
        latest = db.execute(
            "SELECT key, value, timestamp, step, is_nan FROM latest_metrics WHERE run_uuid = ? "
            "ORDER BY key",
            (run_id,),
        ).fetchall()
    return history, latest


def learned(uri, first):
    """A run whose keys MLflow wrote (``first``), and a writer that knows them."""
    client, run_id = new_run(uri)
    through_mlflow(client, run_id, first)
    rows = SqliteMetricRows.open(uri)
    assert rows is not None
    rows.learn(run_id, first)
    return client, run_id, rows


BATCHES = [
    [("loss", 2.0, NOW, 0), ("acc", 0.1, NOW, 0)],  # the first batch: through MLflow in both
    [("loss", 1.5, NOW + 5, 1), ("loss", 1.25, NOW + 6, 2), ("acc", 0.2, NOW + 6, 2)],
    [("loss", math.nan, NOW + 7, 3), ("acc", math.inf, NOW + 7, 3)],
    [("loss", -math.inf, NOW + 8, 4), ("loss", 0.5, NOW + 8, 4)],  # one step, two values
    [("loss", 9.0, NOW + 9, 7), ("loss", 0.25, NOW + 9, 5)],  # the newest is not the last row
    [("acc", 0.9, NOW + 1, 1)],  # older than the latest: the latest stays
    [("acc", 0.0, NOW + 10, 8), ("acc", math.nan, NOW + 10, 8)],  # a tie broken by is_nan
]


def test_the_rows_are_those_mlflow_writes(sqlite_uri):
    client, direct_run, rows = learned(sqlite_uri, BATCHES[0])
    _, mlflow_run = new_run(sqlite_uri)
    through_mlflow(client, mlflow_run, BATCHES[0])
    for batch in BATCHES[1:]:
        assert rows.write(direct_run, batch)
        through_mlflow(client, mlflow_run, batch)
    assert metric_rows(sqlite_uri, direct_run) == metric_rows(sqlite_uri, mlflow_run)
    direct, plain = client.get_run(direct_run).data.metrics, client.get_run(mlflow_run).data.metrics
    assert direct.keys() == plain.keys() == {"loss", "acc"}
    assert direct["loss"] == plain["loss"] == 9.0
    history = client.get_metric_history(direct_run, "loss")
    assert sorted(m.step for m in history) == [0, 1, 2, 3, 4, 4, 5, 7]
    assert any(math.isnan(m.value) for m in history)


def test_a_key_mlflow_has_not_written_into_the_run_is_left_to_it(sqlite_uri):
    _, run_id, rows = learned(sqlite_uri, [("loss", 1.0, NOW, 0)])
    before = metric_rows(sqlite_uri, run_id)
    assert not rows.write(run_id, [("loss", 0.5, NOW + 1, 1), ("acc", 0.5, NOW + 1, 1)])
    _, other = new_run(sqlite_uri)  # the same key, another run
    assert not rows.write(other, [("loss", 0.5, NOW + 1, 1)])
    assert not rows.write(run_id, [])
    assert metric_rows(sqlite_uri, run_id) == before
    assert metric_rows(sqlite_uri, other) == ([], [])


def test_a_run_no_longer_active_is_left_to_mlflow_which_refuses_it(sqlite_uri):
    client, run_id, rows = learned(sqlite_uri, [("loss", 1.0, NOW, 0)])
    client.delete_run(run_id)
    before = metric_rows(sqlite_uri, run_id)
    assert not rows.write(run_id, [("loss", 0.5, NOW + 1, 1)])
    assert metric_rows(sqlite_uri, run_id) == before
    with pytest.raises(MlflowException) as refused:
        through_mlflow(client, run_id, [("loss", 0.5, NOW + 1, 1)])
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE"


def test_a_retried_batch_is_left_whole_to_mlflow_which_skips_its_rows(sqlite_uri):
    client, run_id, rows = learned(sqlite_uri, [("loss", 1.0, NOW, 0)])
    batch = [("loss", 0.5, NOW + 1, 1), ("loss", 0.25, NOW + 2, 2)]
    assert rows.write(run_id, batch)
    written = metric_rows(sqlite_uri, run_id)
    retried = [*batch, ("loss", 0.125, NOW + 3, 3)]  # a batch the child died with, retried
    assert not rows.write(run_id, retried)
    assert metric_rows(sqlite_uri, run_id) == written  # not one row of it
    through_mlflow(client, run_id, retried)
    steps = sorted(m.step for m in client.get_metric_history(run_id, "loss"))
    assert steps == [0, 1, 2, 3]


HOLDER = textwrap.dedent(
    """
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    db.execute("COMMIT")
    """
)


@contextlib.contextmanager
def holding(uri, seconds):
    """Another process holding the database's write lock for ``seconds`` (killed at the end)."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(sqlite_path(uri)), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        try:
            yield holder
        finally:
            holder.kill()


def test_a_batch_waits_for_another_process_writing_the_database(sqlite_uri):
    _, run_id, rows = learned(sqlite_uri, [("loss", 1.0, NOW, 0)])
    with holding(sqlite_uri, 1.0) as holder:
        started = time.monotonic()
        assert rows.write(run_id, [("loss", 0.5, NOW + 1, 1)])
        assert time.monotonic() - started > 0.5
        assert holder.wait(timeout=30) == 0
    assert metric_rows(sqlite_uri, run_id)[1] == [("loss", 0.5, NOW + 1, 1, 0)]


def test_a_database_locked_past_the_timeout_raises_and_holds_nothing_of_the_batch(
    sqlite_uri, monkeypatch
):
    _, run_id, rows = learned(sqlite_uri, [("loss", 1.0, NOW, 0)])
    monkeypatch.setattr(_mlflow_sqlite, "_BUSY_TIMEOUT", 0.2)
    before = metric_rows(sqlite_uri, run_id)
    with holding(sqlite_uri, 30.0), pytest.raises(sqlite3.OperationalError, match="locked"):
        rows.write(run_id, [("loss", 0.5, NOW + 1, 1)])
    assert metric_rows(sqlite_uri, run_id) == before
    assert rows.write(run_id, [("loss", 0.5, NOW + 1, 1)])  # the retry, once it is free


def test_a_damaged_database_raises(tmp_path):
    database = tmp_path / "mlflow.db"
    database.write_bytes(b"not a database" * 512)
    rows = SqliteMetricRows.open(f"sqlite:///{database}")
    assert rows is not None
    rows.learn("run", [("loss", 1.0, NOW, 0)])
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        rows.write("run", [("loss", 0.5, NOW + 1, 1)])


def test_a_removed_database_raises_and_is_not_made_anew(tmp_path):
    database = tmp_path / "runs" / "mlflow.db"
    rows = SqliteMetricRows.open(f"sqlite:///{database}")
    assert rows is not None
    rows.learn("run", [("loss", 1.0, NOW, 0)])
    database.parent.mkdir()
    with pytest.raises(sqlite3.OperationalError, match="unable to open"):
        rows.write("run", [("loss", 0.5, NOW + 1, 1)])
    assert not database.exists()


def test_a_database_put_in_place_of_the_one_written_is_opened_anew(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _, run_id, rows = learned(uri, [("loss", 1.0, NOW, 0)])
    assert rows.write(run_id, [("loss", 0.5, NOW + 1, 1)])
    database = sqlite_path(uri)
    shutil.copy(database, tmp_path / "copy.db")
    database.unlink()  # a connection kept open would go on writing the removed file
    with pytest.raises(sqlite3.OperationalError, match="unable to open"):
        rows.write(run_id, [("loss", 0.25, NOW + 2, 2)])
    (tmp_path / "copy.db").rename(database)
    assert rows.write(run_id, [("loss", 0.25, NOW + 2, 2)])
    rows.close()
    history, latest = metric_rows(uri, run_id)
    assert [row[3] for row in history] == [0, 1, 2]
    assert latest == [("loss", 0.25, NOW + 2, 2, 0)]


@pytest.mark.parametrize(
    "row",
    [
        ("loss", "2.5", NOW + 1, 1),  # MLflow converts a string
        ("loss", True, NOW + 1, 1),
        ("loss", 10**400, NOW + 1, 1),
        ("loss", 0.5, -1, 1),  # MLflow refuses a timestamp before 1970
        ("loss", 0.5, NOW + 1, 1.0),
        ("loss", 0.5, NOW + 1, 2**63),  # more than SQLite's integers hold
    ],
)
def test_a_value_mlflow_would_convert_or_refuse_is_left_to_it(sqlite_uri, row):
    _, run_id, rows = learned(sqlite_uri, [("loss", 1.0, NOW, 0)])
    before = metric_rows(sqlite_uri, run_id)
    assert not rows.write(run_id, [("loss", 0.5, NOW + 1, 1), row])
    assert metric_rows(sqlite_uri, run_id) == before


def test_a_large_int_value_is_stored_as_mlflow_stores_it(sqlite_uri):
    client, direct_run, rows = learned(sqlite_uri, [("loss", 1.0, NOW, 0)])
    _, mlflow_run = new_run(sqlite_uri)
    through_mlflow(client, mlflow_run, [("loss", 1.0, NOW, 0)])
    batch = [("loss", 10**20, NOW + 1, 1), ("loss", -3, NOW + 2, 2)]
    assert rows.write(direct_run, batch)
    through_mlflow(client, mlflow_run, batch)
    assert metric_rows(sqlite_uri, direct_run) == metric_rows(sqlite_uri, mlflow_run)


def test_a_percent_escaped_path_is_the_file_mlflow_opens(tmp_path):
    folder = tmp_path / "my runs"
    folder.mkdir()
    uri = f"sqlite:///{str(folder / 'mlflow.db').replace(' ', '%20')}"
    _, run_id, rows = learned(uri, [("loss", 1.0, NOW, 0)])
    assert rows.database == folder / "mlflow.db"
    assert rows.write(run_id, [("loss", 0.5, NOW + 1, 1)])
    rows.close()
    steps = sorted(
        m.step for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, "loss")
    )
    assert steps == [0, 1]


def test_an_active_logged_model_leaves_every_batch_to_mlflow(sqlite_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_ACTIVE_MODEL_ID", "m-0123456789abcdef")
    assert SqliteMetricRows.open(sqlite_uri) is None


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:5000",
        "postgresql://u@127.0.0.1/db",
        "sqlite:///:memory:",
        "sqlite:///file:/runs/mlflow.db?uri=true",  # a SQLite URI filename: SQLite finds it
    ],
)
def test_other_stores_are_left_to_mlflow(uri):
    assert SqliteMetricRows.open(uri) is None
