import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from substrax.tracking import FileLogger, MLFlowLogger, MultiLogger, replay_spool


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
    [text] = [p for p in paths if p.startswith("text/note/step_1_") and p.endswith(".txt")]
    [histogram] = [p for p in paths if p.startswith("histograms/weights/step_3_")]
    assert histogram.endswith(".json")
    assert "extra/notes.txt" in paths
    assert any(p.startswith("images/sample/") and p.endswith(".png") for p in paths)
    local = client.download_artifacts(run_id, text, str(tmp_path / "dl"))
    assert Path(local).read_text() == "hello <world>"
    summary = json.loads(
        Path(client.download_artifacts(run_id, histogram, str(tmp_path / "dl"))).read_text()
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


def test_a_resumed_run_tags_its_attempt_and_a_refused_tag_is_a_warning(
    sqlite_uri, tmp_path, monkeypatch, caplog
):
    from substrax.tracking._live import process_attempt
    from substrax.tracking._mlflow_sink import ATTEMPT_TAG

    client = MlflowClient(tracking_uri=sqlite_uri)
    with MLFlowLogger("attempts", tracking_uri=sqlite_uri, log_dir=tmp_path) as first:
        first.log_scalar("loss", 1.0, step=0)
    assert client.get_run(first.run_id).data.tags[ATTEMPT_TAG] == process_attempt()
    client.set_tag(first.run_id, ATTEMPT_TAG, "killed")  # an earlier attempt's, in another process
    with MLFlowLogger("attempts", tracking_uri=sqlite_uri, log_dir=tmp_path, run_id=first.run_id):
        pass
    assert client.get_run(first.run_id).data.tags[ATTEMPT_TAG] == process_attempt()  # taken over
    client.set_tag(first.run_id, ATTEMPT_TAG, "killed")
    set_tag = MlflowClient.set_tag

    def refusing(self, run_id, key, value, *args, **kwargs):
        if key == ATTEMPT_TAG:
            raise RuntimeError("PERMISSION_DENIED: tags are read-only here")
        return set_tag(self, run_id, key, value, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "set_tag", refusing)
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    with MLFlowLogger(
        "attempts", tracking_uri=sqlite_uri, log_dir=tmp_path, run_id=first.run_id
    ) as third:
        third.log_scalar("loss", 0.5, step=1)  # the run is logged all the same
    assert f"run {first.run_id}: no {ATTEMPT_TAG} tag set (PERMISSION_DENIED" in caplog.text
    assert history(client, first.run_id, "loss") == [(0, 1.0), (1, 0.5)]
    assert client.get_run(first.run_id).info.status == "FINISHED"


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
    files = FileLogger("run", tmp_path)
    logger = MLFlowLogger("run", tracking_uri=sqlite_uri, log_dir=tmp_path)
    with MultiLogger([files, logger]) as multi:
        for call in (logger.log_hyperparams, multi.log_hyperparams):
            with pytest.raises(
                ValueError, match=r"two hyperparameters become the MLflow param 'opt\.lr'"
            ):
                call({"opt": {"lr": 0.1}, "opt.lr": 0.2})
        # hostile finding: through a MultiLogger, the file log kept what MLflow refused
        assert not files.hparams_json.exists()
        multi.log_hyperparams({"opt": {"lr": 0.1}, "name": "adam"})
        run_id = logger.run_id
    params = MlflowClient(tracking_uri=sqlite_uri).get_run(run_id).data.params
    assert params == {"opt.lr": "0.1", "name": "adam"}
    assert json.loads(files.hparams_json.read_text()) == {"opt": {"lr": 0.1}, "name": "adam"}


def refused_payloads(logger):
    refused_file = logger.spool_path.with_name(logger.spool_path.name + ".refused")
    return [json.loads(line)["record"]["payload"] for line in refused_file.read_text().splitlines()]


def test_a_param_mlflow_refuses_is_set_aside_alone_and_the_others_of_its_call_arrive(
    sqlite_uri, tmp_path
):
    """Hostile finding: one param MLflow refused (a changed value, a bad name) lost the call."""
    with MLFlowLogger("params", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        logger.log_hyperparams({"lr": 0.1, "epochs": 10})
        assert logger.wait_delivered(60)
        logger.log_hyperparams({"epochs": 20, "best_ckpt": "step_900"})  # epochs changes
        logger.log_hyperparams({"good": 1, "bad key!": 2, "nested": {"also_good": 3}})
        for seed in (1, 2, 1):  # in one batch: the same value again is no refusal
            logger.log_hyperparams({"seed": seed})
    params = MlflowClient(tracking_uri=sqlite_uri).get_run(logger.run_id).data.params
    assert params == {
        "lr": "0.1",
        "epochs": "10",
        "best_ckpt": "step_900",
        "good": "1",
        "nested.also_good": "3",
        "seed": "1",
    }
    assert refused_payloads(logger) == [
        {"params": {"epochs": 20}},
        {"params": {"bad key!": 2}},
        {"params": {"seed": 2}},
    ]


def test_each_key_mlflow_refuses_is_warned_once_with_its_first_step_and_where_it_is_kept(
    sqlite_uri, tmp_path, caplog
):
    """Hostile finding: one warning per batch, no step, cut at 2000 characters (8 of 18 keys)."""
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    with MLFlowLogger("keys", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        logger.log_scalars({f"bad%{i}": 1.0 for i in range(18)}, step=1)
        for step in range(2, 5):  # a batch each
            logger.log_scalars({"ok": 1.0, "bad%": 2.0}, step=step)
            assert logger.wait_delivered(60)
    assert history(MlflowClient(tracking_uri=sqlite_uri), logger.run_id, "ok") == [
        (2, 1.0),
        (3, 1.0),
        (4, 1.0),
    ]
    assert sum(len(p["values"]) for p in refused_payloads(logger)) == 18 + 3  # each is kept
    warned = [r.getMessage() for r in caplog.records if r.name.endswith("_refusals")]
    keys = [f"bad%{i}" for i in range(18)] + ["bad%"]
    assert sorted(m.split("refused metric ")[1].split(" at ")[0] for m in warned) == sorted(
        repr(key) for key in keys
    )  # each key once
    [bad] = [m for m in warned if "metric 'bad%' " in m]
    assert "at step 2 (MlflowException: Invalid value" in bad
    assert f"{logger.spool_path}.refused" in bad
    others = [r for r in caplog.records if not r.name.endswith("_refusals")]
    assert not [r for r in others if "refused" in r.getMessage()]  # no warning per batch too


def test_a_resumed_logger_sends_each_step_it_logs_even_one_that_goes_back_or_repeats(
    sqlite_uri, tmp_path, caplog
):
    """Hostile finding: a resumed logger silently dropped steps at or below the last one it sent."""
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    with MLFlowLogger("job", tracking_uri=sqlite_uri, log_dir=tmp_path) as first:
        for step in range(10):
            first.log_scalar("loss", 1.0, step=step)
        first.log_scalar("eval", 0.5, step=5)
    with MLFlowLogger(
        "job", tracking_uri=sqlite_uri, log_dir=tmp_path, run_id=first.run_id, resume_step=5
    ) as resumed:
        for step in (7, 9):  # the run holds them: not sent again
            resumed.log_scalar("loss", 2.0, step=step)
        resumed.log_scalar("eval", 1.0, step=12)
        resumed.log_scalar("eval", 2.0, step=11)
        resumed.log_scalar("eval", 3.0, step=12)
        resumed.log_scalar("loss", 3.0, step=10)
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert history(client, first.run_id, "eval") == [(5, 0.5), (11, 2.0), (12, 1.0), (12, 3.0)]
    assert history(client, first.run_id, "loss") == [(s, 1.0) for s in range(10)] + [(10, 3.0)]
    [warning] = [r.getMessage() for r in caplog.records if "not sent again" in r.getMessage()]
    assert "held 'loss' at step 7 already" in warning


def test_a_replay_of_the_killed_attempts_spool_after_the_resume_sends_the_steps_the_run_lacks(
    sqlite_uri, tmp_path, spool_scalars
):
    """Hostile finding: replayed after the resumed attempt (another log_dir) logged on, it sent
    no value at or before the run's last step, so the checkpointed steps 0..5 never arrived."""
    client = MlflowClient(tracking_uri=sqlite_uri)
    run_id = client.create_run(client.create_experiment(f"replay-{tmp_path.name}")).info.run_id
    spool = tmp_path / "killed.spool.jsonl"  # the killed attempt's records, its server down
    target = {"backend": "mlflow", "tracking_uri": sqlite_uri, "run_id": run_id}
    spool_scalars(spool, target, range(9), {"loss": 1.0})
    with MLFlowLogger(
        "job", tracking_uri=sqlite_uri, log_dir=tmp_path / "second", run_id=run_id, resume_step=5
    ) as resumed:
        for step in range(6, 12):
            resumed.log_scalar("loss", 2.0, step=step)
    assert replay_spool(spool, timeout=60).delivered == 9
    # steps 0..5 from the killed attempt; 6..11 the resumed attempt's, each once
    assert history(client, run_id, "loss") == [(s, 1.0) for s in range(6)] + [
        (s, 2.0) for s in range(6, 12)
    ]


@pytest.mark.parametrize("run_id", [" 0123abcd", "../../etc", "", " ", "abc\n"])
def test_a_run_id_mlflow_cannot_have_is_refused_before_anything_is_made(tmp_path, run_id):
    from substrax.tracking import UnknownRunIdError

    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    with pytest.raises(UnknownRunIdError, match=r"has no run"):
        MLFlowLogger("job", tracking_uri=uri, log_dir=tmp_path / "logs", run_id=run_id)
    assert list(tmp_path.iterdir()) == []


def test_too_long_an_experiment_name_is_refused_naming_the_argument_and_the_bound(tmp_path):
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    with pytest.raises(ValueError, match=r"experiment_name is 501 characters long.* at most 500"):
        MLFlowLogger("job", experiment_name="x" * 501, tracking_uri=uri, log_dir=tmp_path / "l")
    assert list(tmp_path.iterdir()) == []


def test_text_and_images_of_names_that_clean_alike_are_kept_apart(sqlite_uri, tmp_path):
    """Hostile finding: log_text("a b") and log_text("a:b") at one step wrote text/a_b/step_1.txt."""
    with MLFlowLogger("alike", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        for index, name in enumerate(("a b", "a:b", "a_b")):
            logger.log_text(name, f"text {index}", step=1)
            logger.log_image(name, np.full((2, 2), index / 2), step=1)
        run_id = logger.run_id
    client = MlflowClient(tracking_uri=sqlite_uri)
    for root in ("text", "images"):
        folders = [a.path for a in client.list_artifacts(run_id, root)]
        assert len(folders) == 3, folders
        assert f"{root}/a_b" in folders  # a file-safe name keeps its folder
    texts = {
        Path(client.download_artifacts(run_id, text.path, str(tmp_path / "dl"))).read_text()
        for folder in client.list_artifacts(run_id, "text")
        for text in client.list_artifacts(run_id, folder.path)
    }
    assert texts == {"text 0", "text 1", "text 2"}


def test_refusals_of_another_runs_records_are_named_so_and_leave_this_runs_warnings(
    sqlite_uri, tmp_path, caplog, wait_for
):
    """Hostile finding: a refusal among what another run left in the spool was warned as this
    logger's, and kept this run's own refusal of the same key from being warned at all."""
    from substrax.tracking._records import Record
    from substrax.tracking._spool import SpoolFile

    client = MlflowClient(tracking_uri=sqlite_uri)
    old = client.create_run(client.create_experiment(f"old-{time.time_ns()}")).info.run_id
    spool = tmp_path / "r.spool.jsonl"
    target = {"backend": "mlflow", "tracking_uri": sqlite_uri, "run_id": old}
    left = [
        Record(kind="scalars", step=1000 + s, time=1.0, payload={"values": {"bad%": 1.0}})
        for s in range(2)
    ]
    SpoolFile(spool).append(target, [record.materialize(tmp_path) for record in left])
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    refused = tmp_path / "r.spool.jsonl.refused"
    with MLFlowLogger("r", tracking_uri=sqlite_uri, log_dir=tmp_path, spool_path=spool) as logger:
        wait_for(lambda: refused.exists() and len(refused.read_text().splitlines()) == 2)
        logger.log_metrics({"bad%": 5.0, "ok": 1.0}, step=0)
    warned = [r.getMessage() for r in caplog.records if r.name.endswith("_refusals")]
    [other] = [m for m in warned if "other runs' records" in m]
    assert "refused metric 'bad%' at step 1000" in other
    [own] = [m for m in warned if m not in (other,)]
    assert own.startswith("MLFlowLogger('r'): the backend refused metric 'bad%' at step 0 (")
    assert history(client, logger.run_id, "ok") == [(0, 1.0)]


def _artifact_texts(client, run_id, folder, tmp_path):
    """The text of each artifact file in ``folder``, in the order of their names."""
    files = sorted(a.path for a in client.list_artifacts(run_id, folder))
    return [
        Path(client.download_artifacts(run_id, f, str(tmp_path / "dl"))).read_text() for f in files
    ]


def test_a_text_or_histogram_logged_twice_at_a_step_is_kept_twice(sqlite_uri, tmp_path):
    """Hostile finding: a text or histogram logged twice at one step went to one artifact file
    (text/<name>/step_3.txt), the second overwriting the first without a word, a resumed run's
    over the first attempt's too; the guide says MLflow keeps a key logged twice at a step."""
    with MLFlowLogger("twice", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        logger.log_text("sample", "first", step=3)
        logger.log_text("sample", "second", step=3)
        logger.log_histogram("w", np.arange(3.0), step=5)
        logger.log_histogram("w", np.arange(100.0), step=5)
    with MLFlowLogger(
        "twice", tracking_uri=sqlite_uri, log_dir=tmp_path, run_id=logger.run_id, resume_step=2
    ) as resumed:
        resumed.log_text("sample", "resumed", step=3)
    client = MlflowClient(tracking_uri=sqlite_uri)
    texts = _artifact_texts(client, logger.run_id, "text/sample", tmp_path)
    assert texts == ["first", "second", "resumed"]
    counts = [
        json.loads(t)["count"]
        for t in _artifact_texts(client, logger.run_id, "histograms/w", tmp_path)
    ]
    assert counts == [3, 100]


def test_a_histograms_summary_metric_that_is_also_a_logged_metric_is_warned_about_once(
    sqlite_uri, tmp_path, caplog
):
    """Hostile finding: a histogram's summary metrics <name>/min|max|mean|std went among the
    user's, so a metric "grads/mean" of the same step got both values, without a word."""
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    with MLFlowLogger("stats", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        logger.log_histogram("weights", [1.0, 2.0], step=0)  # no metric of its names: no warning
        logger.log_scalar("loss", 1.0, step=0)
        logger.flush()
        assert not [r for r in caplog.records if "summarised" in r.getMessage()]
        logger.log_scalar("grads/mean", 0.5, step=1)
        logger.log_histogram("grads", np.array([10.0, 20.0]), step=1)
        logger.log_histogram("grads", np.array([10.0, 20.0]), step=2)
        logger.log_scalar("weights/max", 9.0, step=2)  # the other order
    [warning] = [r.getMessage() for r in caplog.records if "summarised" in r.getMessage()]
    assert "the histogram 'grads' is summarised in the metrics <name>/min" in warning
    assert "'grads/mean' is also logged as a metric" in warning
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert history(client, logger.run_id, "grads/mean") == [(1, 0.5), (1, 15.0), (2, 15.0)]


def test_what_mlflow_does_not_keep_of_a_hyperparameter_is_warned_about_naming_it(
    sqlite_uri, tmp_path, caplog
):
    """Hostile finding: MLflow dropped an empty mapping ("scheduler": {}) silently, where
    TensorBoard and W&B keep {}, and cut a value past 6000 characters with only its own warning."""
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    with MLFlowLogger("params", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        params = {"prompt": "x" * 7000, "scheduler": {}, "opt": {"extra": {}}, "lr": 0.1}
        logger.log_hyperparams(params)
        logger.log_hyperparams(params)  # warned once a key
    warned = [r.getMessage() for r in caplog.records if "hyperparameter" in r.getMessage()]
    assert warned == [
        "MLFlowLogger('params'): hyperparameter 'scheduler' is an empty mapping, which MLflow "
        "has no param for: it is left out",
        "MLFlowLogger('params'): hyperparameter 'opt.extra' is an empty mapping, which MLflow "
        "has no param for: it is left out",
        "MLFlowLogger('params'): hyperparameter 'prompt' is 7000 characters long; MLflow keeps "
        "the first 6000 of a param's value (log the whole with log_text)",
    ]
    params = MlflowClient(tracking_uri=sqlite_uri).get_run(logger.run_id).data.params
    assert (len(params["prompt"]), params["lr"]) == (6000, "0.1")


def test_nested_hyperparameters_of_two_calls_are_all_kept(sqlite_uri, tmp_path):
    """Hostile finding: the file log, TensorBoard and W&B kept only the second call's
    ``optimizer``; MLflow's flat params keep b1 and b2, as every logger now does."""
    with MLFlowLogger("merge", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        logger.log_hyperparams({"model": {"width": 64}, "optimizer": {"b1": 0.9}})
        logger.log_hyperparams({"optimizer": {"b2": 0.99}})
    params = MlflowClient(tracking_uri=sqlite_uri).get_run(logger.run_id).data.params
    assert params == {"model.width": "64", "optimizer.b1": "0.9", "optimizer.b2": "0.99"}


def test_a_mapping_and_a_value_logged_under_one_name_are_warned_about(sqlite_uri, tmp_path, caplog):
    """Hostile finding: {"opt": {"lr": 1}} then {"opt": "sgd"} left the stale 'opt.lr' beside
    'opt' in MLflow (which cannot delete a param) without a word, where the other loggers replace."""
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    with MLFlowLogger("replace", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        logger.log_hyperparams({"opt": {"lr": 0.1, "b1": 0.9}, "sched": "cosine"})
        logger.log_hyperparams({"opt": "sgd", "sched": {"name": "cosine"}})
        logger.log_hyperparams({"sched": {"name": "cosine"}, "opt": "sgd"})  # as held: no word
    warned = [r.getMessage() for r in caplog.records if "hyperparameter" in r.getMessage()]
    assert warned == [
        "MLFlowLogger('replace'): hyperparameter 'opt' takes the place of 'opt.b1', 'opt.lr' "
        "logged before (a mapping and a value under one name); MLflow cannot delete a param: "
        "the run keeps both",
        "MLFlowLogger('replace'): hyperparameter 'sched.name' takes the place of 'sched' logged "
        "before (a mapping and a value under one name); MLflow cannot delete a param: the run "
        "keeps both",
    ]
    params = MlflowClient(tracking_uri=sqlite_uri).get_run(logger.run_id).data.params
    assert (params["opt"], params["opt.lr"]) == ("sgd", "0.1")


def test_a_dotted_name_beside_a_value_is_no_replacement(sqlite_uri, tmp_path, caplog):
    """Review of the warning above: {"lr": 0.1, "lr.schedule": ...} replaces nothing."""
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    with MLFlowLogger("dotted", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        logger.log_hyperparams({"lr": 0.1, "lr.schedule": "cosine"})
        logger.log_hyperparams({"opt": {"b1": 0.9}, "opt.b2": 0.99})
    assert [r.getMessage() for r in caplog.records if "hyperparameter" in r.getMessage()] == []


def test_a_died_run_ends_failed_unless_a_later_attempt_resumed_and_ended_it(sqlite_uri, tmp_path):
    """Review of the died-run fix: replaying a killed attempt's spool after the run was resumed
    and closed cleanly turned it FAILED; a run left RUNNING by its killed process ends FAILED."""
    from substrax.tracking._records import Record
    from substrax.tracking._send import Sending
    from substrax.tracking._spool import SpoolLine

    client = MlflowClient(tracking_uri=sqlite_uri)
    with MLFlowLogger("resumed", tracking_uri=sqlite_uri, log_dir=tmp_path / "a") as logger:
        logger.log_scalar("loss", 1.0, step=1)
    experiment = client.get_experiment_by_name("resumed").experiment_id
    left_running = client.create_run(experiment).info.run_id  # as a killed process leaves it
    ended = []
    for run_id in (logger.run_id, left_running):
        target = {"backend": "mlflow", "tracking_uri": sqlite_uri, "run_id": run_id}
        record = Record(kind="scalars", step=2, time=1.0, payload={"values": {"loss": 0.5}})
        line = SpoolLine(1, "", {"target": target, "record": record.to_json()})
        Sending([line], {}, live=lambda _run: "died", ended=ended.append).run()
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    assert client.get_run(left_running).info.status == "FAILED"
    assert len(ended) == 2  # each told once ended: its live file may go
    assert [m.step for m in client.get_metric_history(left_running, "loss")] == [2]
