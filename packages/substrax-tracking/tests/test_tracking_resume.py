"""Resuming a run from a checkpoint: each backend ends with every step exactly once.

The first attempt logs past its checkpoint (step ``SAVED``) and stops (closed, or killed with
SIGKILL); the resumed logger gets ``resume_step=SAVED`` and logs the steps after it again.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from substrax.tracking import (
    FileLogBusyError,
    FileLogger,
    MLFlowLogger,
    ResumeWithoutRunIdError,
    TensorBoardLogger,
    UnknownRunIdError,
    WandbLogger,
    create_logger,
    read_scalars,
    replay_spool,
)


SAVED, REACHED, END = 5, 9, 12  # the checkpoint, where the first attempt stopped, the end


def first_attempt_values(step: int) -> float:
    return 1.0 / (step + 1)


def resumed_values(step: int) -> float:
    return 100.0 + step


def log_first_attempt(logger):
    """Log the first attempt's loss at every step up to REACHED; return the run's id."""
    for step in range(REACHED + 1):
        logger.log_scalars({"loss": first_attempt_values(step)}, step=step)
    return logger.run_id


def file_steps(log_dir, name="run"):
    """Each metric's steps in the JSONL and the CSV log, with their values from the JSONL."""
    jsonl = read_scalars(log_dir / f"{name}.metrics.jsonl")
    csv_rows = (log_dir / f"{name}.metrics.csv").read_text().splitlines()
    assert csv_rows[0] == "time,step,name,value"
    csv_steps: dict[str, list[int | None]] = {}
    for row in csv_rows[1:]:
        _, step, metric, _ = row.split(",")
        csv_steps.setdefault(metric, []).append(int(step) if step else None)
    return jsonl, csv_steps


def test_file_logger_drops_what_was_logged_past_the_restored_step(tmp_path):
    with FileLogger("run", tmp_path) as logger:
        for step in range(REACHED + 1):
            logger.log_scalars({"loss": first_attempt_values(step), "acc": 0.5}, step=step)
            logger.log_text("note", f"step {step}", step=step)
            logger.log_histogram("w", [1.0, 2.0], step=step)
        logger.log_scalar("final", 1.0)  # no step: kept whatever the resume step
    with FileLogger("run", tmp_path, resume_step=SAVED) as logger:
        # 2 scalars, 1 text and 1 histogram per dropped step
        assert logger.dropped_records == 4 * (REACHED - SAVED)
        for step in range(SAVED + 1, END + 1):
            logger.log_scalars({"loss": resumed_values(step), "acc": 0.5}, step=step)
            logger.log_text("note", f"again {step}", step=step)
    jsonl, csv_steps = file_steps(tmp_path)
    assert [step for step, _ in jsonl["loss"]] == list(range(END + 1))
    assert dict(jsonl["loss"])[SAVED] == first_attempt_values(SAVED)
    assert dict(jsonl["loss"])[SAVED + 1] == resumed_values(SAVED + 1)
    assert csv_steps["loss"] == csv_steps["acc"] == list(range(END + 1))
    assert len(jsonl["final"]) == 1
    assert csv_steps["final"] == [None]
    texts = [json.loads(line) for line in (tmp_path / "run.text.jsonl").read_text().splitlines()]
    assert [t["step"] for t in texts] == list(range(END + 1))
    assert texts[SAVED + 1]["text"] == f"again {SAVED + 1}"
    histograms = (tmp_path / "run.histograms.jsonl").read_text().splitlines()
    assert [json.loads(h)["step"] for h in histograms] == list(range(SAVED + 1))


@pytest.mark.parametrize("logger", [FileLogger, TensorBoardLogger])
def test_a_local_logger_s_resume_step_is_checked(tmp_path, logger):
    with pytest.raises(ValueError, match="resume_step=-1"):
        logger("run", tmp_path, resume_step=-1)
    with pytest.raises(TypeError, match="resume_step"):
        logger("run", tmp_path, resume_step=2.0)  # type: ignore[arg-type]
    # hostile finding: a step no backend can store was taken
    with pytest.raises(ValueError, match=r"resume_step=9223372036854775808 is past the largest"):
        logger("run", tmp_path, resume_step=2**63)


