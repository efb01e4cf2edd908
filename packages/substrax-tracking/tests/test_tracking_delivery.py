"""The background delivery of remote loggers, driven through its Sink protocol by a sink of our own."""

import json
import logging
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from substrax.tracking import _spool_writer, replay_spool
from substrax.tracking._records import Record


class Sink:
    """A backend we control: it can be down, blocked or refuse values."""

    def __init__(self):
        self.received = []
        self.down = False
        self.gate = threading.Event()
        self.gate.set()
        self.finished = False
        self.attempts = 0
        self.fail_next = 0  # how many sends fail next, as in a brief outage

    def target(self):
        return {"backend": "test", "run": "r1"}

    def deliver(self, records):
        self.attempts += 1
        self.gate.wait(30)
        if self.down:
            raise ConnectionError("server gone")
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("a blip")
        for record in records:
            if record.payload.get("values", {}).get("refuse"):
                raise ValueError("refused value")
        self.received.extend(records)

    def is_permanent(self, error):
        return isinstance(error, ValueError)

    def finish(self):
        self.finished = True


def record(step, **values):
    return Record(
        kind="scalars",
        step=step,
        time=time.time(),
        payload={"values": values or {"loss": float(step)}},
    )


def steps(records):
    return [r.step for r in records]


def test_submit_never_waits_for_a_blocked_backend(make):
    sink = Sink()
    sink.gate.clear()
    delivery = make(sink)
    for step in range(1000):
        delivery.submit(record(step))
    assert sink.received == []  # every call returned while the backend was still blocked
    sink.gate.set()
    assert delivery.flush(30)
    assert steps(sink.received) == list(range(1000))
    assert sink.attempts < 1000  # delivered in batches


def test_a_scalar_queued_as_a_tuple_arrives_as_its_record_in_order(make):
    sink = Sink()
    delivery = make(sink)
    delivery.submit(record(0))
    delivery.submit(("loss", np.float32(1.5), 1, 123.0))  # what a logger's log_scalar queues
    delivery.submit(record(2))
    assert delivery.flush(30)
    assert steps(sink.received) == [0, 1, 2]
    one = sink.received[1]
    assert (one.kind, one.time, one.payload) == ("scalars", 123.0, {"values": {"loss": 1.5}})
    assert type(one.payload["values"]["loss"]) is float


def test_scalars_queued_as_tuples_are_spooled_at_close_like_records(make, tmp_path, wait_for):
    sink = Sink()
    sink.gate.clear()
    delivery = make(sink, max_queue=2, batch_interval=0.01)
    delivery.submit(("loss", 0.0, 0, time.time()))
    wait_for(lambda: sink.attempts == 1)  # the worker holds step 0, blocked in the backend
    for step in range(1, 6):
        delivery.submit(("loss", float(step), step, time.time()))
    assert delivery.close(timeout=0.5) == 6
    spooled = [
        json.loads(line)["record"]
        for line in (tmp_path / "run.spool.jsonl").read_text().splitlines()
    ]
    records = [r for r in spooled if r["step"] is not None]  # and the mark that ends the run
    assert sorted((r["kind"], r["step"], r["payload"]["values"]["loss"]) for r in records) == [
        ("scalars", step, float(step)) for step in range(6)
    ]
    sink.gate.set()  # the stuck call returns
    delivery._sender.join(30)


def test_records_are_held_for_the_batch_interval_and_sent_in_one_batch(make, wall_clock):
    sink = Sink()
    delivery = make(sink, batch_interval=60)
    delivery.submit(record(0))
    # a worker that sent each record as it came would have sent this one alone
    wall_clock.sleep(0.3)
    for step in range(1, 10):
        delivery.submit(record(step))
    assert sink.attempts == 0
    assert delivery.flush(30)  # a flush sends what is held at once
    assert steps(sink.received) == list(range(10))
    assert sink.attempts == 1


def test_a_healthy_sender_sends_once_per_send_interval_and_at_once_for_a_flush(
    make, wait_for, wall_clock
):
    sink = Sink()
    delivery = make(sink, batch_interval=0.01, send_interval=60)
    delivery.submit(record(0))
    wait_for(lambda: steps(sink.received) == [0])  # the first pass goes at once
    for step in range(1, 5):
        delivery.submit(record(step))
    assert delivery.persist(10)  # on disk, but the next pass is 60 s after the first
    wall_clock.sleep(0.3)
    assert steps(sink.received) == [0]
    assert delivery.spooled == 4
    assert delivery.flush(30)
    assert steps(sink.received) == list(range(5))


def test_a_first_pass_that_sends_an_earlier_attempts_records_sets_the_send_interval(
    make, tmp_path, wait_for, wall_clock
):
    # only a pass in the loop set the next one's time: after a first pass that sent what an
    # earlier attempt left, the next write was sent at once, not a send_interval later
    sink = Sink()
    line = {"target": sink.target(), "record": record(0).materialize(tmp_path).to_json()}
    (tmp_path / "run.spool.jsonl").write_text(json.dumps(line) + "\n")
    delivery = make(sink, batch_interval=0.01, send_interval=60)
    wait_for(lambda: steps(sink.received) == [0])
    for step in range(1, 5):
        delivery.submit(record(step))
    assert delivery.persist(10)
    wall_clock.sleep(0.3)
    assert steps(sink.received) == [0]
    assert delivery.flush(30)
    assert steps(sink.received) == list(range(5))


def test_a_flush_after_a_brief_outage_retries_with_the_backoff_not_the_send_interval(make):
    # the retries of a flush's pass waited for the next send_interval (5 s) each, so a flush
    # of 3 s after one failed send returned False
    sink = Sink()
    delivery = make(sink, send_interval=60)
    delivery.submit(record(0))
    assert delivery.flush(30)
    sink.fail_next = 2
    for step in range(1, 4):
        delivery.submit(record(step))
    assert delivery.flush(10)
    assert steps(sink.received) == list(range(4))


