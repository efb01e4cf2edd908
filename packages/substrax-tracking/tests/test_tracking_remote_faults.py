"""MLFlowLogger against servers that are not there or vanish mid-run: a real HTTP server on
127.0.0.1 answering MLflow's REST calls (conftest's VanishingMlflow), driven by MLflow's own client."""

import json
import logging
import os
import threading
import time

import numpy as np
import pytest

from substrax.testing import free_port
from substrax.tracking import MLFlowLogger, SpoolNotFoundError, UnknownRunIdError, replay_spool


pytest.importorskip("mlflow", reason="the mlflow extra is needed for MLFlowLogger")


def spooled(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("how", ["refuse", "silent"])
def test_a_server_that_vanishes_after_the_run_is_created_loses_nothing_and_close_is_bounded(
    vanishing_mlflow, tmp_path, caplog, monkeypatch, how
):
    # a silent server holds a call for the request's timeout: past close_timeout and its grace
    # (the call is still running at close), within them and the replay's timeout (the replay
    # waits for the lock the call holds, then times out on the silent server itself)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")  # 5 for every other test
    server = vanishing_mlflow(vanish_after_run=how)
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    logger = MLFlowLogger("gone", tracking_uri=server.uri, log_dir=tmp_path, close_timeout=1)
    assert logger.run_id == "run1"
    assert server.vanished.wait(10)
    for step in range(500):
        logger.log_scalar("loss", float(step), step=step)
    started = time.monotonic()
    logger.close()
    assert time.monotonic() - started < 1 + 2  # close_timeout, and a little to write the spool
    lines = spooled(logger.spool_path)
    steps = [line["record"]["step"] for line in lines]
    marks = steps.count(None)  # a call still running at close: a mark for the replay that ends it
    assert [step for step in steps if step is not None] == list(range(500))
    assert marks == (how == "silent")
    assert {json.dumps(line["target"]) for line in lines} == {
        json.dumps({"backend": "mlflow", "tracking_uri": server.uri, "run_id": "run1"})
    }
    left = [r.getMessage() for r in caplog.records if "records are kept in" in r.getMessage()]
    assert left, caplog.text
    assert str(logger.spool_path) in left[-1]
    assert f"python -m substrax.tracking replay {logger.spool_path}" in left[-1]
    assert server.metrics == []

    started = time.monotonic()
    result = replay_spool(logger.spool_path, timeout=2)
    assert time.monotonic() - started < 2 + 2
    assert (result.delivered, result.remaining) == (0, 500 + marks)
    assert result.timed_out == (how == "silent")  # refused at once, or no answer in time
    assert len(spooled(logger.spool_path)) == 500 + marks


def test_records_are_spooled_while_the_server_is_down_not_held_in_memory(
    vanishing_mlflow, tmp_path, wait_for
):
    server = vanishing_mlflow(vanish_after_run="refuse")
    logger = MLFlowLogger("down", tracking_uri=server.uri, log_dir=tmp_path, close_timeout=1)
    assert server.vanished.wait(10)
    for step in range(20):
        logger.log_scalar("loss", float(step), step=step)
    # on disk before close: a crash of the training process would not lose them
    wait_for(lambda: logger.spool_path.exists() and len(spooled(logger.spool_path)) == 20)
    started = time.monotonic()
    logger.close()  # it retries until close_timeout, then leaves the records where they are
    assert time.monotonic() - started < 1 + 2
    assert len(spooled(logger.spool_path)) == 20


def test_no_server_at_construction_returns_at_once_and_delivers_once_it_answers(
    vanishing_mlflow, tmp_path, caplog, wait_for
):
    port = free_port()
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    started = time.monotonic()
    logger = MLFlowLogger(
        "late",
        experiment_name="late-exp",
        tracking_uri=f"http://127.0.0.1:{port}",
        log_dir=tmp_path,
        close_timeout=60,
    )
    assert time.monotonic() - started < 10 + 3  # connect_timeout's default
    assert logger.run_id is None
    # nothing listens on the port: the connection is refused at once, and the warning says so
    assert "could not be reached" in caplog.text
    assert "did not answer" not in caplog.text
    for step in range(50):
        logger.log_scalar("loss", float(step), step=step)
    wait_for(logger.spool_path.exists)
    server = vanishing_mlflow(port)  # the server comes up on that address
    assert logger.wait_delivered(60)
    logger.close()
    [run] = server.runs.values()
    assert logger.run_id == run["info"]["run_id"]
    assert run["info"]["status"] == "FINISHED"
    assert {tag["key"] for tag in run["data"]["tags"]} >= {"substrax.run_key"}
    assert sorted((m["step"], m["value"]) for m in server.metrics) == [
        (s, float(s)) for s in range(50)
    ]
    assert not logger.spool_path.exists()


def test_a_flush_right_after_a_start_that_found_no_server_does_not_wait_its_bound(
    tmp_path, wall_clock
):
    # a checkpoint's flush waited the whole bound (10 s): the delivery was not known to fail
    # until its first send, so the flush waited for its retries, not for one more try
    logger = MLFlowLogger(
        "early",
        tracking_uri=f"http://127.0.0.1:{free_port()}",
        log_dir=tmp_path,
        connect_timeout=1,
        close_timeout=30,
    )
    assert logger.run_id is None
    logger.log_scalar("loss", 1.0, step=0)
    started = time.monotonic()
    logger.flush()
    assert time.monotonic() - started < 5  # not min(close_timeout, 10 s)
    assert [line["record"]["step"] for line in spooled(logger.spool_path)] == [0]  # on disk
    logger.close_timeout = 0
    logger.close()


def test_the_process_environment_is_never_changed(vanishing_mlflow, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "77")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    before = dict(os.environ)
    server = vanishing_mlflow()
    with MLFlowLogger("mine", tracking_uri=server.uri, log_dir=tmp_path) as logger:
        assert dict(os.environ) == before
        logger.log_scalar("loss", 1.0, step=0)
    assert dict(os.environ) == before
    assert [(m["step"], m["value"]) for m in server.metrics] == [(0, 1.0)]


def test_a_server_that_refuses_the_run_id_raises_at_construction(vanishing_mlflow, tmp_path):
    from mlflow.exceptions import RestException

    server = vanishing_mlflow()
    with pytest.raises(UnknownRunIdError, match="leave run_id out") as caught:
        MLFlowLogger("resume", tracking_uri=server.uri, log_dir=tmp_path, run_id="nope")
    assert (caught.value.run_id, caught.value.tracking_uri) == ("nope", server.uri)
    assert isinstance(caught.value.__cause__, RestException)  # the server's answer
    with pytest.raises(ValueError, match="connect_timeout"):
        MLFlowLogger("x", tracking_uri=server.uri, log_dir=tmp_path, connect_timeout=0)


def test_a_missing_spool_is_an_error_naming_the_path(tmp_path):
    missing = tmp_path / "typo.spool.jsonl"
    with pytest.raises(SpoolNotFoundError, match=r"typo\.spool\.jsonl") as caught:
        replay_spool(missing)
    assert caught.value.path == missing
    assert isinstance(caught.value, FileNotFoundError)


def test_the_logger_thread_is_gone_after_a_clean_close(vanishing_mlflow, tmp_path):
    server = vanishing_mlflow()
    with MLFlowLogger("clean", tracking_uri=server.uri, log_dir=tmp_path) as logger:
        logger.log_scalar("loss", 1.0, step=0)
    assert not any(
        t.name == "substrax-tracking-MLFlowLogger('clean')" for t in threading.enumerate()
    )


def test_processes_that_all_log_keep_their_own_spool_files(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens: every record is spooled
    loggers = [
        MLFlowLogger(
            "job",
            tracking_uri=uri,
            log_dir=tmp_path,
            close_timeout=0.5,
            connect_timeout=2,
            all_processes=True,
            process_index=index,
        )
        for index in (0, 1)
    ]
    for index, logger in enumerate(loggers):
        for step in range(5):
            logger.log_scalar("loss", float(index), step=step)
    for logger in loggers:
        logger.close()
    first, second = (logger.spool_path for logger in loggers)
    assert (first.name, second.name) == ("job.spool.jsonl", "job.p1.spool.jsonl")
    for index, path in enumerate((first, second)):
        records = [line["record"]["payload"]["values"] for line in spooled(path)]
        # a close still waiting on a backend call also spools the run's end mark (no values)
        assert [values["loss"] for values in records if values] == [float(index)] * 5


def test_numpy_values_and_steps_are_spooled_as_plain_json_numbers(tmp_path):
    np = pytest.importorskip("numpy")
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens: every record is spooled
    logger = MLFlowLogger(
        "np", tracking_uri=uri, log_dir=tmp_path, close_timeout=0.5, connect_timeout=2
    )
    logger.log_scalars({"f64": np.float64(0.5), "i64": np.int64(2)}, step=np.int64(3))
    logger.log_hyperparams({"lr": np.float64(0.1)})
    logger.close()
    text = logger.spool_path.read_text()
    assert "np." not in text
    scalars, params = spooled(logger.spool_path)
    assert scalars["record"]["step"] == 3
    assert scalars["record"]["payload"] == {"values": {"f64": 0.5, "i64": 2.0}}
    assert params["record"]["payload"] == {"params": {"lr": 0.1}}


def test_an_artifact_path_given_as_a_path_is_spooled_and_holds_up_nothing(tmp_path, caplog):
    """Hostile finding: ``artifact_path=Path("ckpt")`` was no JSON, so the writer never wrote it
    nor any record after it (held in memory: a kill lost them; ``close`` called them lost)."""
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens: every record is spooled
    logger = MLFlowLogger(
        "paths", tracking_uri=uri, log_dir=tmp_path, close_timeout=0.5, connect_timeout=2
    )
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    logger.log_artifact(weights, artifact_path=tmp_path.__class__("ckpt"))
    for step in range(3):
        logger.log_scalar("loss", float(step), step=step)
    logger.flush(1)
    records = [line["record"] for line in spooled(logger.spool_path)]
    assert records[0]["payload"] == {"path": str(weights), "artifact_path": "ckpt"}
    assert [r["step"] for r in records[1:]] == [0, 1, 2]
    with caplog.at_level(logging.ERROR, logger="substrax.tracking"):
        logger.close()
    assert not [r for r in caplog.records if "lost" in r.getMessage()]


@pytest.mark.parametrize("bad", [[1.0, 2.0], np.zeros(3), {"a": 1.0}, np.array(["x"])])
def test_a_non_number_in_log_scalars_is_refused_at_the_call_naming_key_and_step(
    tmp_path, sqlite_uri, bad
):
    from substrax.tracking import LoggedTypeError, MLFlowLogger

    logger = MLFlowLogger("bad", tracking_uri=sqlite_uri, log_dir=tmp_path)
    with pytest.raises(LoggedTypeError, match=r"scalar 'bad' must be .* \(at step 7\)"):
        logger.log_scalars({"loss": 0.5, "bad": bad}, step=7)
    logger.log_scalars({"loss": 0.25}, step=8)
    logger.close()
    from mlflow.tracking import MlflowClient

    history = MlflowClient(sqlite_uri).get_metric_history(logger.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(8, 0.25)]


def test_a_flush_to_a_backend_known_down_writes_the_spool_and_does_not_wait_for_it(
    tmp_path, wait_for
):
    """Hostile finding: with the server down, CheckpointCallback(flush=logger) and every
    save spent the flush's whole bound waiting for delivery, though the spool was fsynced."""
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens: every send fails
    logger = MLFlowLogger("down", tracking_uri=uri, log_dir=tmp_path, connect_timeout=2)
    logger.log_scalar("loss", 1.0, step=0)
    # the first send fails within it (refused at once); the sender's next tries then wait
    # 0.05 s, doubling, and each flush below waits for one: a longer first flush, longer waits
    logger.flush(timeout=0.2)
    wait_for(lambda: logger._delivery.failing)  # the state the flush reads
    for step in range(1, 4):
        logger.log_scalar("loss", float(step), step=step)
        started = time.monotonic()
        logger.flush(timeout=60)
        assert time.monotonic() - started < 30  # on disk, not delivered: no wait for the server
        assert len(spooled(logger.spool_path)) == step + 1
    logger.close_timeout = 0.5
    logger.close()