def test_remote_loggers_refuse_a_resume_step_past_the_largest_step(tmp_path):
    with pytest.raises(ValueError, match=r"resume_step=9223372036854775808 is past the largest"):
        MLFlowLogger(
            "run", tracking_uri=f"sqlite:///{tmp_path}/m.db", run_id="r", resume_step=2**63
        )


def test_remote_loggers_refuse_resume_step_without_run_id(tmp_path):
    with pytest.raises(ResumeWithoutRunIdError, match="run id stored with the checkpoint"):
        MLFlowLogger("run", tracking_uri=f"sqlite:///{tmp_path}/m.db", resume_step=3)
    pytest.importorskip("wandb", reason="the wandb extra is needed for WandbLogger")
    with pytest.raises(ResumeWithoutRunIdError) as caught:
        WandbLogger("run", project="p", log_dir=tmp_path, mode="offline", resume_step=3)
    assert caught.value.resume_step == 3


def mlflow_history(uri, run_id, key):
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in history)


@pytest.mark.xdist_group("mlflow_server")
def test_mlflow_server_run_holds_every_step_once_after_a_resume(mlflow_server, tmp_path):
    uri = mlflow_server.uri
    with MLFlowLogger("first", tracking_uri=uri, log_dir=tmp_path / "a") as logger:
        run_id = log_first_attempt(logger)
        logger.log_scalar("val_loss", 2.0, step=SAVED)
    assert run_id is not None
    with MLFlowLogger(
        "first", tracking_uri=uri, log_dir=tmp_path / "b", run_id=run_id, resume_step=SAVED
    ) as logger:
        for step in range(SAVED + 1, END + 1):
            logger.log_scalars({"loss": resumed_values(step)}, step=step)
            if step % 5 == 0:
                logger.log_scalar("val_loss", 1.0, step=step)
        assert logger.wait_delivered(timeout=60)
    loss = mlflow_history(uri, run_id, "loss")
    assert [step for step, _ in loss] == list(range(END + 1))  # once each
    values = dict(loss)
    # append-only: the first attempt's values past the checkpoint stay, later steps are new
    assert values[REACHED] == first_attempt_values(REACHED)
    assert values[REACHED + 1] == resumed_values(REACHED + 1)
    assert mlflow_history(uri, run_id, "val_loss") == [(SAVED, 2.0), (10, 1.0)]
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert run.data.tags["substrax.resumed_from_step"] == str(SAVED)
    assert run.info.status == "FINISHED"


def wandb_segments(runs):
    """Each offline segment of the run (a run file): its rewind point (None) and history rows."""
    segments = []
    for records in runs:
        rewind, rows = None, []
        for kind, record in records:
            if kind == "run" and record.run.HasField("branch_point"):
                point = record.run.branch_point
                assert point.run == record.run.run_id  # a rewind of this run, not a fork
                rewind = (point.metric, int(point.value))
            elif kind == "history":
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                rows.append(row)
        segments.append((rewind, rows))
    return segments


def wandb_history(segments):
    """The run's rows as W&B has them once synced: each rewind drops the rows after its step."""
    rows = []
    for rewind, segment in segments:
        if rewind is not None:
            metric, step = rewind
            assert metric == "_step"
            rows = [row for row in rows if row["_step"] <= step]
        rows.extend(segment)
    return rows


@pytest.fixture
def wait_for_rows(wandb_runs):
    """``wait_for_rows(log_dir, count)``: the segments once the files hold ``count`` rows."""

    def read(log_dir, count):
        def written(runs):
            return sum(len(rows) for _, rows in wandb_segments(runs)) >= count

        return wandb_segments(wandb_runs.wait(log_dir, written))

    return read