def test_held_records_go_without_a_flush_once_the_interval_passed_or_a_batch_is_full(
    make, wait_for
):
    by_time = Sink()
    make(by_time, batch_interval=0.1).submit(record(0))
    wait_for(lambda: steps(by_time.received) == [0])
    by_size = Sink()
    delivery = make(by_size, batch_interval=60, max_queue=5)
    for step in range(5):
        delivery.submit(record(step))
    wait_for(lambda: steps(by_size.received) == list(range(5)))
    assert by_size.attempts == 1


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread CPU priority needs Linux")
def test_the_worker_runs_at_a_lower_cpu_priority_than_the_caller(make, wait_for):
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    if ours >= 19:
        pytest.skip("the tests run at the lowest CPU priority already: none is lower")
    delivery = make(Sink())
    wait_for(lambda: os.getpriority(os.PRIO_PROCESS, delivery._thread.native_id) > ours)
    assert os.getpriority(os.PRIO_PROCESS, 0) == ours  # the caller's thread is left alone


def test_a_failing_backend_is_warned_once_retried_and_everything_arrives_in_order(
    make, caplog, wait_for
):
    sink = Sink()
    sink.down = True
    delivery = make(sink, batch_interval=0.01)
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        for step in range(50):
            delivery.submit(record(step))
        wait_for(lambda: delivery.failures >= 5)
        for step in range(50, 60):
            delivery.submit(record(step))
        sink.down = False
        assert delivery.flush(30)
    assert steps(sink.received) == list(range(60))
    warnings = [r for r in caplog.records if "could not deliver" in r.getMessage()]
    assert len(warnings) == 1
    assert "reported once" in warnings[0].getMessage()
    assert any("delivering again" in r.getMessage() for r in caplog.records)


def test_what_is_undelivered_at_close_is_spooled_then_replayed(make, tmp_path, caplog):
    sink = Sink()
    sink.down = True
    delivery = make(sink)
    for step in range(5):
        delivery.submit(record(step))
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        assert delivery.close(timeout=0.2) == 5
    assert "python -m substrax.tracking replay" in caplog.text
    assert not sink.finished  # a backend that is down is not asked to end the run; replay does
    spool = tmp_path / "run.spool.jsonl"
    lines = [json.loads(line) for line in spool.read_text().splitlines()]
    assert [line["record"]["step"] for line in lines] == list(range(5))
    assert lines[0]["target"] == {"backend": "test", "run": "r1"}
    revived = Sink()
    result = replay_spool(spool, sinks={json.dumps(revived.target(), sort_keys=True): revived})
    assert (result.delivered, result.remaining) == (5, 0)
    assert steps(revived.received) == list(range(5))
    assert revived.received[0].payload == {"values": {"loss": 0.0}}
    assert not spool.exists()


def test_a_later_logger_replays_the_spool_it_finds(make, tmp_path):
    sink = Sink()
    sink.down = True
    first = make(sink)
    first.submit(record(0))
    first.close(timeout=0.1)
    assert (tmp_path / "run.spool.jsonl").exists()
    later = Sink()
    delivery = make(later)
    delivery.submit(record(1))
    assert delivery.flush(30)
    assert steps(later.received) == [0, 1]
    assert not (tmp_path / "run.spool.jsonl").exists()


def test_records_are_written_ahead_to_the_spool_while_the_backend_is_blocked(
    make, tmp_path, wait_for
):
    sink = Sink()
    sink.gate.clear()
    delivery = make(sink, max_queue=2)
    delivery.submit(record(0))
    wait_for(lambda: sink.attempts == 1)  # the sender holds record 0, blocked in the backend
    for step in range(1, 2503):
        delivery.submit(record(step))
    assert delivery.persist(30)  # the writer never waits for the backend
    spool = tmp_path / "run.spool.jsonl"
    spooled = [json.loads(line)["record"]["step"] for line in spool.read_text().splitlines()]
    assert spooled == list(range(2503))
    assert delivery.spooled == 2503
    sink.gate.set()
    assert delivery.flush(30)
    assert not spool.exists()
    assert steps(sink.received) == list(range(2503))


def test_a_refused_record_is_set_aside_with_its_error_and_the_rest_goes_on(make, tmp_path, caplog):
    sink = Sink()
    delivery = make(sink)
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        delivery.submit(record(0))
        delivery.submit(record(1, refuse=1.0))
        delivery.submit(record(2))
        assert delivery.flush(30)
    assert steps(sink.received) == [0, 2]
    assert not (tmp_path / "run.spool.jsonl").exists()
    refused = (tmp_path / "run.spool.jsonl.refused").read_text().splitlines()
    [line] = [json.loads(line) for line in refused]
    assert line["error"] == "ValueError: refused value"
    assert line["record"]["step"] == 1
    assert "refused" in caplog.text


def test_close_returns_in_time_while_the_backend_is_stuck_and_spools_everything(
    make, tmp_path, caplog, wait_for
):
    sink = Sink()
    sink.gate.clear()  # every delivery hangs inside the backend call
    delivery = make(sink, batch_interval=0.01)
    for step in range(500):
        delivery.submit(record(step))
    wait_for(lambda: sink.attempts >= 1)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        assert delivery.close(timeout=0.5) == 500
    assert time.monotonic() - started < 0.5 + 2  # was close_timeout + 30 s
    spool = tmp_path / "run.spool.jsonl"
    spooled = [json.loads(line)["record"]["step"] for line in spool.read_text().splitlines()]
    assert sorted(step for step in spooled if step is not None) == list(range(500))
    assert spooled[-1] is None  # a mark for the replay that ends the run the call may finish
    assert f"python -m substrax.tracking replay {spool}" in caplog.text
    sink.gate.set()  # the stuck call returns: what it delivered leaves the spool, nothing more
    delivery._sender.join(30)
    assert not delivery._sender.is_alive()
    lines = spool.read_text().splitlines() if spool.exists() else []
    left = [json.loads(line)["record"]["step"] for line in lines]
    assert sorted(step for step in left + steps(sink.received) if step is not None) == list(
        range(500)
    )
    assert not sink.finished


