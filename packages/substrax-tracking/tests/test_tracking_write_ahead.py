"""What a hostile user found in the write-ahead spool: each case a record lost, sent twice, or a run left open."""

import json
import math
import time
from typing import ClassVar

import numpy as np
import pytest

from substrax.tracking import MLFlowLogger, _spool_writer, replay_spool
from substrax.tracking._records import Record
from substrax.tracking._send import target_key
from substrax.tracking._sink import register_sink_factory


class Sink:
    """A backend we control: down, slow, or unable to end the run."""

    made: ClassVar[list["Sink"]] = []
    log: ClassVar[list[int] | None] = None  # every instance's delivered steps, in order
    down_all: ClassVar[bool] = False

    def __init__(self, target=None):
        self._target = dict(target or {"backend": "wa-test", "run": "r1"})
        self.received = []
        self.down = False
        self.finish_down = False
        self.finished = False
        self.failed = False
        self.delay = 0.0
        self.sleep = None  # a wall clock's, where a test makes the backend slow
        self.refuse_nan = False
        Sink.made.append(self)

    def target(self):
        return self._target

    def deliver(self, records):
        if self.delay:
            self.sleep(self.delay)
        if self.down or Sink.down_all:
            raise ConnectionError("server gone")
        if self.refuse_nan and any(
            math.isnan(v) for r in records for v in r.payload.get("values", {}).values()
        ):
            raise ValueError("NaN refused")
        self.received.extend(records)
        if Sink.log is not None:
            Sink.log.extend(r.step for r in records if r.step is not None)

    def is_permanent(self, error):
        return isinstance(error, ValueError)

    def finish(self):
        if self.finish_down:
            raise ConnectionError("server gone at the end")
        self.finished = True


register_sink_factory("wa-test", Sink)


def record(step, value=None):
    values = {"loss": float(step) if value is None else value}
    return Record(kind="scalars", step=step, time=time.time(), payload={"values": values})


def steps(records):
    return [r.step for r in records]


def test_a_run_whose_end_fails_at_close_is_ended_by_the_replay(make, tmp_path, caplog):
    sink = Sink()
    delivery = make(sink)
    delivery.submit(record(0))
    assert delivery.flush(30)
    sink.finish_down = True
    with caplog.at_level("WARNING", logger="substrax.tracking"):
        assert delivery.close(timeout=0.3) == 0  # every record arrived
    assert "the run could not be ended" in caplog.text
    assert not sink.finished
    Sink.made.clear()
    result = replay_spool(tmp_path / "run.spool.jsonl")
    assert (result.delivered, result.remaining) == (1, 0)
    [replayed] = Sink.made
    assert replayed.finished
    assert not replayed.failed


def test_an_end_that_fails_once_is_retried_within_close_timeout(make, tmp_path):
    sink = Sink()
    delivery = make(sink)
    delivery.submit(record(0))
    ended = sink.finish

    def once():
        sink.finish = ended  # the next try works
        raise ConnectionError("a blip")

    sink.finish = once
    assert delivery.close(timeout=5) == 0
    assert sink.finished
    assert steps(sink.received) == [0]
    assert not (tmp_path / "run.spool.jsonl").exists()