@pytest.mark.parametrize("given", ["argument", "WANDB_RUN_ID"])
def test_wandb_offline_run_is_rewound_to_the_restored_step(
    wandb_offline, wait_for_rows, tmp_path, monkeypatch, given
):
    with WandbLogger("run", project="substrax-tests", log_dir=tmp_path) as logger:
        run_id = log_first_attempt(logger)
    if given == "WANDB_RUN_ID":  # the run id W&B's own variable names (hostile finding)
        monkeypatch.setenv("WANDB_RUN_ID", run_id)
    with WandbLogger(
        "run",
        project="substrax-tests",
        log_dir=tmp_path,
        run_id=run_id if given == "argument" else None,
        resume_step=SAVED,
    ) as logger:
        assert logger.run_id == run_id
        for step in range(SAVED + 1, END + 1):
            logger.log_scalars({"loss": resumed_values(step)}, step=step)
    segments = wait_for_rows(tmp_path, (REACHED + 1) + (END - SAVED))
    assert [rewind for rewind, _ in segments] == [None, ("_step", SAVED)]
    assert [row["_step"] for row in segments[1][1]] == list(range(SAVED + 1, END + 1))
    rows = wandb_history(segments)
    assert [row["_step"] for row in rows] == list(range(END + 1))
    assert rows[SAVED]["loss"] == first_attempt_values(SAVED)
    assert rows[SAVED + 1]["loss"] == resumed_values(SAVED + 1)


def test_a_value_logged_at_the_resume_step_after_a_wandb_rewind_is_warned_about(
    wandb_offline, wait_for_rows, tmp_path, caplog
):
    """A hostile review: a resumed run's epoch end logged val_loss at the restored step; W&B's
    rewound history dropped it (its own debug log the only trace) while the others kept it."""
    with WandbLogger("run", project="substrax-tests", log_dir=tmp_path) as logger:
        run_id = log_first_attempt(logger)
    with (
        caplog.at_level(logging.WARNING, logger="substrax.tracking"),
        WandbLogger(
            "run", project="substrax-tests", log_dir=tmp_path, run_id=run_id, resume_step=SAVED
        ) as logger,
    ):
        logger.log_scalars({"val_loss": 0.5}, step=SAVED)
        logger.log_scalars({"val_loss": 0.25}, step=SAVED - 1)
        for step in range(SAVED + 1, END + 1):
            logger.log_scalars({"loss": resumed_values(step)}, step=step)
    segments = wait_for_rows(tmp_path, (REACHED + 1) + (END - SAVED))
    assert not any("val_loss" in row for row in segments[1][1])  # W&B dropped it, as warned
    warned = [r.getMessage() for r in caplog.records if "rewound the run" in r.getMessage()]
    assert len(warned) == 1  # once
    assert f"['val_loss'] at step {SAVED}, logged after resume_step={SAVED}" in warned[0]


_KILLED_CHILD = """
import json, sys
from substrax.tracking import FileLogger, MLFlowLogger, WandbLogger

log_dir, uri = sys.argv[1], sys.argv[2]
files = FileLogger("run", log_dir, flush_every=0)
mlflow = MLFlowLogger("run", tracking_uri=uri, log_dir=log_dir)
wandb = WandbLogger("run", project="substrax-tests", log_dir=log_dir)
print(json.dumps({"mlflow": mlflow.run_id, "wandb": wandb.run_id}), flush=True)
step = 0
while True:
    for logger in (files, mlflow, wandb):
        logger.log_scalars({"loss": 1.0 / (step + 1)}, step=step)
    if step in (%(saved)d, %(reached)d):  # SAVED: the periodic checkpoint, all logged so far delivered
        assert mlflow.wait_delivered(timeout=60) and wandb.wait_delivered(timeout=60)
        print(json.dumps({"checkpoint" if step == %(saved)d else "reached": step}), flush=True)
    step += 1
"""


def run_until_killed(script: str, tmp_path, uri) -> list[str]:
    """Run the child until it reports REACHED, a moment more, then SIGKILL it; its lines."""
    lines: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), str(tmp_path), uri],
        stdout=subprocess.PIPE,
        text=True,
        # its own wandb service (a run of this process's service would outlive the kill)
        env={
            **{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},
            "PYTHONUNBUFFERED": "1",
        },
    ) as child:
        try:
            assert child.stdout is not None
            deadline = time.monotonic() + 120
            while not any("reached" in line for line in lines):
                assert time.monotonic() < deadline, lines
                line = child.stdout.readline()
                assert line, f"the child exited early: {lines}"
                lines.append(line)
            time.sleep(0.3)  # it keeps logging past REACHED: some in the files, some not yet
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
    return lines


