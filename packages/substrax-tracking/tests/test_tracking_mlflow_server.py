"""MLFlowLogger against a real `mlflow server` on 127.0.0.1, including the server dying mid-run."""

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from substrax.tracking import MLFlowLogger


pytest.importorskip("mlflow", reason="the mlflow extra is needed for MLFlowLogger")
from mlflow.tracking import MlflowClient


pytestmark = pytest.mark.xdist_group("mlflow_server")


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.parametrize("stdout", ["ascii", "closed"])
def test_a_run_ends_when_stdout_cannot_take_mlflows_run_link(
    mlflow_server, tmp_path, monkeypatch, stdout
):
    """A hostile review: MLflow prints the run's link (with an emoji) to stdout before it ends a
    run; an ASCII stdout (a latin-1 or C locale, PYTHONIOENCODING=ascii) or none (``>&-``)
    raised there, and the run stayed RUNNING for ever (a replay of its spool too)."""
    import io

    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", ascii_out if stdout == "ascii" else None)
    with MLFlowLogger(
        "ended", experiment_name="ended", tracking_uri=mlflow_server.uri, log_dir=tmp_path
    ) as logger:
        logger.log_scalar("loss", 1.0, step=0)
    run = MlflowClient(tracking_uri=mlflow_server.uri).get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert history(MlflowClient(tracking_uri=mlflow_server.uri), logger.run_id, "loss") == [
        (0, 1.0)
    ]


def test_every_metric_param_and_artifact_reads_back_through_the_server(mlflow_server, tmp_path):
    artifact = tmp_path / "model.txt"
    artifact.write_text("weights")
    with MLFlowLogger(
        "served", experiment_name="served", tracking_uri=mlflow_server.uri, log_dir=tmp_path
    ) as logger:
        logger.log_hyperparams({"lr": 0.01, "optimizer": {"name": "adam"}})
        for step in range(20):
            logger.log_scalars({"loss": 1.0 / (step + 1), "acc": step / 20}, step=step)
        logger.log_text("summary", "done", step=19)
        logger.log_image("sample", np.ones((3, 3)), step=19)
        logger.log_histogram("grads", np.linspace(-1.0, 1.0, 11), step=19)
        logger.log_artifact(artifact, "checkpoints")
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.01", "optimizer.name": "adam"}
    assert history(client, logger.run_id, "loss") == [
        (s, pytest.approx(1.0 / (s + 1))) for s in range(20)
    ]
    assert history(client, logger.run_id, "acc") == [(s, pytest.approx(s / 20)) for s in range(20)]
    assert history(client, logger.run_id, "grads/min") == [(19, -1.0)]
    listed = {
        a.path
        for folder in ("text/summary", "images/sample", "histograms/grads", "checkpoints")
        for a in client.list_artifacts(logger.run_id, folder)
    }
    assert "checkpoints/model.txt" in listed
    assert any(p.startswith("text/summary/step_19_") and p.endswith(".txt") for p in listed)
    assert any(p.startswith("histograms/grads/step_19_") and p.endswith(".json") for p in listed)
    assert any(p.startswith("images/sample/") for p in listed)
    downloaded = client.download_artifacts(
        logger.run_id, "checkpoints/model.txt", str(tmp_path / "dl")
    )
    assert Path(downloaded).read_text() == "weights"