def test_a_replay_leaves_a_live_loggers_records_and_run_to_it(make, tmp_path, capsys):
    sink = Sink()
    sink.down = True
    delivery = make(sink)
    for step in range(5):
        delivery.submit(record(step))
    assert delivery.persist(30)
    other = Sink()
    key = target_key(sink.target())
    result = replay_spool(tmp_path / "run.spool.jsonl", sinks={key: other})
    assert (result.delivered, result.remaining) == (0, 5)  # the live logger sends them
    assert other.received == []
    assert not other.finished
    # hostile finding: the command exited 0 (its table: every record delivered), saying nothing
    from substrax.tracking._cli import main

    assert main(["replay", str(tmp_path / "run.spool.jsonl"), "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["live"] == 5
    assert "5 records stay in" in err
    assert "for a logger that still sends their run" in err
    sink.down = False
    assert delivery.flush(30)
    assert steps(sink.received) == list(range(5))
    delivery.close(5)
    assert sink.finished


def test_a_record_appended_after_a_line_cut_by_a_crash_is_whole(make, tmp_path):
    spool = tmp_path / "run.spool.jsonl"
    spool.write_text('{"target": {"backend": "wa-test", "run": "r0"}, "rec')  # no newline
    sink = Sink()
    delivery = make(sink)
    for step in range(3):
        delivery.submit(record(step))
    assert delivery.flush(30)
    assert steps(sink.received) == [0, 1, 2]
    assert '"rec' in (tmp_path / "run.spool.jsonl.bad").read_text()


def test_close_stops_an_abandoned_sender_at_its_next_batch(make, tmp_path, wall_clock):
    sink = Sink()
    spool = tmp_path / "run.spool.jsonl"
    line = {"target": sink.target(), "record": record(1).materialize(tmp_path).to_json()}
    spool.write_text(f"{json.dumps(line)}\n" * 30_000)
    sink.delay, sink.sleep = 0.2, wall_clock.sleep  # each batch of 1000
    delivery = make(sink)
    wall_clock.sleep(0.3)
    delivery.close(timeout=0.1)  # it returns with the sender inside a batch
    delivery._sender.join(30)  # under load, reading 30,000 lines takes seconds before a batch
    assert not delivery._sender.is_alive()  # it stopped after that batch
    assert len(sink.received) < 15_000  # not every batch: half of them take 3 s
    left = sum('"step": null' not in line for line in spool.read_text().splitlines())
    assert left + len(sink.received) == 30_000  # what arrived left the spool, nothing twice


def test_with_the_disk_full_and_the_server_up_records_are_sent_from_memory(make, small_disk):
    sink = Sink()
    delivery = make(sink, spool=small_disk.path / "run.spool.jsonl")
    small_disk.fill()
    for step in range(300):
        delivery.submit(record(step))
    assert delivery.flush(30)
    assert steps(sink.received) == list(range(300))
    assert delivery.close(5) == 0
    assert sink.finished


def test_an_image_logged_while_the_disk_is_full_waits_and_arrives_whole(make, small_disk):
    sink = Sink()
    sink.down = True
    delivery = make(sink, spool=small_disk.path / "run.spool.jsonl")
    delivery._spool.media_dir = small_disk.path / "media"
    small_disk.fill()
    pixels = np.zeros((64, 64, 3), np.uint8)
    delivery.submit(
        Record(kind="image", step=1, time=time.time(), payload={"name": "x", "images": [pixels]})
    )
    assert not delivery.persist(2)  # nowhere to write it: it waits in memory
    small_disk.free()
    sink.down = False
    assert delivery.flush(30)
    [image] = sink.received
    assert image.kind == "image"
    assert "unserializable" not in image.payload
    assert image.payload["paths"][0].endswith(".png")


def test_a_resume_with_an_earlier_attempts_spool_logs_every_step_once(tmp_path, sqlite_uri):
    from mlflow.tracking import MlflowClient

    with MLFlowLogger("run", tracking_uri=sqlite_uri, log_dir=tmp_path / "a") as first:
        for step in range(111):
            first.log_scalar("loss", float(step), step=step)
        run_id = first.run_id
    # what the first attempt left in its spool while the server was down: steps 111-150
    target = {"backend": "mlflow", "tracking_uri": sqlite_uri, "run_id": run_id}
    spool = tmp_path / "b" / "run.spool.jsonl"
    spool.parent.mkdir()
    lines = [
        {"target": target, "record": record(step, 1000.0 + step).materialize(tmp_path).to_json()}
        for step in range(111, 151)
    ]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with MLFlowLogger(
        "run", tracking_uri=sqlite_uri, log_dir=tmp_path / "b", run_id=run_id, resume_step=100
    ) as resumed:
        for step in range(101, 201):
            resumed.log_scalar("loss", float(step), step=step)
    history = MlflowClient(tracking_uri=sqlite_uri).get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(201))  # each step once
    values = {m.step: m.value for m in history}
    assert values[120] == 1120.0  # what the first attempt logged keeps its value
    assert values[180] == 180.0


class HangingSink(Sink):
    """Another run's backend, which never answers."""

    gate = None

    def deliver(self, records):
        HangingSink.gate.wait(30)
        super().deliver(records)


register_sink_factory("wa-hang", HangingSink)


def test_another_runs_hanging_backend_holds_up_this_run_at_most_a_few_seconds(
    make, tmp_path, monkeypatch
):
    import threading

    # the bound on sending what other runs left (5 s), shorter here: waited out whole below
    monkeypatch.setattr(_spool_writer, "_FOUND_TIMEOUT", 0.5)
    HangingSink.gate = threading.Event()
    spool = tmp_path / "run.spool.jsonl"
    foreign = {"target": {"backend": "wa-hang", "run": "other"}, "record": record(0).to_json()}
    spool.write_text(json.dumps(foreign) + "\n")
    sink = Sink()
    delivery = make(sink)
    delivery.submit(record(1))
    started = time.monotonic()
    try:
        assert delivery.flush(30)
        assert time.monotonic() - started < 0.5 + 5  # the other run's send is bounded
        assert steps(sink.received) == [1]
    finally:
        HangingSink.gate.set()


def test_an_earlier_attempts_lines_of_the_same_run_go_first_once_the_server_answers(
    make, tmp_path, monkeypatch
):
    sent = []
    monkeypatch.setattr(Sink, "log", sent)
    monkeypatch.setattr(Sink, "down_all", True)  # down as the resumed logger starts
    spool = tmp_path / "run.spool.jsonl"
    earlier = {"backend": "wa-test", "run": "r1"}  # the same run, before a resume
    lines = [{"target": earlier, "record": record(step).to_json()} for step in range(3)]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    sink = Sink({"backend": "wa-test", "run": "r1", "resume_step": 1})
    delivery = make(sink)
    delivery.submit(record(5))
    assert not delivery.flush(0.5)
    monkeypatch.setattr(Sink, "down_all", False)
    assert delivery.flush(30)
    assert sent == [0, 1, 2, 5]  # the earlier attempt's first, then this one's
    assert not spool.exists()


def test_a_run_named_anew_sends_its_earlier_lines_first_after_a_failed_send(make, monkeypatch):
    """A run created late (MLflow's, once the server answers) keeps its order across a failure.

    Lines spooled while the run had no id name its spec; lines after name its id. A send of the
    spec's lines that fails holds back the id's lines of the same pass: they go after, in order.
    """
    sent = []
    monkeypatch.setattr(Sink, "log", sent)
    sink = Sink({"backend": "wa-test", "run_key": "k1"})  # the run to create, by its key
    sink.down = True
    delivery = make(sink)
    for step in (0, 1):
        delivery.submit(record(step))
    assert not delivery.flush(0.5)  # spooled under the spec
    sink._target = {"backend": "wa-test", "run": "r1"}  # created meanwhile: named by its id
    assert not delivery.flush(0.5)  # a pass follows the new name
    for step in (2, 3):
        delivery.submit(record(step))
    deliver, failures = Sink.deliver, [ConnectionError("reset by peer")]

    def flapping(self, records):  # the spec's lines meet the server's last failure
        if failures:
            raise failures.pop()
        deliver(self, records)

    monkeypatch.setattr(Sink, "deliver", flapping)
    sink.down = False
    assert delivery.flush(30)
    assert sent == [0, 1, 2, 3]


def test_hyperparameter_keys_that_are_one_name_once_written_are_refused(tmp_path):
    from substrax.tracking import FileLogger

    with FileLogger("run", tmp_path) as logger, pytest.raises(ValueError, match="are one name"):
        logger.log_hyperparams({1: 2, "1": 3})


def test_flush_keeps_trying_a_failing_backend_within_its_timeout(make):
    import threading

    sink = Sink()
    sink.down = True
    delivery = make(sink)
    delivery.submit(record(0))
    up = threading.Timer(0.5, lambda: setattr(sink, "down", False))
    up.start()
    try:
        assert delivery.flush(20)  # it gave up after the first failed send
    finally:
        up.cancel()
    assert steps(sink.received) == [0]


def test_a_replay_ends_no_run_whose_later_lines_failed(tmp_path, monkeypatch):
    spool = tmp_path / "run.spool.jsonl"
    first = {"backend": "wa-test", "run": "r9"}
    resumed = {"backend": "wa-test", "run": "r9", "resume_step": 1}  # the same run
    lines = [{"target": first, "record": record(0).to_json()}]
    lines.append({"target": resumed, "record": record(2).to_json()})
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    deliver = Sink.deliver

    def down_when_resumed(self, records):
        if "resume_step" in self._target:
            raise ConnectionError("server gone")
        deliver(self, records)

    monkeypatch.setattr(Sink, "deliver", down_when_resumed)
    Sink.made.clear()
    result = replay_spool(spool)
    assert (result.delivered, result.remaining) == (1, 1)
    assert not any(sink.finished for sink in Sink.made)  # its later lines are still to send


def test_on_a_full_disk_a_delivered_line_is_not_sent_again(make, small_disk):
    sink = Sink()
    sink.down = True
    delivery = make(sink, spool=small_disk.path / "run.spool.jsonl")
    delivery.submit(record(0))
    delivery.submit(record(1, value=float("nan")))  # refused: set aside needs room
    delivery.submit(record(2))
    assert delivery.persist(10)
    small_disk.fill()
    sink.down = False
    sink.refuse_nan = True
    # each flush sends many times (quick retries) and ends False: the refused line cannot go
    assert not delivery.flush(0.5)
    assert not delivery.flush(0.5)  # more sends: the delivered lines left the spool in place
    assert steps(sink.received) == [0, 2]
    small_disk.free()
    assert delivery.flush(10)
    assert steps(sink.received) == [0, 2]
    assert len((small_disk.path / "run.spool.jsonl.refused").read_text().splitlines()) == 1