@pytest.mark.usefixtures("child_processes")
def test_a_run_killed_with_sigkill_resumes_from_its_last_periodic_checkpoint(
    wandb_offline, wandb_runs, tmp_path
):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    script = _KILLED_CHILD % {"saved": SAVED, "reached": REACHED}
    lines = run_until_killed(script, tmp_path, uri)
    run_ids = json.loads(lines[0])
    assert json.loads(lines[1]) == {"checkpoint": SAVED}

    killed_at = max(step for step, _ in read_scalars(tmp_path / "run.metrics.jsonl")["loss"])
    assert killed_at >= REACHED
    files = FileLogger("run", tmp_path, resume_step=SAVED)
    mlflow = MLFlowLogger(
        "run", tracking_uri=uri, log_dir=tmp_path, run_id=run_ids["mlflow"], resume_step=SAVED
    )
    wandb = WandbLogger(
        "run",
        project="substrax-tests",
        log_dir=tmp_path,
        run_id=run_ids["wandb"],
        resume_step=SAVED,
    )
    assert files.dropped_records >= killed_at - SAVED
    end = killed_at + 5
    for step in range(SAVED + 1, end + 1):
        for logger in (files, mlflow, wandb):
            logger.log_scalars({"loss": resumed_values(step)}, step=step)
    for logger in (files, mlflow, wandb):
        logger.close()

    jsonl, csv_steps = file_steps(tmp_path)
    assert [step for step, _ in jsonl["loss"]] == list(range(end + 1))
    assert dict(jsonl["loss"])[SAVED + 1] == resumed_values(SAVED + 1)  # dropped, then relogged
    assert csv_steps["loss"] == list(range(end + 1))
    history = mlflow_history(uri, run_ids["mlflow"], "loss")
    counts = Counter(step for step, _ in history)
    assert sorted(counts) == list(range(end + 1))
    assert set(counts.values()) == {1}
    # what the killed attempt delivered keeps its values; the rest came from the resumed one
    assert dict(history)[REACHED] == first_attempt_values(REACHED)
    assert dict(history)[end] == resumed_values(end)
    # W&B: wandb's service writes the offline run file in blocks, and a SIGKILL of the logging
    # process loses what it had not written yet, so the killed segment holds some prefix of
    # the steps (here, often none). The rewind drops its steps after the checkpoint, and the
    # resumed segment brings every step after it: no step twice.
    resumed = list(range(SAVED + 1, end + 1))

    def written(runs):
        segments = wandb_segments(runs)
        return len(segments) == 2 and len(segments[1][1]) >= len(resumed)

    segments = wandb_segments(wandb_runs.wait(tmp_path, written))
    assert [rewind for rewind, _ in segments] == [None, ("_step", SAVED)]
    steps = [row["_step"] for row in wandb_history(segments)]
    kept = steps[: len(steps) - len(resumed)]
    assert kept == list(range(len(kept)))  # a prefix of the steps up to the checkpoint
    assert len(kept) <= SAVED + 1
    assert steps[len(kept) :] == resumed


def test_file_logger_drops_a_last_line_cut_inside_a_character(tmp_path):
    with FileLogger("run", tmp_path) as logger:
        for step in range(3):
            logger.log_scalar("perte/é", 0.5, step=step)
    with (tmp_path / "run.metrics.csv").open("ab") as file:
        file.write("1.0,3,perte/é".encode()[:-1])  # a kill cut the row inside the 2-byte é
    with FileLogger("run", tmp_path, resume_step=1) as logger:
        assert logger.dropped_records == 1  # step 2 from the JSONL; the cut row is not a record
    _, csv_steps = file_steps(tmp_path)
    assert csv_steps == {"perte/é": [0, 1]}


