"""A checkpoint finds every step it covers in the logs: loggers are flushed before the save.

Hostile finding 7: a training process SIGKILLed soon after a checkpoint at step S lost metric
rows at or before S (the file log's lines still buffered, MLflow's records still queued, or not
yet in the spool while the server was down), and the run resumed from S never logged them again.
``Logger.flush()`` now writes (file log: written and fsynced) or delivers or spools (MLflow,
W&B) every record logged so far, within a bound, and ``CheckpointCallback(flush=...)`` and
``PreemptionHandler(flush=...)`` call it before each save. Each test kills a real training
process with SIGKILL right after a save returned, and reads back what it left.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from substrax.tracking import FileLogger, read_scalars, replay_spool
from substrax.tracking._background import AsyncDelivery
from substrax.tracking._records import Record


pytest.importorskip("mlflow", reason="the mlflow extra is needed for MLFlowLogger")
pytest.importorskip("orbax.checkpoint", reason="substrax-checkpoint's store needs orbax")
from mlflow.tracking import MlflowClient


CHECKPOINT_AT = 1500

TRAINING = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from substrax.checkpoint import CheckpointCallback, OrbaxCheckpointStore
    from substrax.tracking import FileLogger, MLFlowLogger, MultiLogger

    log_dir, store_dir, uri, at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    files = FileLogger("job", log_dir)  # writes its lines once a second
    mlflow = MLFlowLogger("job", tracking_uri=uri, log_dir=log_dir, connect_timeout=5)
    logger = MultiLogger([files, mlflow])
    store = OrbaxCheckpointStore(store_dir)
    callback = CheckpointCallback(
        store,
        items=lambda trainer: {"model": {"w": np.zeros(2)}},
        every_n_epochs=None,
        every_n_steps=at,
        flush=[logger],
    )
    callback.on_train_begin(None)
    print(json.dumps({"run_id": mlflow.run_id}), flush=True)
    step = 0
    while True:  # until the test kills it
        step += 1
        logger.log_scalars({"loss": 1.0 / step, "acc": step / 1e6}, step=step)
        callback.on_batch_end(None, step, {"loss": 1.0 / step})
        if step == at:
            print("saved", flush=True)  # the save at `at` returned
    """
)