def test_replay_gives_up_after_its_timeout_and_keeps_every_record(tmp_path):
    sink = Sink()
    sink.gate.clear()
    spool = tmp_path / "run.spool.jsonl"
    lines = [
        {"target": sink.target(), "record": record(step).materialize(tmp_path).to_json()}
        for step in range(5)
    ]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    started = time.monotonic()
    result = replay_spool(
        spool, sinks={json.dumps(sink.target(), sort_keys=True): sink}, timeout=0.3
    )
    assert time.monotonic() - started < 0.3 + 2
    assert result.timed_out
    assert (result.delivered, result.remaining) == (0, 5)
    assert [json.loads(line) for line in spool.read_text().splitlines()] == lines
    sink.gate.set()


def test_replay_of_a_damaged_spool_delivers_the_intact_records_and_sets_the_bad_lines_aside(
    tmp_path, caplog
):
    sink = Sink()
    spool = tmp_path / "run.spool.jsonl"
    good = [
        json.dumps({"target": sink.target(), "record": record(s).materialize(tmp_path).to_json()})
        for s in range(4)
    ]
    not_a_record = json.dumps({"target": sink.target(), "record": {"kind": "nonsense"}})
    spool.write_text("\n".join([good[0], "][", good[1], not_a_record, good[2], good[3][:25]]))
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        result = replay_spool(spool, sinks={json.dumps(sink.target(), sort_keys=True): sink})
    assert (result.delivered, result.remaining, result.bad_lines) == (3, 0, (2, 4, 6))
    assert steps(sink.received) == [0, 1, 2]
    assert "line 2:" in caplog.text
    assert "line 6:" in caplog.text
    assert not spool.exists()
    assert (tmp_path / "run.spool.jsonl.bad").read_text().splitlines() == [
        "][",
        not_a_record,
        good[3][:25],
    ]


def test_a_live_logger_says_which_lines_of_its_spool_it_set_aside_as_damaged(
    make, tmp_path, caplog
):
    # hostile finding: the sender moved damaged lines to SPOOL.bad without a word
    sink = Sink()
    spool = tmp_path / "run.spool.jsonl"
    good = json.dumps(
        {"target": sink.target(), "record": record(0).materialize(tmp_path).to_json()}
    )
    spool.write_text(good + "\n" + good[:30] + "\n")  # one line cut short, as by a crash
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        delivery = make(sink)
        delivery.submit(record(1))
        assert delivery.flush(30)
    assert steps(sink.received) == [0, 1]
    warned = [r.getMessage() for r in caplog.records if "are not records" in r.getMessage()]
    assert len(warned) == 1
    assert f"test: lines of {spool} are not records: line 2:" in warned[0]
    assert f"moved to {spool}.bad" in warned[0]


@pytest.mark.parametrize("step", [-3, 11.5, True, "7"])
def test_a_spooled_step_no_logger_takes_is_a_bad_line(tmp_path, step):
    """Hostile finding: a hand-edited step of -3 or 11.5 reached MLflow as it was."""
    sink = Sink()
    spool = tmp_path / "run.spool.jsonl"
    edited = record(0).materialize(tmp_path).to_json() | {"step": step}
    lines = [{"target": sink.target(), "record": edited}]
    lines.append({"target": sink.target(), "record": record(1).materialize(tmp_path).to_json()})
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = replay_spool(spool, sinks={json.dumps(sink.target(), sort_keys=True): sink})
    assert (result.delivered, result.bad_lines) == (1, (1,))
    assert steps(sink.received) == [1]


def test_a_spooled_record_without_its_step_is_a_bad_line_saying_so(tmp_path):
    # hostile finding: the reason read "line 1: 'step'", a bare KeyError's text
    sink = Sink()
    spool = tmp_path / "run.spool.jsonl"
    stepless = record(0).materialize(tmp_path).to_json()
    del stepless["step"]
    spool.write_text(json.dumps({"target": sink.target(), "record": stepless}) + "\n")
    result = replay_spool(spool, sinks={json.dumps(sink.target(), sort_keys=True): sink})
    assert result.bad_lines == (1,)
    assert result.bad_reasons == ("a scalars record without step",)


def test_replay_refuses_what_is_not_a_spool_and_leaves_it_untouched(tmp_path, capsys):
    from substrax.tracking import NotASpoolError
    from substrax.tracking._cli import main

    metrics = tmp_path / "run.metrics.jsonl"  # a FileLogger's log, passed by mistake
    metrics.write_text('{"time":1.0,"step":0,"name":"loss","value":0.5}\n')
    directory = tmp_path / "a_dir"  # the command replays a log directory's spools: not the API
    directory.mkdir()
    fifo = tmp_path / "a_fifo"  # not a regular file, like a device
    os.mkfifo(fifo)
    for path in (metrics, directory, fifo):
        if path is not directory:
            assert main(["replay", str(path), "--timeout", "5"]) == 2
            [line] = capsys.readouterr().err.splitlines()
            assert line.startswith("python -m substrax.tracking: error: ")
            assert "is not a spool file" in line
        with pytest.raises(NotASpoolError) as caught:
            replay_spool(path)
        assert isinstance(caught.value, ValueError)
        assert caught.value.path == path
    assert metrics.read_text() == '{"time":1.0,"step":0,"name":"loss","value":0.5}\n'
    assert directory.is_dir()
    assert fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir", "a_fifo", "run.metrics.jsonl"]


@pytest.mark.parametrize("timeout", ["nan", "inf", "-1"])
def test_replay_refuses_a_timeout_that_is_not_a_finite_number(tmp_path, capsys, timeout):
    from substrax.tracking._cli import main

    spool = tmp_path / "run.spool.jsonl"
    spool.write_text("")
    assert main(["replay", str(spool), "--timeout", timeout]) == 2
    assert capsys.readouterr().err == (
        f"python -m substrax.tracking: error: --timeout={float(timeout)!r} must be a finite number "
        "of seconds >= 0 (0 waits as long as the backends take)\n"
    )
    with pytest.raises(ValueError, match="timeout="):
        replay_spool(spool, timeout=float(timeout))