def replay_in_a_subprocess(spool):
    """``python -m substrax.tracking replay`` in a process of its own (and its own wandb service)."""
    result = subprocess.run(
        [sys.executable, "-m", "substrax.tracking", "replay", str(spool), "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not spool.exists()


@pytest.mark.usefixtures("child_processes")
@pytest.mark.xdist_group("mlflow_server")
def test_mlflow_replay_of_a_resumed_run_skips_the_steps_the_run_holds(mlflow_door, tmp_path):
    uri = mlflow_door.uri
    mlflow_door.open()
    with MLFlowLogger("replayed", tracking_uri=uri, log_dir=tmp_path / "a") as logger:
        run_id = log_first_attempt(logger)
    mlflow_door.shut()  # resumed while the server is down: everything is spooled
    resumed = MLFlowLogger(
        "replayed",
        tracking_uri=uri,
        log_dir=tmp_path / "b",
        run_id=run_id,
        resume_step=SAVED,
        connect_timeout=1,
        close_timeout=1,
    )
    for step in range(SAVED + 1, END + 1):
        resumed.log_scalars({"loss": resumed_values(step)}, step=step)
    resumed.close()
    mlflow_door.open()
    assert resumed.spooled == END - SAVED
    replay_in_a_subprocess(resumed.spool_path)
    loss = mlflow_history(uri, run_id, "loss")
    assert [step for step, _ in loss] == list(range(END + 1))  # once each, as if live
    assert dict(loss)[REACHED] == first_attempt_values(REACHED)
    assert dict(loss)[END] == resumed_values(END)


def test_an_earlier_attempts_spool_replayed_after_a_resume_elsewhere_adds_no_step_twice(
    tmp_path, sqlite_uri
):
    """Hostile finding: the killed attempt's spool (its own log_dir) replayed after the resumed
    run logged the same steps gave MLflow those steps twice, with both attempts' values."""
    from substrax.tracking._records import Record
    from substrax.tracking._spool import spool_lines

    with MLFlowLogger("run", tracking_uri=sqlite_uri, log_dir=tmp_path / "a") as first:
        for step in range(SAVED + 1):
            first.log_scalars({"loss": first_attempt_values(step)}, step=step)
        run_id = first.run_id
    # what the first attempt spooled and never sent before it was killed: SAVED < step <= REACHED
    target = {"backend": "mlflow", "tracking_uri": sqlite_uri, "run_id": run_id}
    late = [
        Record(
            kind="scalars",
            step=step,
            time=time.time(),
            payload={"values": {"loss": first_attempt_values(step)}},
        )
        for step in range(SAVED + 1, REACHED + 1)
    ]
    spool = tmp_path / "a" / "run.spool.jsonl"
    spool.write_text(
        "".join(line + "\n" for line in spool_lines(target, [r.to_json() for r in late]))
    )
    resumed = MLFlowLogger(  # in a log_dir of its own: it never sees that spool
        "run", tracking_uri=sqlite_uri, log_dir=tmp_path / "b", run_id=run_id, resume_step=SAVED
    )
    for step in range(SAVED + 1, END + 1):
        resumed.log_scalars({"loss": resumed_values(step)}, step=step)
    resumed.close()
    result = replay_spool(spool)
    assert (result.remaining, result.refused) == (0, 0)
    loss = mlflow_history(sqlite_uri, run_id, "loss")
    assert [step for step, _ in loss] == list(range(END + 1))  # each once
    assert dict(loss)[REACHED] == resumed_values(REACHED)  # the run held it: not sent again


def test_mlflow_histogram_statistics_are_not_sent_twice_after_a_resume(tmp_path, sqlite_uri):
    uri = sqlite_uri
    with MLFlowLogger("run", tracking_uri=uri, log_dir=tmp_path) as logger:
        for step in range(REACHED + 1):
            logger.log_histogram("w", [float(step), step + 1.0], step=step)
        run_id = logger.run_id
    with MLFlowLogger(
        "run", tracking_uri=uri, log_dir=tmp_path, run_id=run_id, resume_step=SAVED
    ) as logger:
        for step in range(SAVED + 1, END + 1):
            logger.log_histogram("w", [100.0, 101.0], step=step)
    for stat in ("min", "max", "mean", "std"):
        history = mlflow_history(uri, run_id, f"w/{stat}")
        assert [step for step, _ in history] == list(range(END + 1)), stat
    assert dict(mlflow_history(uri, run_id, "w/min"))[REACHED] == REACHED  # the first attempt's
    assert dict(mlflow_history(uri, run_id, "w/min"))[END] == 100.0


_SPOOLING_WANDB_CHILD = """
import sys
from substrax.tracking import WandbLogger

log_dir = sys.argv[1]
with WandbLogger("run", project="substrax-tests", log_dir=log_dir) as first:
    for step in range(%(reached)d + 1):
        first.log_scalars({"loss": 1.0}, step=step)
# resumed, and closed before wandb.init returned: its records stay in the spool
resumed = WandbLogger(
    "run", project="substrax-tests", log_dir=log_dir, run_id=first.run_id,
    resume_step=%(saved)d, connect_timeout=0.001, close_timeout=0,
)
for step in range(%(saved)d + 1, %(end)d + 1):
    resumed.log_scalars({"loss": 2.0}, step=step)
resumed.close()
print(resumed.spooled)
"""


@pytest.mark.usefixtures("child_processes")
def test_wandb_replay_of_a_resumed_run_rewinds_it_like_the_live_logger(
    wandb_offline, wait_for_rows, tmp_path
):
    script = _SPOOLING_WANDB_CHILD % {"saved": SAVED, "reached": REACHED, "end": END}
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},
        check=False,
    )
    assert child.returncode == 0, child.stderr
    spooled = int(child.stdout.split()[-1])
    assert spooled >= 1  # how many wandb.init's late start still took varies
    spool = tmp_path / "run.spool.jsonl"
    assert json.loads(spool.read_text().splitlines()[0])["target"]["resume_step"] == SAVED
    replay_in_a_subprocess(spool)
    segments = wait_for_rows(tmp_path, (REACHED + 1) + (END - SAVED))
    assert segments[0][0] is None
    assert segments[-1][0] is not None
    assert segments[-1][0][1] >= SAVED  # rewound to the step before its first record
    rows = wandb_history(segments)
    assert [row["_step"] for row in rows] == list(range(END + 1))
    assert [row["loss"] for row in rows] == [1.0] * (SAVED + 1) + [2.0] * (END - SAVED)


