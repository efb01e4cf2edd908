"""MLflow's database writes from the writer child process: real SQLite stores, real processes."""

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from substrax.tracking import MLFlowLogger, _mlflow_child
from substrax.tracking._mlflow_child import uses_child


mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is needed for MLFlowLogger")
from mlflow.tracking import MlflowClient  # noqa: E402


@pytest.fixture
def spawn_early(monkeypatch):
    """A child takes over after five values (a real run: after SPAWN_AFTER)."""
    monkeypatch.setattr(_mlflow_child, "SPAWN_AFTER", 5)


def steps_of(uri, run_id, key):
    return sorted(m.step for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key))


def gone(pid, within=10.0):
    """Whether process ``pid`` ends within ``within`` seconds (a zombie has ended)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def delivered(logger, within=60.0):
    """Wait until everything logged reached MLflow (a retry after a failure included)."""
    deadline = time.monotonic() + within
    while not logger.wait_delivered(timeout=within):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def writer(logger):
    return logger._sink.writer


def start_child(logger, key="loss"):
    """Log steps 0-9 in two deliveries: the second one starts the child; wait until it is up."""
    for first in (0, 5):
        for step in range(first, first + 5):
            logger.log_scalar(key, float(step), step=step)
        assert logger.wait_delivered(timeout=60)
    assert writer(logger).wait_ready(timeout=120)
    pid = writer(logger).pid
    assert pid is not None
    return pid


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("sqlite:////runs/mlflow.db", True),
        ("postgresql+psycopg2://u@127.0.0.1/db", True),
        ("mysql://127.0.0.1/db", True),
        ("http://127.0.0.1:5000", False),
        ("https://localhost", False),
        ("file:///runs/mlruns", False),
        ("/runs/mlruns", False),
    ],
)
def test_only_database_stores_use_a_child(uri, expected):
    assert uses_child(uri) is expected


def test_a_short_run_writes_from_its_own_process(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with MLFlowLogger("short", tracking_uri=uri, log_dir=tmp_path) as logger:
        for step in range(20):
            logger.log_scalar("loss", 1.0 / (step + 1), step=step)
        assert logger.wait_delivered()
        assert writer(logger).pid is None
        run_id = logger.run_id
    assert steps_of(uri, run_id, "loss") == list(range(20))


@pytest.mark.slow
def test_past_the_threshold_a_niced_child_writes_and_ends_with_the_logger(spawn_early, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with MLFlowLogger("long", tracking_uri=uri, log_dir=tmp_path) as logger:
        pid = start_child(logger)
        for step in range(10, 40):
            logger.log_scalars({"loss": float(step), "acc": step / 40}, step=step)
        assert logger.wait_delivered()
        assert writer(logger).pid == pid
        expected = min(os.getpriority(os.PRIO_PROCESS, os.getpid()) + 10, 19)
        assert os.getpriority(os.PRIO_PROCESS, pid) == expected
        run_id = logger.run_id
    assert gone(pid)
    assert steps_of(uri, run_id, "loss") == list(range(40))
    assert steps_of(uri, run_id, "acc") == list(range(10, 40))
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {"loss": 39.0, "acc": 39 / 40}  # the latest values moved on


@pytest.mark.slow
def test_a_relative_sqlite_path_is_the_same_file_after_the_script_changes_directory(
    spawn_early, tmp_path, monkeypatch
):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    uri = "sqlite:///runs.db"
    with MLFlowLogger("relative", tracking_uri=uri, log_dir=tmp_path / "logs") as logger:
        monkeypatch.chdir(tmp_path / "elsewhere")  # before the child starts
        start_child(logger)
        assert delivered(logger)
        run_id = logger.run_id
    assert not (tmp_path / "elsewhere" / "runs.db").exists()
    assert steps_of(f"sqlite:///{tmp_path / 'runs.db'}", run_id, "loss") == list(range(10))


@pytest.mark.slow
def test_a_child_killed_between_batches_is_replaced_and_nothing_is_lost(spawn_early, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with MLFlowLogger("killed", tracking_uri=uri, log_dir=tmp_path) as logger:
        first = start_child(logger)
        for step in range(10, 30):
            logger.log_scalar("loss", float(step), step=step)
        assert logger.wait_delivered()
        os.kill(first, signal.SIGKILL)
        assert gone(first)
        for step in range(30, 60):
            logger.log_scalar("loss", float(step), step=step)
        assert delivered(logger)  # from the logger's process while the new child starts
        assert writer(logger).wait_ready(timeout=120)
        second = writer(logger).pid
        run_id = logger.run_id
    assert second not in (None, first)
    assert steps_of(uri, run_id, "loss") == list(range(60))


@pytest.mark.slow
def test_a_child_killed_inside_a_batch_loses_nothing(spawn_early, tmp_path, caplog):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with MLFlowLogger("stuck", tracking_uri=uri, log_dir=tmp_path) as logger:
        pid = start_child(logger)
        blocker = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # another process's write: the child's batch waits
        for step in range(10, 20):
            logger.log_scalar("loss", float(step), step=step)
        assert not logger.wait_delivered(timeout=2.0)
        os.kill(pid, signal.SIGKILL)  # dies inside the batch, before it committed
        assert gone(pid)
        blocker.execute("ROLLBACK")
        blocker.close()
        assert delivered(logger)
        run_id = logger.run_id
    assert steps_of(uri, run_id, "loss") == list(range(20))
    assert "MLflow writer process" in caplog.text


@pytest.mark.slow
def test_a_hung_child_does_not_hold_close_and_its_batch_is_spooled(spawn_early, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MLFlowLogger("hung", tracking_uri=uri, log_dir=tmp_path, close_timeout=2)
    pid = start_child(logger)
    os.kill(pid, signal.SIGSTOP)  # alive but never answers
    for step in range(10, 20):
        logger.log_scalar("loss", float(step), step=step)
    assert not logger.wait_delivered(timeout=1.5)
    start = time.monotonic()
    logger.close()
    assert time.monotonic() - start < 2 + 1.5  # close_timeout, half a second, the spool write
    assert gone(pid)
    spooled = [json.loads(line)["record"] for line in logger.spool_path.read_text().splitlines()]
    assert sorted(record["step"] for record in spooled) == list(range(10, 20))
    assert steps_of(uri, logger.run_id, "loss") == list(range(10))


@pytest.mark.slow
def test_a_value_mlflow_refuses_in_the_child_is_kept_and_the_rest_goes_on(spawn_early, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with MLFlowLogger("refused", tracking_uri=uri, log_dir=tmp_path) as logger:
        start_child(logger)
        logger.log_scalar("k" * 300, 1.0, step=10)  # MLflow's keys have at most 250 characters
        for step in range(10, 20):
            logger.log_scalar("loss", float(step), step=step)
        logger.wait_delivered()
        assert writer(logger).pid is not None
        run_id = logger.run_id
        refused = logger.spool_path.with_name(logger.spool_path.name + ".refused")
    assert steps_of(uri, run_id, "loss") == list(range(20))
    assert "k" * 300 in refused.read_text()


def test_a_child_that_cannot_start_is_given_up_with_one_warning(
    spawn_early, monkeypatch, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger=_mlflow_child.__name__)
    monkeypatch.setattr(_mlflow_child, "_MODULE", "substrax.tracking._no_such_module")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    deadline = time.monotonic() + 120
    with MLFlowLogger("fallback", tracking_uri=uri, log_dir=tmp_path) as logger:
        step = 0
        while not writer(logger).given_up and time.monotonic() < deadline:
            for _ in range(5):
                logger.log_scalar("loss", float(step), step=step)
                step += 1
            assert delivered(logger)
            time.sleep(0.2)
        assert writer(logger).given_up
        run_id = logger.run_id
    assert steps_of(uri, run_id, "loss") == list(range(step))
    records = [r for r in caplog.records if r.name == _mlflow_child.__name__]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO, logging.WARNING]
    assert "could not start 3 times (it exited with code 1" in records[-1].getMessage()


def test_a_slow_start_holds_neither_delivery_nor_close(spawn_early, monkeypatch, tmp_path):
    (tmp_path / "slow_writer.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(_mlflow_child, "_MODULE", "slow_writer")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MLFlowLogger("slow", tracking_uri=uri, log_dir=tmp_path, close_timeout=5)
    for first in range(0, 30, 5):
        for step in range(first, first + 5):
            logger.log_scalar("loss", float(step), step=step)
        assert logger.wait_delivered(timeout=30)  # written here while the child "starts"
    starting = writer(logger)._starting
    assert starting is not None
    assert writer(logger).pid is None
    began = time.monotonic()
    logger.close()
    assert time.monotonic() - began < 5
    assert gone(starting.pid)
    assert steps_of(uri, logger.run_id, "loss") == list(range(30))


@pytest.mark.slow
def test_the_child_ends_when_the_training_process_is_killed(tmp_path):
    program = textwrap.dedent(
        f"""
        import time
        from substrax.tracking import MLFlowLogger, _mlflow_child
        _mlflow_child.SPAWN_AFTER = 5
        logger = MLFlowLogger("orphan", tracking_uri="sqlite:///{tmp_path / "mlflow.db"}",
                              log_dir={str(tmp_path)!r})
        for step in range(20):
            logger.log_scalar("loss", float(step), step=step)
            logger.wait_delivered(timeout=60)
        logger._sink.writer.wait_ready(timeout=120)
        print(logger._sink.writer.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        line = parent.stdout.readline()
        child = int(line)
        os.kill(child, 0)  # alive
        parent.kill()
        parent.wait(30)
        assert gone(child, within=20)
    finally:
        parent.kill()
        parent.wait(30)
        parent.stdout.close()


def test_the_module_refuses_a_wrong_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "substrax.tracking._mlflow_child"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "usage: python -m substrax.tracking._mlflow_child TRACKING_URI NICE" in done.stderr