def test_the_replay_command_says_what_it_could_not_deliver_in_one_line_and_exits_1(
    tmp_path, capsys, monkeypatch
):
    from substrax.tracking import _sink
    from substrax.tracking._cli import main

    sink = Sink()
    sink.down = True
    monkeypatch.setitem(_sink._FACTORIES, "test", lambda _target: sink)
    spool = tmp_path / "run.spool.jsonl"
    lines = [
        json.dumps({"target": sink.target(), "record": record(s).materialize(tmp_path).to_json()})
        for s in range(3)
    ]
    spool.write_text("\n".join([*lines, "{cut short"]) + "\n")
    assert main(["replay", str(spool), "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "spool": str(spool),
        "delivered": 0,
        "remaining": 3,
        "refused": 0,
        "bad_lines": [4],
        "timed_out": False,
        "live": 0,
        "failures": [{"target": sink.target(), "error": "ConnectionError: server gone"}],
    }
    [line] = captured.err.splitlines()
    assert line.startswith(f"python -m substrax.tracking: error: 3 records stay in {spool}")
    assert "ConnectionError: server gone" in line
    assert "line 4:" in line
    assert spool.read_text().splitlines() == lines  # kept for the next try

    sink.down = False
    assert main(["replay", str(spool)]) == 0
    assert capsys.readouterr() == ("delivered 3, remaining 0\n", "")
    assert steps(sink.received) == [0, 1, 2]
    assert not spool.exists()


def test_a_spooled_record_the_backend_refuses_is_set_aside_and_the_rest_is_delivered(
    make, tmp_path, caplog, wait_for
):
    sink = Sink()
    sink.down = True
    delivery = make(sink, batch_interval=0.01)
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        for step in range(6):
            delivery.submit(record(step, refuse=1.0) if step == 2 else record(step))
        wait_for(lambda: delivery.failures >= 2)  # all six wait in the spool
        sink.down = False
        assert delivery.flush(30)  # not blocked forever by the refused record
        assert delivery.close(timeout=5) == 0
    assert steps(sink.received) == [0, 1, 3, 4, 5]
    assert sink.finished
    spool = tmp_path / "run.spool.jsonl"
    assert not spool.exists()
    [line] = [
        json.loads(t) for t in (tmp_path / "run.spool.jsonl.refused").read_text().splitlines()
    ]
    assert (line["record"]["step"], line["error"]) == (2, "ValueError: refused value")
    assert "unreachable" not in caplog.text
    [warned] = [r.getMessage() for r in caplog.records if r.name.endswith("_refusals")]
    assert "the backend refused metric 'refuse' at step 2 (ValueError: refused value)" in warned


def test_replay_sets_a_refused_record_aside_and_include_refused_sends_it_again(tmp_path):
    sink = Sink()
    spool = tmp_path / "run.spool.jsonl"
    key = json.dumps(sink.target(), sort_keys=True)
    lines = [
        {
            "target": sink.target(),
            "record": (record(s, refuse=1.0) if s == 1 else record(s))
            .materialize(tmp_path)
            .to_json(),
        }
        for s in range(4)
    ]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = replay_spool(spool, sinks={key: sink})
    assert (result.delivered, result.remaining, result.refused) == (3, 0, 1)
    assert result.refused_file == tmp_path / "run.spool.jsonl.refused"
    assert steps(sink.received) == [0, 2, 3]
    assert not spool.exists()
    spool.write_text("")  # a new spool file: --include-refused moves the refused record back
    accepting = Sink()
    accepting.deliver = accepting.received.extend
    result = replay_spool(spool, sinks={key: accepting}, include_refused=True)
    assert (result.delivered, result.remaining, result.refused) == (1, 0, 0)
    assert steps(accepting.received) == [1]
    assert not (tmp_path / "run.spool.jsonl.refused").exists()


APPENDER = """
import sys, time
from substrax.tracking._records import Record
from substrax.tracking._spool import SpoolFile
spool, who, batches = SpoolFile(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for batch in range(batches):
    records = [
        Record(kind="scalars", step=batch * 10 + i, time=0.0, payload={"values": {who: 1.0}},
               materialized=True)
        for i in range(10)
    ]
    spool.append({"backend": "test", "run": "r1"}, records)
"""


@pytest.mark.usefixtures("child_processes")
def test_processes_appending_while_a_replay_runs_lose_no_record(tmp_path):
    spool = tmp_path / "run.spool.jsonl"
    sink = Sink()
    key = json.dumps(sink.target(), sort_keys=True)
    writers = [
        subprocess.Popen([sys.executable, "-c", APPENDER, str(spool), who, "300"])
        for who in ("a", "b")
    ]
    while any(w.poll() is None for w in writers):
        if spool.exists():
            replay_spool(spool, sinks={key: sink})
    assert [w.wait(60) for w in writers] == [0, 0]
    if spool.exists():
        replay_spool(spool, sinks={key: sink})
    for who in ("a", "b"):
        got = sorted(r.step for r in sink.received if who in r.payload["values"])
        assert got == list(range(3000)), who  # each record exactly once
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no spool and no lock file left


@pytest.mark.usefixtures("child_processes")
def test_close_stays_within_its_timeout_with_a_large_spool(make, tmp_path, wait_for):
    sink = Sink()
    sink.down = True
    spool = tmp_path / "run.spool.jsonl"
    line = json.dumps(
        {"target": sink.target(), "record": record(1).materialize(tmp_path).to_json()}
    )
    spool.write_text(f"{line}\n" * 50_000)
    started = time.monotonic()
    delivery = make(sink)
    wait_for(lambda: delivery.failures >= 1, timeout=240)  # the found spool, read whole
    read = time.monotonic() - started
    wait_for(lambda: delivery.failures >= 2, timeout=240)  # a retry: a probe of its first lines
    started = time.monotonic()
    assert delivery.close(timeout=0.5) == 50_000
    took = time.monotonic() - started
    # close counts the lines without parsing them (it once parsed the spool twice): measured
    # against the machine's own time for one read of the spool. Not half of it: on a loaded
    # machine the sender, at a lower CPU priority, still parsing the spool when close runs holds
    # the GIL until the OS schedules it again (a CI run saw close take 7.8 s against an 8.2 s read)
    assert took < 0.5 + 0.5 + read, f"close took {took:.2f} s; one read of the spool {read:.2f} s"
    kept = spool.read_text()
    assert kept.count('"step": 1,') == 50_000  # every record, and at most the run's end mark
    assert len(kept.splitlines()) - 50_000 in (0, 1)  # written when close found the sender busy


SLOW_REPLAY = """
import fcntl, os, sys, time
from substrax.tracking import _sink
from substrax.tracking._cli import main

out, go = sys.argv[1], sys.argv[1] + ".go"

class SlowSink:
    def __init__(self, target):
        self._target = dict(target)
    def target(self):
        return self._target
    def deliver(self, records):
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:  # the test says when
            time.sleep(0.01)
        with open(out, "a") as file:
            file.write("".join(f"{r.step}\\n" for r in records))
    def is_permanent(self, error):
        return False
    def finish(self):
        pass

_sink.register_sink_factory("test", SlowSink)
sys.exit(main(["replay", "--json", *sys.argv[2:]]))
"""


def _replay_process(tmp_path, spool, *args):
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_REPLAY, str(tmp_path / "received"), str(spool), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.usefixtures("child_processes")
def test_a_second_replay_of_a_spool_waits_for_the_first_and_reports_truthfully(tmp_path, wait_for):
    """Two replays of one spool at once: every record is sent once, and the second says so."""
    spool = tmp_path / "run.spool.jsonl"
    target = {"backend": "test", "run": "r1"}
    spool.write_text(
        "".join(
            json.dumps({"target": target, "record": record(s).materialize(tmp_path).to_json()})
            + "\n"
            for s in range(300)
        )
    )
    lock = tmp_path / "run.spool.jsonl.replay.lock"
    first = _replay_process(tmp_path, spool)
    wait_for(lock.exists)
    impatient = _replay_process(tmp_path, spool, "--timeout", "0.5")
    out, err = impatient.communicate(timeout=60)
    assert impatient.returncode == 1, err
    [line] = err.splitlines()
    assert line.startswith("python -m substrax.tracking: error: another replay")
    assert f"pid {first.pid}" in line
    second = _replay_process(tmp_path, spool, "--timeout", "0")  # waits in flock for the first
    inode = f":{lock.stat().st_ino} "

    def second_waits():
        with Path("/proc/locks").open() as locks:
            return any(
                "-> FLOCK" in row and f" {second.pid} " in row and inode in row for row in locks
            )

    wait_for(second_waits, timeout=60)
    (tmp_path / "received.go").touch()
    for process in (first, second):
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert err == ""
    assert json.loads(out)["waited_for"] == first.pid
    assert (json.loads(out)["delivered"], json.loads(out)["remaining"]) == (0, 0)
    received = (tmp_path / "received").read_text().split()
    assert sorted(map(int, received)) == list(range(300))  # each record once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["received", "received.go"]  # no lock


def test_a_spooled_record_whose_target_lacks_a_field_is_a_bad_line(tmp_path, capsys):
    """An MLflow target without its tracking_uri can never be sent: set aside, not kept forever."""
    from substrax.tracking._cli import main

    spool = tmp_path / "run.spool.jsonl"
    target = {"backend": "mlflow", "run_id": "0123"}  # no tracking_uri
    spool.write_text(
        json.dumps({"target": target, "record": record(1).materialize(tmp_path).to_json()}) + "\n"
    )
    assert main(["replay", "--json", str(spool), "--timeout", "30"]) == 1
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert (summary["delivered"], summary["remaining"], summary["bad_lines"]) == (0, 0, [1])
    assert summary["failures"] == []
    [line] = err.splitlines()
    assert "1 lines of" in line
    assert "'tracking_uri'" in line
    assert not spool.exists()
    assert json.loads((tmp_path / "run.spool.jsonl.bad").read_text())["target"] == target


def test_replay_of_an_empty_path_is_exit_2_and_of_a_directory_its_spools(
    capsys, tmp_path, monkeypatch
):
    from substrax.tracking._cli import main

    assert main(["replay", ""]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("python -m substrax.tracking: error: ")
    assert "spool" in line
    assert "Traceback" not in err
    monkeypatch.chdir(tmp_path)  # "." is the log directory it runs in: no spool there
    assert main(["replay", "."]) == 0
    assert capsys.readouterr() == (
        "no spool in .: nothing to replay (every record was delivered)\n",
        "",
    )


class PickySink(Sink):
    """Refuses, with errors its own is_permanent does not know, records it cannot take."""

    def deliver(self, records):
        for record in records:
            if record.kind == "artifact":
                raise FileNotFoundError(2, "No such file or directory", record.payload["path"])
            record.payload["values"]
        super().deliver(records)

    def is_permanent(self, error):  # noqa: ARG002
        return False


def test_a_record_naming_a_gone_file_or_lacking_a_key_is_refused_not_a_dead_server(make, tmp_path):
    sink = PickySink()
    delivery = make(sink)
    delivery.submit(record(0))
    gone = {"path": str(tmp_path / "gone"), "artifact_path": "ckpt"}
    delivery.submit(Record(kind="artifact", step=None, time=time.time(), payload=gone))
    damaged = {"unserializable": "TypeError"}
    delivery.submit(Record(kind="scalars", step=1, time=1.0, payload=damaged, materialized=True))
    for step in range(2, 5):
        delivery.submit(record(step))
    assert delivery.flush(30)
    assert steps(sink.received) == [0, 2, 3, 4]
    assert delivery.failures == 0
    refused = (tmp_path / "run.spool.jsonl.refused").read_text().splitlines()
    assert [json.loads(line)["record"]["kind"] for line in refused] == ["artifact", "scalars"]
    assert "FileNotFoundError" in refused[0]
    assert "KeyError" in refused[1]


def test_a_replay_refuses_a_record_naming_a_gone_file_and_delivers_the_rest(tmp_path):
    spool = tmp_path / "run.spool.jsonl"
    target = {"backend": "test", "run": "r1"}
    records = [
        record(0).to_json(),
        {"kind": "artifact", "step": None, "time": 1.0, "payload": {"path": "/gone"}},
        {"kind": "scalars", "step": 1, "time": 1.0, "payload": {"unserializable": "x"}},
        record(2).to_json(),
    ]
    spool.write_text("".join(json.dumps({"target": target, "record": r}) + "\n" for r in records))
    sink = PickySink()
    result = replay_spool(spool, sinks={json.dumps(target, sort_keys=True): sink})
    assert (result.delivered, result.remaining, result.refused) == (2, 0, 2)
    assert steps(sink.received) == [0, 2]


class SlowSink2(Sink):
    def deliver(self, records):
        time.sleep(0.002)
        super().deliver(records)


def test_records_are_never_overtaken(make, wall_clock):
    sink = SlowSink2()
    delivery = make(sink, max_queue=3, batch_interval=0.001)
    for step in range(400):
        delivery.submit(record(step) if step % 2 else ("loss", float(step), step, time.time()))
        if step % 50 == 0:
            wall_clock.sleep(0.01)
    assert delivery.flush(30)
    assert steps(sink.received) == list(range(400))  # in order: W&B drops a step gone back


def test_the_sender_does_not_parse_again_the_lines_its_writer_wrote(make, monkeypatch):
    # every pass parsed the whole spool it read back, about 25 us a record on this CPU
    from substrax.tracking import _spool

    parsed = []
    parse = _spool._parse_line
    ours = []  # this delivery's threads: a sender an earlier test abandoned may still parse

    def counted(text):
        if threading.current_thread() in ours:
            parsed.append(text)
        return parse(text)

    monkeypatch.setattr(_spool, "_parse_line", counted)
    sink = Sink()
    delivery = make(sink, send_interval=60)
    ours.extend([delivery._thread, delivery._sender])
    for step in range(300):
        delivery.submit(record(step))
        if step % 50 == 49:
            assert delivery.flush(30)
    assert steps(sink.received) == list(range(300))
    assert sink.attempts >= 6  # a pass each flush
    assert len(parsed) < 30  # at most a line written while its pass read the spool


def _replay_in_process(spool, *args):
    from substrax.tracking._cli import main

    return main(["replay", str(spool), *args])


def test_a_refused_record_a_replay_puts_back_is_sent_by_the_running_logger(make, tmp_path):
    # the sender sent only what its writer wrote: a line `replay --include-refused` put back
    # into a live run's spool stayed there, and every flush waited out its whole timeout
    sink = Sink()
    delivery = make(sink, send_interval=60)
    delivery.submit(record(0))
    delivery.submit(record(1, refuse=1.0))
    assert delivery.flush(30)
    assert steps(sink.received) == [0]
    spool = tmp_path / "run.spool.jsonl"
    _replay_in_process(spool, "--include-refused")  # the live run's line is left to the logger
    assert '"step": 1' in spool.read_text()
    delivery.submit(record(2))
    assert delivery.flush(10)
    assert sorted(steps(sink.received)) == [0, 2]  # refused again: set aside again, not stuck
    assert not spool.exists()
    assert len((tmp_path / "run.spool.jsonl.refused").read_text().splitlines()) == 1


def test_two_loggers_of_one_run_on_one_spool_send_each_record_once(make, tmp_path):
    # a logger's first pass sent the lines the other wrote, which that one sent again
    received = []
    first, second = Sink(), Sink()
    first.received = second.received = received
    a = make(first, batch_interval=0.01, send_interval=60)
    for step in range(20):
        a.submit(record(step))
    assert a.flush(30)
    for step in range(20, 60):
        a.submit(record(step))
    assert a.persist(10)  # written, not sent: the next pass is a minute away
    from substrax.tracking._live import hold_live, let_go_live
    from substrax.tracking._send import run_of
    from substrax.tracking._spool import SpoolFile

    other = {"backend": "test", "run": "another"}  # a live run's line keeps the spool in place
    held = hold_live(tmp_path / "run.spool.jsonl", run_of(other))
    SpoolFile(tmp_path / "run.spool.jsonl").append(other, [record(0).materialize(tmp_path)])
    b = make(second, batch_interval=0.01, send_interval=60)  # its first pass sends them
    assert b.flush(30)
    assert a.flush(30)
    assert sorted(steps(received)) == list(range(60))
    let_go_live(tmp_path / "run.spool.jsonl", run_of(other), held)


def test_lines_written_while_the_backend_hangs_wait_on_disk_not_in_memory(
    make, wait_for, monkeypatch
):
    # every line written during a hanging call was also kept in memory (about 1 KB each); the
    # writer keeps at most _KNOWN_MOST of them to read back unparsed: a third of the lines here
    monkeypatch.setattr(_spool_writer, "_KNOWN_MOST", 1_500)  # 5,000 by default: 15,000 lines
    sink = Sink()
    delivery = make(sink, batch_interval=0.01, send_interval=0.01)  # step 1's pass: at once
    delivery.submit(record(0))
    assert delivery.flush(30)
    sink.gate.clear()  # the next call hangs
    attempts = sink.attempts
    tracemalloc.start()
    try:
        delivery.submit(record(1))
        # hanging with step 1 alone: a pass that began later would hold what it read meanwhile
        wait_for(lambda: sink.attempts > attempts)
        for step in range(2, 4_501):
            delivery.submit(record(step))
        assert delivery.persist(30)
        # what the delivery's own code holds: another thread of this worker (an SDK's, or a
        # sender an earlier test abandoned) may allocate meanwhile (13 MB once), so the lines
        # the writer keeps are also counted, which that cannot change
        ours = tracemalloc.Filter(inclusive=True, filename_pattern="*/substrax/tracking/*")
        snapshot = tracemalloc.take_snapshot().filter_traces([ours])
        held = sum(stat.size for stat in snapshot.statistics("filename"))
    finally:
        tracemalloc.stop()
    assert len(delivery._spool._written) <= 1_500  # all 4,500 were kept
    assert held < 6 * 2**20  # 4,500 lines kept were about 5 MB; the 1,500 known, 1.7 MB
    sink.gate.set()
    assert delivery.flush(60)
    assert steps(sink.received) == list(range(4_501))


def test_a_steady_sender_still_sets_a_refused_record_aside_and_reads_back_after_an_outage(
    make, tmp_path
):
    sink = Sink()
    delivery = make(sink, send_interval=60)
    for step in range(3):
        delivery.submit(record(step))
        assert delivery.flush(30)
    delivery.submit(record(3, refuse=1.0))
    delivery.submit(record(4))
    assert delivery.flush(30)
    sink.fail_next = 2  # the next pass fails: the one after it reads what the spool holds
    for step in range(5, 40):
        delivery.submit(record(step))
        if step % 10 == 0:
            assert delivery.flush(30)
    assert delivery.flush(30)
    assert steps(sink.received) == [0, 1, 2, *range(4, 40)]  # each once, in order
    assert not (tmp_path / "run.spool.jsonl").exists()
    [refused] = (tmp_path / "run.spool.jsonl.refused").read_text().splitlines()
    assert json.loads(refused)["record"]["step"] == 3


def test_device_values_are_read_by_the_writer_not_the_caller(make, monkeypatch, wait_for):
    jnp = pytest.importorskip("jax.numpy")
    readers = set()
    materialize = Record.materialize

    def spy(self, *args, **kwargs):
        readers.add(threading.current_thread().name)
        return materialize(self, *args, **kwargs)

    monkeypatch.setattr(Record, "materialize", spy)
    sink = Sink()
    sink.gate.clear()
    delivery = make(sink, max_queue=2)
    delivery.submit(record(0))
    wait_for(lambda: sink.attempts == 1)  # the worker is stuck in a backend call
    for step in range(1, 1500):
        delivery.submit(("loss", jnp.asarray(float(step)), step, time.time()))
    assert threading.current_thread().name not in readers
    sink.gate.set()
    assert delivery.flush(30)
    assert steps(sink.received) == list(range(1500))
    assert threading.current_thread().name not in readers


_MADE = []


class FailedSink(Sink):
    made = _MADE

    def __init__(self, target=None):  # noqa: ARG002  (a sink factory's argument)
        super().__init__()
        self.failed = False
        FailedSink.made.append(self)


def test_a_run_marked_failed_whose_records_were_spooled_ends_failed_when_replayed(make, tmp_path):
    from substrax.tracking._sink import register_sink_factory

    register_sink_factory("test", FailedSink)
    sink = FailedSink()
    sink.down = True
    delivery = make(sink)
    for step in range(3):
        delivery.submit(record(step))
    sink.failed = True  # what MLFlowLogger.mark_failed does
    assert delivery.close(timeout=0.2) == 3
    FailedSink.made.clear()
    result = replay_spool(tmp_path / "run.spool.jsonl")
    assert (result.delivered, result.remaining) == (4, 0)  # with the record that marks it
    (replayed,) = FailedSink.made
    assert steps(replayed.received) == [0, 1, 2, None]
    assert replayed.finished
    assert replayed.failed


def test_a_spool_without_the_failed_mark_ends_the_run_finished(make, tmp_path):
    from substrax.tracking._sink import register_sink_factory

    register_sink_factory("test", FailedSink)
    sink = FailedSink()
    sink.down = True
    delivery = make(sink)
    delivery.submit(record(0))
    assert delivery.close(timeout=0.2) == 1
    FailedSink.made.clear()
    replay_spool(tmp_path / "run.spool.jsonl")
    (replayed,) = FailedSink.made
    assert replayed.finished
    assert not replayed.failed


@pytest.mark.parametrize("state", ["died", "none"])
def test_a_replayed_run_whose_process_died_before_close_ends_failed(tmp_path, caplog, state):
    """A run killed (kill -9) with records in the spool ended FINISHED when a replay, or the
    next logger of the spool, sent them: its live lock, left behind, now says it never closed."""
    from substrax.tracking._send import Sending
    from substrax.tracking._sink import register_sink_factory
    from substrax.tracking._spool import SpoolLine

    register_sink_factory("test", FailedSink)
    FailedSink.made.clear()
    target = {"backend": "test", "run": "r1"}
    lines = [
        SpoolLine(s + 1, "", {"target": target, "record": record(s).to_json()}) for s in range(3)
    ]
    asked = []

    def live(run):
        asked.append(run)
        return state

    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    ended = []
    job = Sending(lines, {}, live=live, ended=ended.append)
    job.run()
    (replayed,) = FailedSink.made
    assert steps(replayed.received) == [0, 1, 2]
    assert replayed.finished
    assert replayed.failed == (state == "died")
    assert asked == ['{"backend": "test", "run": "r1"}'] * 2  # before sending, and ending it
    assert ended == (['{"backend": "test", "run": "r1"}'] if state == "died" else [])
    warned = [r.getMessage() for r in caplog.records]
    assert warned == (
        [
            'the run {"backend": "test", "run": "r1"} was never closed: the process that logged '
            "it ended first (killed); its records replayed, it ends FAILED (unless a later "
            "attempt resumed and ended it)"
        ]
        if state == "died"
        else []
    )


def test_a_died_run_a_replay_could_not_deliver_is_still_known_to_have_died(tmp_path):
    """Review of the died-run fix: the first replay (server still down) removed the live file,
    and the next, delivering, ended the killed run FINISHED."""
    from substrax.tracking._live import hold_live, live_state

    spool = tmp_path / "run.spool.jsonl"
    os.close(hold_live(spool, "r1"))  # a kill -9: the lock goes, its file stays
    assert live_state(spool, "r1", remove=False) == "died"
    assert live_state(spool, "r1", remove=False) == "died"  # kept for the next replay
    assert live_state(spool, "r1") == "died"
    assert live_state(spool, "r1") == "none"


def test_a_live_lock_left_by_a_process_that_died_reads_died_once(tmp_path):
    from substrax.tracking._live import hold_live, let_go_live, live_state

    spool = tmp_path / "run.spool.jsonl"
    closed = hold_live(spool, "closed")
    let_go_live(spool, "closed", closed)  # what close does
    died = hold_live(spool, "died")
    assert live_state(spool, "died") == "live"
    os.close(died)  # what a kill -9 does: the lock goes, its file stays
    assert (live_state(spool, "closed"), live_state(spool, "died")) == ("none", "died")
    assert live_state(spool, "died") == "none"  # seen once: the file is removed


def test_every_step_logged_with_a_tiny_queue_reaches_a_wandb_run(
    wandb_offline, wandb_runs, tmp_path
):
    pytest.importorskip("wandb")
    from substrax.tracking import WandbLogger

    def logged(runs):
        return {
            record.history.step.num
            for records in runs
            for kind, record in records
            if kind == "history"
        }

    with WandbLogger("spill", project="substrax-tests", log_dir=tmp_path, max_queue=5) as logger:
        for step in range(300):
            logger.log_scalars({"loss": float(step)}, step=step)
    [records] = wandb_runs.wait(tmp_path, lambda runs: set(range(300)) <= logged(runs))
    assert set(range(300)) <= logged([records])


def test_the_worker_outlives_an_error_whose_report_fails_too(make, monkeypatch):
    """A cycle that raises is reported; a log handler that raises as it reports (pytest's
    does, and formatting a traceback can fail) must not end the worker either."""

    class Raising(logging.Handler):  # as pytest's capture handler, whose handleError re-raises
        def emit(self, _record):
            raise KeyError("<a linecache entry dropped meanwhile>")

    sink = Sink()
    delivery = make(sink)
    failed = threading.Event()
    write = delivery._spool.write

    def once(*args, **kwargs):
        if not failed.is_set():
            failed.set()
            raise RuntimeError("a cycle that fails once")
        return write(*args, **kwargs)

    monkeypatch.setattr(delivery._spool, "write", once)
    handler = Raising(level=logging.DEBUG)
    logger = logging.getLogger("substrax.tracking._background")
    logger.addHandler(handler)
    try:
        delivery.submit(record(0))
        delivery.flush(30)  # answered (not delivered) by the cycle that raised
    finally:
        logger.removeHandler(handler)
    assert failed.is_set()
    assert delivery._thread.is_alive()
    delivery.submit(record(1))
    assert delivery.flush(30)
    assert steps(sink.received) == [0, 1]


class _OneKeyAtATime(Sink):
    """Refuses any delivery holding more than one scalar key (each alone arrives) and any params."""

    def deliver(self, records):
        if any(r.kind == "hyperparams" for r in records):
            raise ValueError("params cannot change")
        if sum(len(r.payload.get("values", {})) for r in records) > 1:
            raise ValueError("one key a request")
        super().deliver(records)


def test_a_record_whose_keys_each_arrive_alone_is_delivered_without_a_refusal_warning(
    make, tmp_path, caplog
):
    """Hostile finding: such a record was warned about as refused though every value arrived."""
    sink = _OneKeyAtATime()
    delivery = make(sink)
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        delivery.submit(record(3, a=1.0, b=2.0))
        assert delivery.flush(30)
    assert [(r.step, r.payload["values"]) for r in sink.received] == [
        (3, {"a": 1.0}),
        (3, {"b": 2.0}),
    ]
    assert not (tmp_path / "run.spool.jsonl.refused").exists()
    assert "refused" not in caplog.text


def test_each_refused_set_of_params_is_warned_with_its_keys_and_without_a_step(make, caplog):
    """Hostile finding: a refused record of several keys was warned as 'a hyperparams record',
    once for all such records, at the last step logged."""
    sink = _OneKeyAtATime()
    delivery = make(sink)
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        for params in ({"lr": 0.1, "wd": 0.0}, {"optimizer": "adam", "seed": 1}):
            delivery.submit(
                Record(kind="hyperparams", step=7, time=0.0, payload={"params": params})
            )
        assert delivery.flush(30)
    warned = [r.getMessage() for r in caplog.records if r.name.endswith("_refusals")]
    assert len(warned) == 2
    assert "refused params ['lr', 'wd'] (ValueError: params cannot change)" in warned[0]
    assert "refused params ['optimizer', 'seed'] (" in warned[1]
    assert not any("step" in message for message in warned)


class CreatedLater(Sink):
    """A backend naming its run by a spec until a delivery creates it, then by its id (MLflow's)."""

    arrivals: ClassVar[list[tuple[float | None, int | None]]] = []  # (resume_step, step)

    def __init__(self, target=None):
        super().__init__()
        self.created = target is not None
        self.resume = None if target is None else target.get("resume_step")

    def target(self):
        if not self.created:
            return {"backend": "created-later", "spec": "k"}
        resumed = {} if self.resume is None else {"resume_step": self.resume}
        return {"backend": "created-later", "id": "r1", **resumed}

    def deliver(self, records):
        super().deliver(records)
        self.created = True
        CreatedLater.arrivals.extend((self.resume, r.step) for r in records)


def test_a_run_named_once_it_exists_is_resumed_with_what_its_first_attempt_left(make, tmp_path):
    # The first attempt's later records were spooled under the spec it began with, so the resumed
    # logger (which knows the run by its id) sent its own steps first, and a replay of the spec's
    # lines later gave MLflow those steps twice.
    from substrax.tracking._sink import register_sink_factory

    register_sink_factory("created-later", CreatedLater)
    first = CreatedLater()
    delivery = make(first)
    delivery.submit(record(0))
    assert delivery.flush(30)  # the run exists now, and has an id
    first.down = True
    for step in (1, 2):
        delivery.submit(record(step))
    assert delivery.close(timeout=0.2) == 2
    spool = tmp_path / "run.spool.jsonl"
    targets = [json.loads(line)["target"] for line in spool.read_text().splitlines()]
    assert targets == [{"backend": "created-later", "id": "r1"}] * 2
    CreatedLater.arrivals.clear()
    resumed = make(CreatedLater({"backend": "created-later", "id": "r1", "resume_step": 0}))
    resumed.submit(record(1, loss=11.0))
    assert resumed.flush(30)
    # what the first attempt left arrives first (a sink of the run without resume_step), then
    # the resumed logger's own step
    assert CreatedLater.arrivals == [(None, 1), (None, 2), (0, 1)]
    assert not spool.exists()


def test_a_second_close_never_closes_a_descriptor_opened_since(make, tmp_path):
    delivery = make(Sink())
    delivery.close(5)
    with (tmp_path / "other").open("w") as other:  # likely the live lock's descriptor number
        delivery._lives.let_go()  # as a second close does
        other.write("still open")  # was: OSError, its descriptor closed under it