def test_a_wandb_resume_first_sends_what_the_killed_attempt_left_in_the_spool(
    wandb_offline, wait_for_rows, tmp_path, spool_scalars
):
    """Hostile finding: the resumed (rewound) run held W&B's one live run of the id, so the
    killed attempt's records in the spool never arrived ("run ID ... is in use"), and a run
    folder was made at each retry."""
    with WandbLogger("run", project="substrax-tests", log_dir=tmp_path) as first:
        for step in range(3):  # delivered before the kill
            first.log_scalar("loss", 1.0, step=step)
    # what the killed attempt had only spooled: its steps up to the checkpoint at 5, on
    spool_scalars(first.spool_path, first._sink.target(), range(3, 9), {"loss": 1.0})
    with WandbLogger(
        "run", project="substrax-tests", log_dir=tmp_path, run_id=first.run_id, resume_step=5
    ) as resumed:
        for step in range(6, 10):
            resumed.log_scalar("loss", 2.0, step=step)
    assert resumed.delivered == 4
    assert not first.spool_path.exists()
    rows = wandb_history(wait_for_rows(tmp_path, 3 + 6 + 4))
    assert [(row["_step"], row["loss"]) for row in rows] == [(s, 1.0) for s in range(6)] + [
        (s, 2.0) for s in range(6, 10)
    ]


_HOLDING_CHILD = """
import sys
from substrax.tracking import FileLogger

with FileLogger("run", sys.argv[1], flush_every=0) as logger:
    for step in range(3):
        logger.log_scalar("other", float(step), step=step)
    print("holding", flush=True)
    sys.stdin.readline()  # until the test lets go
    logger.log_scalar("other", 3.0, step=3)
"""