def _train_and_kill(tmp_path, uri):
    """Start the training process, SIGKILL it as soon as its save at CHECKPOINT_AT returned."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            TRAINING,
            str(tmp_path / "logs"),
            str(tmp_path / "store"),
            uri,
            str(CHECKPOINT_AT),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(300, child.kill)
    watchdog.start()
    try:
        assert child.stdout is not None
        started = child.stdout.readline()
        assert started, child.communicate(timeout=30)[1][-3000:]
        run_id = json.loads(started)["run_id"]
        assert child.stdout.readline().strip() == "saved", child.communicate(timeout=30)[1][-3000:]
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    return run_id


def _every_step_to_the_checkpoint(steps):
    return set(range(1, CHECKPOINT_AT + 1)) <= set(steps)


@pytest.mark.usefixtures("child_processes")
def test_a_kill_right_after_a_checkpoint_loses_no_row_up_to_its_step(tmp_path, sqlite_uri):
    run_id = _train_and_kill(tmp_path, sqlite_uri)
    logged = read_scalars(tmp_path / "logs" / "job.metrics.jsonl")
    assert _every_step_to_the_checkpoint(step for step, _ in logged["loss"])
    assert _every_step_to_the_checkpoint(step for step, _ in logged["acc"])
    client = MlflowClient(tracking_uri=sqlite_uri)
    for key in ("loss", "acc"):
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert _every_step_to_the_checkpoint(steps), (key, max(steps, default=None))
    # a resume from the checkpoint finds every earlier step, and logs the later ones once
    with FileLogger("job", tmp_path / "logs", resume_step=CHECKPOINT_AT) as resumed:
        resumed.log_scalar("loss", 0.0, step=CHECKPOINT_AT + 1)
    steps = [step for step, _ in read_scalars(resumed.metrics_jsonl)["loss"]]
    assert steps == list(range(1, CHECKPOINT_AT + 2))


@pytest.mark.usefixtures("child_processes")
@pytest.mark.xdist_group("mlflow_server")
def test_with_the_server_down_a_kill_after_a_checkpoint_leaves_every_step_in_the_spool(
    tmp_path, mlflow_door
):
    # the run's server is down (its door shut) for the whole first attempt
    run_id = _train_and_kill(tmp_path, mlflow_door.uri)
    assert run_id is None  # the run was never created: the server did not answer
    spool = tmp_path / "logs" / "job.spool.jsonl"
    records = [json.loads(line)["record"] for line in spool.read_text().splitlines()]
    steps = {r["step"] for r in records if r["kind"] == "scalars"}
    assert _every_step_to_the_checkpoint(steps)
    logged = read_scalars(tmp_path / "logs" / "job.metrics.jsonl")
    assert _every_step_to_the_checkpoint(step for step, _ in logged["loss"])
    mlflow_door.open()  # the server is back
    result = replay_spool(spool, timeout=240)
    assert result.remaining == 0
    assert result.refused == 0
    client = MlflowClient(tracking_uri=mlflow_door.uri)
    [run] = client.search_runs(
        [client.get_experiment_by_name("job").experiment_id],
        filter_string="attributes.run_name = 'job'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert _every_step_to_the_checkpoint(steps)
    assert run.info.status == "FAILED"  # killed before close: never FINISHED


class _StuckSink:
    """A backend whose calls hang until ``gate`` is set (a server that accepts and never answers)."""

    def __init__(self):
        self.gate = threading.Event()
        self.received = []
        self.calls = 0

    def target(self):
        return {"backend": "stuck", "run": "r1"}

    def deliver(self, records):
        self.calls += 1
        self.gate.wait(60)
        self.received.extend(records)

    def is_permanent(self, error):
        del error
        return False

    def finish(self):
        pass


def test_a_flush_against_a_backend_that_never_answers_returns_in_time_with_every_record_spooled(
    tmp_path,
):
    sink = _StuckSink()
    delivery = AsyncDelivery(
        sink,
        spool_path=tmp_path / "run.spool.jsonl",
        media_dir=tmp_path / "media",
        label="stuck",
    )
    try:
        for step in range(50):
            delivery.submit(("loss", float(step), step, time.time()))
        delivery.submit(
            Record(kind="text", step=50, time=time.time(), payload={"name": "n", "text": "t"})
        )
        started = time.monotonic()
        assert delivery.persist(1.0)  # every record in the spool (none delivered yet)
        assert time.monotonic() - started < 1.0 + 2.0
        spooled = [
            json.loads(line)["record"]
            for line in (tmp_path / "run.spool.jsonl").read_text().splitlines()
        ]
        assert sorted({r["step"] for r in spooled}) == list(range(51))
        sink.gate.set()  # the server answers at last: everything arrives, in order, none lost
        assert delivery.flush(60)
        delivered = [r.step for r in sink.received]
        assert set(delivered) == set(range(51))
        assert not (tmp_path / "run.spool.jsonl").exists()
    finally:
        sink.gate.set()
        delivery.close(5)


@pytest.mark.usefixtures("wall_clock")  # the first flush runs out of real time
def test_a_brief_flush_waits_no_more_on_a_backend_call_an_earlier_flush_timed_out_on(tmp_path):
    """Hostile finding: with a server that accepts and never answers, every logger flush (one a
    step, through CheckpointCallback) waited its whole bound, 10 s a step."""
    sink = _StuckSink()
    delivery = AsyncDelivery(
        sink, spool_path=tmp_path / "run.spool.jsonl", media_dir=tmp_path / "media", label="stuck"
    )
    try:
        delivery.submit(("loss", 0.0, 0, time.time()))
        assert delivery.persist(5.0)
        assert not delivery.flush(1.0, brief=True)  # the call hangs: this flush waits it out
        for step in range(1, 4):
            delivery.submit(("loss", float(step), step, time.time()))
            assert delivery.persist(5.0)  # on disk: a kill loses nothing
            started = time.monotonic()
            assert not delivery.flush(5.0, brief=True)
            assert time.monotonic() - started < 1.0  # no wait on the same hung call
        sink.gate.set()  # the server answers: every record arrives
        assert delivery.flush(60)  # wait_delivered: waits for the call
        assert sorted(r.step for r in sink.received) == [0, 1, 2, 3]
    finally:
        sink.gate.set()
        delivery.close(5)


def test_a_file_log_flush_writes_and_fsyncs_every_line(tmp_path, monkeypatch):
    from substrax.tracking import _file

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        _file.os,
        "fsync",
        lambda fd: (synced.append(str(Path(f"/proc/self/fd/{fd}").readlink())), real_fsync(fd)),
    )
    logger = FileLogger("run", tmp_path, flush_every=3600)  # nothing is written until a flush
    for step in range(10):
        logger.log_scalar("loss", float(step), step=step)
    assert read_scalars(logger.metrics_jsonl) == {}
    logger.flush()
    assert read_scalars(logger.metrics_jsonl)["loss"] == [(s, float(s)) for s in range(10)]
    assert {str(logger.metrics_jsonl), str(logger.metrics_csv)} <= set(synced)
    logger.close()


def test_a_tensorboard_flush_writes_every_event_logged_before_it(tmp_path):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra is needed")
    from tensorboard.backend.event_processing import event_accumulator

    from substrax.tracking import TensorBoardLogger

    logger = TensorBoardLogger("run", tmp_path)
    for step in range(5000):
        logger.log_scalar("loss", float(step), step=step)
    logger.flush()  # not closed: what a kill right now would leave
    board = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    board.Reload()
    assert [event.step for event in board.Scalars("loss")] == list(range(5000))
    logger.log_scalar("loss", 5000.0, step=5000)  # the writer goes on after a flush
    logger.flush()  # a second file, opened in the same second, leaves the first one whole
    logger.log_scalar("loss", 5001.0, step=5001)
    logger.close()
    board.Reload()
    assert [event.step for event in board.Scalars("loss")] == list(range(5002))
    again = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    assert [event.step for event in again.Reload().Scalars("loss")] == list(range(5002))
