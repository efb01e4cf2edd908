import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from substrax.tracking import MLFlowLogger, replay_spool


mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is needed for MLFlowLogger")
from mlflow.tracking import MlflowClient  # noqa: E402


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_sends_no_telemetry_from_the_suite():
    """Tests talk to no address but 127.0.0.1: MLflow's telemetry is off (the root conftest)."""
    from mlflow.telemetry.utils import is_telemetry_disabled

    assert is_telemetry_disabled()


def test_everything_logged_reads_back_from_a_sqlite_store(sqlite_uri, tmp_path):
    artifact = tmp_path / "notes.txt"
    artifact.write_text("weights go here")
    with MLFlowLogger(
        "demo",
        experiment_name="everything",
        tracking_uri=sqlite_uri,
        log_dir=tmp_path,
        tags={"k": "v"},
    ) as logger:
        logger.log_hyperparams({"lr": 1e-3, "model": {"depth": 2, "act": "relu"}, "layers": [2, 3]})
        for step in range(5):
            logger.log_scalars({"loss": 1.0 / (step + 1), "acc": np.float32(step / 4)}, step=step)
        logger.log_metrics({"lr": 0.5})  # no step: the last step given
        logger.log_text("note", "hello <world>", step=1)
        logger.log_image("sample", np.zeros((4, 4, 3)), step=2)
        logger.log_histogram("weights", np.arange(10.0), step=3)
        logger.log_artifact(artifact, "extra")
        run_id = logger.run_id
    client = MlflowClient(tracking_uri=sqlite_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "demo"
    assert run.data.tags["k"] == "v"
    assert run.data.params == {
        "lr": "0.001",
        "model.depth": "2",
        "model.act": "relu",
        "layers": "[2, 3]",
    }
    assert history(client, run_id, "loss") == [(s, pytest.approx(1.0 / (s + 1))) for s in range(5)]
    assert history(client, run_id, "acc") == [(s, pytest.approx(s / 4)) for s in range(5)]
    assert history(client, run_id, "lr") == [(4, 0.5)]
    assert history(client, run_id, "weights/max") == [(3, 9.0)]
    assert history(client, run_id, "weights/mean") == [(3, 4.5)]
    paths = {
        a.path
        for root in ("text/note", "images/sample", "histograms/weights", "extra")
        for a in client.list_artifacts(run_id, root)
    }
    assert "text/note/step_1.txt" in paths
    assert "histograms/weights/step_3.json" in paths
    assert "extra/notes.txt" in paths
    assert any(p.startswith("images/sample/") and p.endswith(".png") for p in paths)
    local = client.download_artifacts(run_id, "text/note/step_1.txt", str(tmp_path / "dl"))
    assert Path(local).read_text() == "hello <world>"
    summary = json.loads(
        Path(
            client.download_artifacts(
                run_id, "histograms/weights/step_3.json", str(tmp_path / "dl")
            )
        ).read_text()
    )
    assert summary["count"] == 10
    assert not logger.spool_path.exists()


def test_what_is_logged_is_what_the_objects_held_at_the_call(sqlite_uri, tmp_path):
    """Hostile finding: the worker read the caller's dicts and arrays up to a second later, so
    a config or a buffer changed right after the call reached MLflow (and W&B) changed."""
    image_module = pytest.importorskip("PIL.Image", reason="Pillow reads the image back")
    config = {"optimizer": {"lr": 0.1}}
    weights = np.zeros(1000)
    image = np.full((4, 4, 3), 255, np.uint8)
    logger = MLFlowLogger("snapshot", tracking_uri=sqlite_uri, log_dir=tmp_path)
    with logger:
        logger.log_hyperparams(config)
        logger.log_histogram("weights", weights, step=0)
        logger.log_image("sample", image, step=0)
        config["optimizer"]["lr"] = 999.0  # before the worker's batch interval ends
        weights[:] = 7.0
        image[:] = 0
    client = MlflowClient(tracking_uri=sqlite_uri)
    run = client.get_run(logger.run_id)
    assert run.data.params == {"optimizer.lr": "0.1"}
    assert history(client, logger.run_id, "weights/mean") == [(0, 0.0)]
    [png] = client.list_artifacts(logger.run_id, "images/sample")
    local = client.download_artifacts(logger.run_id, png.path, str(tmp_path / "dl"))
    assert np.asarray(image_module.open(local))[0, 0, 0] == 255


def test_a_run_id_resumes_the_same_run(sqlite_uri, tmp_path):
    with MLFlowLogger("resume", tracking_uri=sqlite_uri, log_dir=tmp_path) as first:
        first.log_scalar("loss", 1.0, step=0)
    with MLFlowLogger(
        "resume", tracking_uri=sqlite_uri, log_dir=tmp_path, run_id=first.run_id
    ) as second:
        second.log_metric("loss", 0.5, step=1)  # the MLflow name works too
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert history(client, first.run_id, "loss") == [(0, 1.0), (1, 0.5)]
    assert len(client.search_runs([client.get_experiment_by_name("resume").experiment_id])) == 1


def test_only_process_zero_makes_a_run(sqlite_uri, tmp_path):
    client = MlflowClient(tracking_uri=sqlite_uri)
    with MLFlowLogger("ranks", tracking_uri=sqlite_uri, log_dir=tmp_path, process_index=1) as other:
        other.log_scalar("loss", 1.0, step=0)
    assert other.run_id is None
    assert client.get_experiment_by_name("ranks") is None
    with MLFlowLogger("ranks", tracking_uri=sqlite_uri, log_dir=tmp_path, process_index=0) as main:
        main.log_scalar("loss", 1.0, step=0)
    assert len(client.search_runs([client.get_experiment_by_name("ranks").experiment_id])) == 1


def test_the_default_store_is_in_the_output_dir_not_the_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("AVITAI_OUTPUT_DIR", str(tmp_path / "out"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with MLFlowLogger("defaults") as logger:
        logger.log_scalar("loss", 1.0, step=0)
    assert logger.tracking_uri == f"sqlite:///{tmp_path / 'out' / 'defaults' / 'mlflow.db'}"
    assert list(cwd.iterdir()) == []
    client = MlflowClient(tracking_uri=logger.tracking_uri)
    assert history(client, logger.run_id, "loss") == [(0, 1.0)]


def test_a_refused_value_is_set_aside_and_the_rest_arrives(sqlite_uri, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    with MLFlowLogger("refused", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        logger.log_hyperparams({"lr": 1})
        assert logger.wait_delivered(60)
        logger.log_hyperparams({"lr": 2})  # MLflow params cannot change
        logger.log_scalar("loss", 1.0, step=0)
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert client.get_run(logger.run_id).data.params == {"lr": "1"}
    assert history(client, logger.run_id, "loss") == [(0, 1.0)]
    assert not logger.spool_path.exists()
    refused_file = logger.spool_path.with_name(logger.spool_path.name + ".refused")
    refused = [json.loads(line) for line in refused_file.read_text().splitlines()]
    assert [line["record"]["payload"] for line in refused] == [{"params": {"lr": 2}}]
    assert (
        "INVALID_PARAMETER_VALUE" in refused[0]["error"] or "MlflowException" in refused[0]["error"]
    )
    assert "refused" in caplog.text
    # --include-refused sends it again, and MLflow refuses it again
    result = replay_spool(logger.spool_path, include_refused=True)
    assert (result.delivered, result.remaining, result.refused) == (0, 0, 1)
    assert len(refused_file.read_text().splitlines()) == 1


def test_the_replay_command_sends_a_spool_to_its_run(sqlite_uri, tmp_path, capsys):
    from substrax.tracking._cli import main

    client = MlflowClient(tracking_uri=sqlite_uri)
    experiment = client.create_experiment("replay", artifact_location=(tmp_path / "art").as_uri())
    run_id = client.create_run(experiment).info.run_id
    target = {"backend": "mlflow", "tracking_uri": sqlite_uri, "run_id": run_id}
    spool = tmp_path / "demo.spool.jsonl"
    lines = [
        {
            "target": target,
            "record": {
                "kind": "scalars",
                "step": s,
                "time": time.time(),
                "payload": {"values": {"loss": s / 10}},
            },
        }
        for s in range(3)
    ]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["replay", str(spool)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "delivered 3, remaining 0"
    assert history(client, run_id, "loss") == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert not spool.exists()


def test_missing_mlflow_fails_at_construction_with_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"uv add 'substrax-tracking\[mlflow\]'"):
        MLFlowLogger("x", tracking_uri="sqlite:///unused.db")


def test_bad_options_are_refused(sqlite_uri, tmp_path):
    for bad in (-1, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"close_timeout=.* must be a finite number"):
            MLFlowLogger("x", tracking_uri=sqlite_uri, log_dir=tmp_path, close_timeout=bad)
    for bad in (0, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"connect_timeout=.* must be a finite number"):
            MLFlowLogger("x", tracking_uri=sqlite_uri, log_dir=tmp_path, connect_timeout=bad)
    with pytest.raises(ValueError, match="max_queue"):
        MLFlowLogger("x", tracking_uri=sqlite_uri, log_dir=tmp_path, max_queue=0)


def test_hyperparameters_that_become_one_mlflow_param_are_refused_at_the_call(tmp_path, sqlite_uri):
    with MLFlowLogger("run", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        with pytest.raises(
            ValueError, match=r"two hyperparameters become the MLflow param 'opt\.lr'"
        ):
            logger.log_hyperparams({"opt": {"lr": 0.1}, "opt.lr": 0.2})
        logger.log_hyperparams({"opt": {"lr": 0.1}, "name": "adam"})
        run_id = logger.run_id
    params = MlflowClient(tracking_uri=sqlite_uri).get_run(run_id).data.params
    assert params == {"opt.lr": "0.1", "name": "adam"}