@pytest.mark.usefixtures("child_processes")
def test_a_file_log_held_by_another_process_is_refused_not_rewritten(tmp_path):
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDING_CHILD), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdin is not None
            assert child.stdout.readline() == "holding\n"
            with pytest.raises(FileLogBusyError) as caught:
                FileLogger("run", tmp_path, resume_step=1)
            assert caught.value.pid == child.pid
            assert caught.value.log_dir == tmp_path.resolve()
            assert str(tmp_path) in str(caught.value)
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.wait(timeout=60) == 0
        finally:
            if child.poll() is None:
                child.kill()
    assert not (tmp_path / "run.log.lock").exists()
    assert [step for step, _ in read_scalars(tmp_path / "run.metrics.jsonl")["other"]] == [
        0,
        1,
        2,
        3,
    ]
    with FileLogger("run", tmp_path, resume_step=1) as logger:  # now it is free
        assert logger.dropped_records == 2
        with pytest.raises(FileLogBusyError, match="another name or log_dir"):
            FileLogger("run", tmp_path)  # a second logger in the same process, too
        with FileLogger("other", tmp_path):  # another name is another log
            pass


def test_file_logger_appends_after_a_line_a_kill_cut_short(tmp_path, caplog):
    with FileLogger("run", tmp_path) as logger:
        for step in range(3):
            logger.log_scalar("loss", first_attempt_values(step), step=step)
    for name in ("run.metrics.jsonl", "run.metrics.csv"):
        data = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(data[:-7])  # step 2's line, cut short by a kill
    with FileLogger("run", tmp_path) as logger:  # restarted without resume_step
        logger.log_scalar("loss", resumed_values(3), step=3)
    assert "cut short" in caplog.text
    jsonl, csv_steps = file_steps(tmp_path)
    assert jsonl["loss"] == [(0, 1.0), (1, 0.5), (3, resumed_values(3))]
    assert csv_steps["loss"] == [0, 1, 3]


def test_a_csv_row_damaged_with_a_quote_does_not_hide_the_rows_after_it(tmp_path):
    with FileLogger("run", tmp_path) as logger:
        for step in range(REACHED + 1):
            logger.log_scalar("loss", first_attempt_values(step), step=step)
    csv_path = tmp_path / "run.metrics.csv"
    lines = csv_path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace(",loss", ',"loss')  # step 1's row: an opening quote, no end
    csv_path.write_text("".join(lines))
    with FileLogger("run", tmp_path, resume_step=SAVED):
        pass
    rows = csv_path.read_text().splitlines()
    assert [row.split(",")[1] for row in rows[1:]] == [str(step) for step in range(SAVED + 1)]


def test_file_logger_warns_of_a_resume_step_its_log_does_not_reach(tmp_path, caplog):
    with FileLogger("run", tmp_path / "missing", resume_step=7):
        pass
    assert "resume_step=7" in caplog.text
    assert str(tmp_path / "missing") in caplog.text
    caplog.clear()
    with FileLogger("run", tmp_path) as logger:
        logger.log_scalar("loss", 0.5, step=3)
    with FileLogger("run", tmp_path, resume_step=3):
        pass
    assert not caplog.text  # the log reaches step 3
    with FileLogger("run", tmp_path, resume_step=9):
        pass
    assert "resume_step=9" in caplog.text
    assert "up to 3" in caplog.text


def test_mlflow_unknown_run_id_names_the_store_and_what_to_do(tmp_path, sqlite_uri):
    uri = sqlite_uri
    with pytest.raises(UnknownRunIdError) as caught:
        MLFlowLogger("run", tracking_uri=uri, log_dir=tmp_path, run_id="0" * 32, resume_step=3)
    assert caught.value.tracking_uri == uri
    assert caught.value.run_id == "0" * 32
    assert uri in str(caught.value)
    assert "logger.run_id" in str(caught.value)


def test_create_logger_resumes_its_file_log(tmp_path):
    with create_logger("run", tmp_path, console=False) as logger:
        for step in range(REACHED + 1):
            logger.log_scalar("loss", first_attempt_values(step), step=step)
    with create_logger("run", tmp_path, console=False, resume_step=SAVED) as logger:
        for step in range(SAVED + 1, END + 1):
            logger.log_scalar("loss", resumed_values(step), step=step)
    jsonl, csv_steps = file_steps(tmp_path)
    assert [step for step, _ in jsonl["loss"]] == csv_steps["loss"] == list(range(END + 1))
    assert dict(jsonl["loss"])[SAVED + 1] == resumed_values(SAVED + 1)