@pytest.mark.usefixtures("child_processes")
def test_a_server_killed_mid_run_loses_nothing(mlflow_server, tmp_path, caplog, wait_for):
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    kept = MLFlowLogger(
        "fault", tracking_uri=mlflow_server.uri, log_dir=tmp_path / "kept", close_timeout=120
    )
    spooling = MLFlowLogger(
        "fault-spooled",
        tracking_uri=mlflow_server.uri,
        log_dir=tmp_path / "spooled",
        close_timeout=0.5,
    )
    for step in range(10):
        kept.log_scalar("loss", float(step), step=step)
        spooling.log_scalar("loss", float(step), step=step)
    assert kept.wait_delivered(60)
    assert spooling.wait_delivered(60)

    mlflow_server.kill()
    for step in range(10, 40):  # logging goes on while the server is gone
        kept.log_scalar("loss", float(step), step=step)
        spooling.log_scalar("loss", float(step), step=step)
    wait_for(lambda: kept._delivery.failures >= 1 and spooling._delivery.failures >= 1)
    spooling.close()  # it gives up quickly and keeps the rest in its spool file
    assert spooling.spooled == 30
    assert spooling.spool_path.exists()
    started = time.monotonic()
    late = MLFlowLogger(  # a run that starts while the server is down
        "born-while-down",
        tracking_uri=mlflow_server.uri,
        log_dir=tmp_path / "late",
        connect_timeout=5,
        close_timeout=120,
    )
    assert time.monotonic() - started < 5 + 3
    assert late.run_id is None
    for step in range(10):
        late.log_scalar("loss", float(step), step=step)

    mlflow_server.start()
    mlflow_server.wait_ready()
    kept.log_scalar("loss", 40.0, step=40)
    kept.close()  # the spooled records are retried and arrive
    assert not kept.spool_path.exists()
    assert history(client, kept.run_id, "loss") == [(s, float(s)) for s in range(41)]
    assert client.get_run(kept.run_id).info.status == "FINISHED"
    late.close()  # its run is created once the server answers, and gets everything
    assert late.run_id is not None
    assert not late.spool_path.exists()
    late_run = client.get_run(late.run_id)
    assert late_run.info.status == "FINISHED"
    assert late_run.info.run_name == "born-while-down"
    assert "substrax.run_key" in late_run.data.tags
    assert history(client, late.run_id, "loss") == [(s, float(s)) for s in range(10)]
    failures = [
        r
        for r in caplog.records
        if "could not deliver" in r.getMessage() and "'fault'" in r.getMessage()
    ]
    assert len(failures) == 1  # reported once, however many retries failed

    result = subprocess.run(
        [sys.executable, "-m", "substrax.tracking", "replay", str(spooling.spool_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "delivered 30, remaining 0"
    assert history(client, spooling.run_id, "loss") == [(s, float(s)) for s in range(40)]
    assert not spooling.spool_path.exists()
    assert json.loads(json.dumps(client.get_run(spooling.run_id).info.status)) == "FINISHED"


def test_loggers_starting_together_on_a_new_experiment_all_start(mlflow_server, tmp_path):
    """Hostile finding: against a server (no store lock there), the loggers that lost the race
    to create the experiment raised MLflow's RESOURCE_ALREADY_EXISTS from their constructor."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    for attempt in range(3):
        barrier = threading.Barrier(4)

        def start(index, attempt=attempt, barrier=barrier):
            barrier.wait()
            return MLFlowLogger(
                f"racer{index}",
                experiment_name=f"raced-{attempt}",
                tracking_uri=mlflow_server.uri,
                log_dir=tmp_path / f"{attempt}-{index}",
            )

        with ThreadPoolExecutor(4) as pool:
            started = [pool.submit(start, index) for index in range(4)]
        made = [future.result() for future in started if future.exception() is None]
        for logger in made:
            logger.close()
        assert [future.exception() for future in started] == [None] * 4
        assert len({logger.experiment_id for logger in made}) == 1


def test_replay_json_prints_only_its_json_on_stdout_against_a_server(mlflow_door, tmp_path, capsys):
    """Hostile finding: MLflow's own "View run" lines went to stdout before the JSON object."""
    from substrax.tracking._cli import main

    logger = MLFlowLogger(  # the door is shut: everything is spooled
        "viewed", tracking_uri=mlflow_door.uri, log_dir=tmp_path, connect_timeout=1, close_timeout=0
    )
    logger.log_scalar("loss", 0.5, step=1)
    logger.close()
    capsys.readouterr()
    mlflow_door.open()
    assert main(["replay", "--json", str(logger.spool_path), "--timeout", "60"]) == 0
    printed = capsys.readouterr()
    data = json.loads(printed.out)
    assert (data["delivered"], data["remaining"]) == (1, 0)
