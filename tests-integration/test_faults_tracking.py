"""Faults of remote tracking, end to end in fresh interpreters: MLflow and W&B servers that are
not there or vanish mid-run (real sockets on 127.0.0.1), with MLflow's own long HTTP retries
set as a user might, and ``python -m substrax.tracking replay`` against a dead server, a damaged
spool and a missing one."""

import importlib.util
import json
import time
from pathlib import Path

import pytest

from substrax.testing import free_port, run_python


pytest.importorskip("mlflow", reason="the mlflow extra is needed for the MLflow faults")

# A user's own MLflow settings that make one request to a dead server take minutes.
SLOW_MLFLOW = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "7", "MLFLOW_HTTP_REQUEST_TIMEOUT": "120"}
SLACK = 3.0  # seconds allowed past a bound for a loaded machine
# close_timeout of the runs below: the server is dead by then, so close always waits it out
# and spools; its length proves nothing more (the writer spools within milliseconds)
CLOSE = 2


def load_vanishing_mlflow():
    path = Path(__file__).parents[1] / "packages/substrax-tracking/tests/vanishing_mlflow.py"
    spec = importlib.util.spec_from_file_location("vanishing_mlflow", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VanishingMlflow


LOG_AND_CLOSE = """
import json, sys, time
import mlflow  # imported before the clock starts: construction is timed, not the import
from substrax.tracking import MLFlowLogger
uri, log_dir, steps, close = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
started = time.monotonic()
logger = MLFlowLogger("run", tracking_uri=uri, log_dir=log_dir, close_timeout=close)
built = time.monotonic() - started
for step in range(steps):
    logger.log_scalar("loss", float(step), step=step)
started = time.monotonic()
logger.close()
print(json.dumps({"built": built, "closed": time.monotonic() - started,
                  "run_id": logger.run_id, "spool": str(logger.spool_path)}))
"""


def spool_lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def replay(spool, *options, env=None, timeout=120):
    return run_python(
        "import sys, runpy; sys.argv[0] = 'substrax.tracking'; "
        "runpy.run_module('substrax.tracking', run_name='__main__')",
        "replay",
        str(spool),
        *options,
        env=env,
        timeout=timeout,
    )


def test_an_mlflow_server_that_is_not_there_costs_construction_at_most_connect_timeout(tmp_path):
    # connect_timeout is left at its default of 10 s
    uri = f"http://127.0.0.1:{free_port()}"
    run = run_python(
        LOG_AND_CLOSE, uri, str(tmp_path), "100", str(CLOSE), env=SLOW_MLFLOW, timeout=90
    )
    report = run.check().last_json()
    assert report["built"] < 10 + SLACK, report  # was ~250 s: MLflow's own retries
    assert report["closed"] < CLOSE + 1 + SLACK, report
    assert report["run_id"] is None
    # MLflow's own retries (the user's settings) are still running after connect_timeout
    assert "did not answer within 10 s" in run.stderr
    lines = spool_lines(report["spool"])
    assert [line["record"]["step"] for line in lines] == list(range(100))
    assert {line["target"]["tracking_uri"] for line in lines} == {uri}
    assert all("run_key" in line["target"] for line in lines)


@pytest.mark.parametrize("how", ["refuse", "silent"])
def test_an_mlflow_server_that_dies_mid_run_loses_nothing_and_replay_gives_up_in_time(
    tmp_path, how
):
    server = load_vanishing_mlflow()(vanish_after_run=how)
    try:
        run = run_python(
            LOG_AND_CLOSE,
            server.uri,
            str(tmp_path),
            "500",
            str(CLOSE),
            env=SLOW_MLFLOW,
            timeout=120,
        )
        report = run.check().last_json()
        assert report["closed"] < CLOSE + 1 + SLACK, report  # was 35 s, and nothing spooled
        assert report["run_id"] == "run1"
        spool = Path(report["spool"])
        steps = [line["record"]["step"] for line in spool_lines(spool)]
        marks = steps.count(None)  # a record of no values: the replay that ends the run
        assert [step for step in steps if step is not None] == list(range(500))
        assert marks <= 1
        assert str(spool) in run.stderr
        assert f"python -m substrax.tracking replay {spool}" in run.stderr

        started = time.monotonic()
        replayed = replay(spool, "--timeout", "4", env=SLOW_MLFLOW, timeout=120)
        assert time.monotonic() - started < 60  # was still running after 300 s
        assert replayed.returncode == 1, replayed.stderr
        last = replayed.stdout.strip().splitlines()[-1]
        assert last == f"delivered 0, remaining {500 + marks}"
        assert "Traceback" not in replayed.stderr
        assert len(spool_lines(spool)) == 500 + marks  # kept for the next try
    finally:
        server.close()


def test_replay_of_a_damaged_spool_delivers_every_intact_record_and_names_the_bad_lines(
    tmp_path,
):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("damaged", artifact_location=tmp_path.as_uri())
    run_id = client.create_run(experiment).info.run_id
    target = {"backend": "mlflow", "tracking_uri": uri, "run_id": run_id}
    lines = [
        json.dumps(
            {
                "target": target,
                "record": {
                    "kind": "scalars",
                    "step": step,
                    "time": 1.0e9 + step,
                    "payload": {"values": {"loss": step / 10}},
                },
            }
        )
        for step in range(11)
    ]
    cut = lines.pop()[:40]  # the last line, cut short by a crash
    lines.insert(3, "{not json at all")  # line 4
    spool = tmp_path / "run.spool.jsonl"
    spool.write_text("\n".join([*lines, cut]))

    replayed = replay(spool)
    assert replayed.returncode == 1, replayed.stderr
    assert replayed.stdout.strip().splitlines()[-1] == "delivered 10, remaining 0"
    assert "line 4:" in replayed.stderr
    assert "line 12:" in replayed.stderr
    assert "Traceback" not in replayed.stderr  # was a JSONDecodeError, 0 records delivered
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert history == [(step, step / 10) for step in range(10)]
    assert not spool.exists()
    bad = spool.with_name("run.spool.jsonl.bad").read_text().splitlines()
    assert bad == ["{not json at all", cut]


def test_replay_of_a_missing_spool_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "no-such.spool.jsonl"
    replayed = replay(missing)
    assert replayed.returncode == 2, replayed.stdout  # was 0, "delivered 0, remaining 0"
    assert str(missing) in replayed.stderr
    assert "Traceback" not in replayed.stderr


WANDB_ONLINE = """
import json, sys, time
import wandb  # imported before the clock starts
from substrax.tracking import WandbLogger
started = time.monotonic()
logger = WandbLogger("run", project="faults", log_dir=sys.argv[1], close_timeout=2)
built = time.monotonic() - started
for step in range(20):
    logger.log_scalar("loss", float(step), step=step)
started = time.monotonic()
logger.close()
print(json.dumps({"built": built, "closed": time.monotonic() - started,
                  "run_id": logger.run_id, "spool": str(logger.spool_path)}), flush=True)
"""


def test_an_online_wandb_server_that_is_not_there_never_hangs_the_run(tmp_path):
    pytest.importorskip("wandb", reason="the wandb extra is needed for WandbLogger")
    env = {
        "WANDB_BASE_URL": f"http://127.0.0.1:{free_port()}",
        "WANDB_API_KEY": "x" * 40,  # a key of the right shape; no server ever sees it
        "WANDB_MODE": "online",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
    }
    started = time.monotonic()
    run = run_python(WANDB_ONLINE, str(tmp_path), env=env, timeout=120)  # was: init hung
    report = run.check().last_json()
    assert time.monotonic() - started < 90  # the process ends too, W&B's exit hooks included
    assert report["built"] < 10 + SLACK, report  # connect_timeout's default
    assert report["closed"] < 2 + 1 + SLACK, report
    lines = spool_lines(report["spool"])
    assert [line["record"]["step"] for line in lines] == list(range(20))
    assert {line["target"]["run_id"] for line in lines} == {report["run_id"]}
