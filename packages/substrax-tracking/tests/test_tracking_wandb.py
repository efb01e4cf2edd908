"""WandbLogger in offline mode, its run file read back with wandb's own record reader."""

import json
import subprocess
import sys

import numpy as np
import pytest

from substrax.tracking import (
    FileLogger,
    LoggedTypeError,
    MultiLogger,
    ReservedMetricNameError,
    WandbLogger,
    read_scalars,
)


pytest.importorskip("wandb", reason="the wandb extra is needed for WandbLogger")


def history_config_summary(records):
    """The history rows, config and summary in the records of one run file."""
    history, config, summary = [], {}, {}
    for kind, record in records:
        if kind == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            row.setdefault("_step", record.history.step.num)
            history.append(row)
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "run":
            config.update(
                {item.key: json.loads(item.value_json) for item in record.run.config.update}
            )
        elif kind == "summary":
            summary.update(
                {item.key: json.loads(item.value_json) for item in record.summary.update}
            )
    return history, config, summary


@pytest.fixture
def read_complete_run(wandb_runs):
    """``read_complete_run(log_dir, steps)``: the one run file, once it holds the given steps."""

    def read(log_dir, steps):
        def written(runs):
            logged = {
                row["_step"] for records in runs for row in history_config_summary(records)[0]
            }
            return len(runs) == 1 and set(steps) <= logged

        [records] = wandb_runs.wait(log_dir, written)
        return history_config_summary(records)

    return read


def test_offline_run_reads_back(wandb_offline, read_complete_run, tmp_path):
    with WandbLogger(
        "demo", project="substrax-tests", log_dir=tmp_path, config={"lr": 1e-3}
    ) as logger:
        logger.log_hyperparams({"batch_size": 32})
        for step in range(5):
            logger.log_scalars({"loss": 1.0 / (step + 1), "acc": step / 5}, step=step)
        logger.log_metrics(
            {"lr": 0.5}
        )  # no step: the last one given, W&B's own counter is never used
        logger.log_text("note", "a < b", step=5)
        logger.log_image("sample", np.zeros((4, 4, 3)), step=6)
        logger.log_histogram("weights", np.arange(20.0), step=7)
        run_id = logger.run_id
    assert run_id
    history, config, _ = read_complete_run(tmp_path, range(8))
    rows = {row["_step"]: row for row in history}
    assert set(range(8)) <= set(rows), history
    assert [rows[s]["loss"] for s in range(5)] == pytest.approx([1.0 / (s + 1) for s in range(5)])
    assert rows[4]["lr"] == 0.5
    assert rows[5]["note/_type"] == "html-file"
    [run_dir] = list((tmp_path / "wandb").glob("offline-run-*"))
    assert "<pre>a &lt; b</pre>" in (run_dir / "files" / rows[5]["note/path"]).read_text()
    assert rows[6]["sample/_type"] == "images/separated"
    assert (run_dir / "files" / rows[6]["sample/filenames"][0]).read_bytes()[:4] == b"\x89PNG"
    assert rows[7]["weights/max"] == 19.0
    assert rows[7]["weights/_type"] == "histogram"
    assert sum(rows[7]["weights/values"]) == 20
    assert config["lr"]["value"] == 1e-3 if isinstance(config["lr"], dict) else config["lr"] == 1e-3
    batch = config["batch_size"]
    assert (batch["value"] if isinstance(batch, dict) else batch) == 32


def test_process_one_starts_no_run(wandb_offline, tmp_path):
    with WandbLogger("demo", project="substrax-tests", log_dir=tmp_path, process_index=1) as logger:
        logger.log_scalar("loss", 1.0, step=0)
    assert logger.run_id is None
    assert not (tmp_path / "wandb").exists()


def test_missing_wandb_fails_at_construction_with_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"uv add 'substrax-tracking\[wandb\]'"):
        WandbLogger("demo", project="p", log_dir=tmp_path)


def test_missing_sdks_fail_at_construction(monkeypatch, tmp_path):
    from substrax.callbacks import ProgressCallback
    from substrax.tracking import TensorBoardLogger

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r"substrax-tracking\[tensorboard\]"):
        TensorBoardLogger("demo", tmp_path)
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    with pytest.raises(ImportError, match=r"substrax-tracking\[rich\]"):
        ProgressCallback()


@pytest.mark.usefixtures("child_processes")
def test_a_logger_never_closed_hands_its_records_to_wandb_at_exit(
    wandb_offline, read_complete_run, tmp_path
):
    code = (
        "from substrax.tracking import WandbLogger\n"
        f"logger = WandbLogger('exit', project='substrax-tests', log_dir={str(tmp_path)!r})\n"
        "for step in range(50):\n"
        "    logger.log_scalar('loss', float(step), step=step)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    history, _, _ = read_complete_run(tmp_path, range(50))
    assert sorted(row["_step"] for row in history if "loss" in row) == list(range(50))


def test_log_model_and_artifact_reach_the_offline_run(wandb_offline, wandb_runs, tmp_path):
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    with WandbLogger("art", project="substrax-tests", log_dir=tmp_path / "logs") as logger:
        logger.log_model(model, metadata={"epochs": 3})
        logger.log_artifact(model)
        with pytest.raises(FileNotFoundError, match="missing"):
            logger.log_model(tmp_path / "missing")
    [run_dir] = list((tmp_path / "logs" / "wandb").glob("offline-run-*"))

    def artifacts(runs):
        return [
            (record.artifact.name, record.artifact.type, json.loads(record.artifact.metadata))
            for records in runs
            for kind, record in records
            if kind == "artifact"
        ]

    runs = wandb_runs.wait(tmp_path / "logs", artifacts)
    assert artifacts(runs) == [("art-model", "model", {"epochs": 3})]
    assert (run_dir / "files" / "model.bin").read_bytes() == b"weights"


def test_log_artifact_puts_files_under_their_artifact_path(wandb_offline, tmp_path):
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "a.txt").write_text("a")
    (tmp_path / "out" / "sub" / "b.txt").write_text("b")
    (tmp_path / "link.txt").symlink_to(tmp_path / "out" / "a.txt")
    with WandbLogger("art", project="substrax-tests", log_dir=tmp_path / "logs") as logger:
        logger.log_artifact(tmp_path / "out" / "a.txt", artifact_path="ckpt")
        logger.log_artifact(tmp_path / "link.txt", artifact_path="links")
        logger.log_artifact(tmp_path / "out", artifact_path="eval/all")
        logger.log_artifact(tmp_path / "out" / "sub" / "b.txt")
        for outside in ("../up", "/abs"):
            with pytest.raises(ValueError, match="must be a relative path inside the run"):
                logger.log_artifact(tmp_path / "out", artifact_path=outside)
    [run_dir] = list((tmp_path / "logs" / "wandb").glob("offline-run-*"))
    files = run_dir / "files"
    assert (files / "ckpt" / "a.txt").read_text() == "a"
    assert (files / "eval" / "all" / "a.txt").read_text() == "a"
    assert (files / "eval" / "all" / "sub" / "b.txt").read_text() == "b"
    assert (files / "b.txt").read_text() == "b"
    assert (files / "links" / "link.txt").read_text() == "a"  # a link keeps its own name
    assert not (files / "a.txt").exists()  # artifact_path was ignored
    (tmp_path / "out" / "a.txt").write_text("rewritten")  # W&B only linked to the file
    assert (files / "ckpt" / "a.txt").read_text() == "a"
    assert not (files / "ckpt" / "a.txt").is_symlink()


def test_online_settings_are_bounded_unless_the_user_chose(monkeypatch):
    import wandb

    from substrax.tracking._wandb_sink import bounded_settings

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "300")
    chosen = bounded_settings(None, None, 7.0)
    assert chosen["login_timeout"] == 7.0
    assert chosen["x_graphql_timeout_seconds"] == 7.0
    assert "init_timeout" not in chosen  # the user's WANDB_INIT_TIMEOUT stands
    assert bounded_settings({"login_timeout": 60}, None, 7.0)["login_timeout"] == 60
    settings = wandb.Settings(login_timeout=60)
    assert bounded_settings(settings, None, 7.0).login_timeout == 60
    assert bounded_settings(None, "offline", 7.0) is None
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert bounded_settings(None, None, 7.0) is None


def test_the_spool_records_the_server_and_a_replay_uses_it(wandb_offline, tmp_path, monkeypatch):
    from substrax.tracking._wandb_sink import sink_from_target

    logged_for = "http://127.0.0.1:18081"
    monkeypatch.setenv("WANDB_BASE_URL", logged_for)
    with WandbLogger("wb", project="p", log_dir=tmp_path, close_timeout=5) as logger:
        target = logger._sink.target()
    assert target["base_url"] == logged_for
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:18082")  # the replaying shell's
    assert sink_from_target(target)._init_options["settings"]["base_url"] == logged_for
    explicit = "http://127.0.0.1:18083"
    with WandbLogger(
        "wb2", project="p", log_dir=tmp_path, settings={"base_url": explicit}
    ) as logger:
        assert logger._sink.target()["base_url"] == explicit


def test_a_run_file_not_written_yet_or_cut_short_reads_as_its_records_so_far(
    wandb_offline, wandb_runs, tmp_path
):
    with WandbLogger("cut", project="substrax-tests", log_dir=tmp_path / "whole") as logger:
        for step in range(20):
            logger.log_scalar("loss", float(step), step=step)

    def exited(runs):
        return any(kind == "exit" for records in runs for kind, _ in records)

    [whole] = wandb_runs.wait(tmp_path / "whole", exited)
    [run_file] = (tmp_path / "whole" / "wandb").glob("offline-run-*/run-*.wandb")
    data = run_file.read_bytes()
    cut = tmp_path / "cut" / "wandb" / run_file.parent.name / run_file.name
    cut.parent.mkdir(parents=True)
    read = {}
    for size in (0, 3, 7, 20, len(data) // 2, len(data) - 1, len(data)):
        cut.write_bytes(data[:size])  # created, header half written, records cut anywhere
        [read[size]] = wandb_runs(tmp_path / "cut")
        assert read[size] == whole[: len(read[size])]
    assert read[0] == read[3] == read[7] == read[20] == []
    assert 0 < len(read[len(data) // 2]) < len(whole)
    assert len(read[len(data) - 1]) == len(whole) - 1
    assert read[len(data)] == whole


def test_a_step_below_one_already_logged_is_warned_about_not_dropped_silently(
    wandb_offline, tmp_path, caplog
):
    with (
        caplog.at_level("WARNING", logger="substrax.tracking"),
        WandbLogger("back", project="substrax-tests", log_dir=tmp_path) as logger,
    ):
        logger.log_scalars({"loss": 1.0}, step=5)
        logger.log_scalars({"loss": 2.0, "acc": 0.5}, step=3)
        logger.log_scalars({"loss": 3.0}, step=2)
    warnings = [r.getMessage() for r in caplog.records if "came after step" in r.getMessage()]
    assert len(warnings) == 1  # once
    assert "['acc', 'loss'] at step 3 came after step 5" in warnings[0]
    assert "drops this row" in warnings[0]


def test_a_key_logged_again_at_a_step_is_warned_about_once(
    wandb_offline, read_complete_run, tmp_path, caplog
):
    with (
        caplog.at_level("WARNING", logger="substrax.tracking"),
        WandbLogger("again", project="substrax-tests", log_dir=tmp_path) as logger,
    ):
        logger.log_scalars({"loss": 1.0}, step=1)
        logger.log_scalars({"acc": 0.5}, step=1)  # another key at the same step: one row
        logger.flush()
        logger.log_scalars({"loss": 2.0}, step=1)  # W&B keeps this one
        logger.log_scalars({"loss": 3.0}, step=2)
        logger.log_scalars({"loss": 4.0}, step=2)
    warnings = [r.getMessage() for r in caplog.records if "logged again" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "['loss'] logged again at step 1; W&B keeps the last value" in warnings[0]
    history, _, _ = read_complete_run(tmp_path, [1, 2])
    assert [(row["_step"], row.get("loss"), row.get("acc")) for row in history] == [
        (1, 2.0, 0.5),
        (2, 4.0, None),
    ]


def _value(item):
    """A config item as W&B writes it: the value, or ``{"value": ...}`` around it."""
    return item["value"] if isinstance(item, dict) and set(item) == {"value"} else item


def test_nested_hyperparameters_are_merged_key_by_key_with_the_config(
    wandb_offline, read_complete_run, tmp_path
):
    """Hostile finding: a second call's ``{"optimizer": {"b2": ...}}`` replaced ``optimizer``
    (b1 lost) in W&B's config, and a call replaced a mapping of ``config=`` alike; MLflow kept
    both keys."""
    with WandbLogger(
        "merge", project="substrax-tests", log_dir=tmp_path, config={"model": {"width": 64}}
    ) as logger:
        logger.log_hyperparams({"model": {"depth": 2}, "optimizer": {"b1": 0.9}})
        logger.log_hyperparams({"optimizer": {"b2": 0.99}, "lr": 0.1})
        logger.log_scalar("loss", 1.0, step=0)
    _, config, _ = read_complete_run(tmp_path, [0])
    assert _value(config["model"]) == {"width": 64, "depth": 2}
    assert _value(config["optimizer"]) == {"b1": 0.9, "b2": 0.99}
    assert _value(config["lr"]) == 0.1


def test_a_nan_hyperparameter_reaches_the_config_as_the_file_log_writes_it(
    wandb_offline, read_complete_run, tmp_path
):
    """A hostile review: W&B wrote a NaN config value as null (the file log writes "NaN",
    MLflow "nan"), so a NaN hyperparameter looked unset."""
    config = {"clip": float("inf"), "opt": {"eps": float("nan")}}
    with WandbLogger("nan", project="substrax-tests", log_dir=tmp_path, config=config) as logger:
        logger.log_hyperparams({"floor": -float("inf")})
        logger.log_scalar("loss", 1.0, step=0)
    _, written, _ = read_complete_run(tmp_path, [0])
    assert _value(written["clip"]) == float("inf")  # W&B keeps an infinity
    assert _value(written["opt"]) == {"eps": "NaN"}
    assert _value(written["floor"]) == -float("inf")


def test_a_hyperparameter_with_a_lone_surrogate_is_refused_at_the_call(wandb_offline, tmp_path):
    """Hostile finding: W&B took a string TensorBoard could never write (a lone surrogate)."""
    with pytest.raises(LoggedTypeError, match=r"hyperparameter 'opt\.note' must be a str"):
        WandbLogger("run", log_dir=tmp_path, config={"opt": {"note": "a\ud800"}})
    with WandbLogger("run", project="substrax-tests", log_dir=tmp_path) as logger:
        with pytest.raises(LoggedTypeError, match=r"hyperparameter 'note' must be a str"):
            logger.log_hyperparams({"note": "bad\ud800"})
        logger.log_hyperparams({"lr": 0.1})
    assert logger.delivered == 1


@pytest.mark.parametrize("name", ["_step", "_runtime", "_timestamp", "_wandb"])
def test_a_key_w_and_b_writes_itself_is_refused_at_the_call(
    wandb_offline, read_complete_run, tmp_path, name
):
    with WandbLogger("own", project="substrax-tests", log_dir=tmp_path) as logger:
        logger.log_scalar("loss", 1.0, step=3)
        for call in (
            lambda: logger.log_scalar(name, 7.0),
            lambda: logger.log_scalars({"acc": 0.5, name: 7.0}, step=4),
            lambda: logger.log_text(name, "x", step=4),
            lambda: logger.log_histogram(name, [1.0, 2.0], step=4),
        ):
            with pytest.raises(ReservedMetricNameError) as raised:
                call()
            assert isinstance(raised.value, ValueError)
            assert f"metric name {name!r} (at step " in str(raised.value)
            assert f"for example 'train{name}'" in str(raised.value)
        logger.log_scalar("loss", 2.0, step=5)
    history, _, _ = read_complete_run(tmp_path, [3, 5])
    assert [(row["_step"], row["loss"], "acc" in row) for row in history] == [
        (3, 1.0, False),
        (5, 2.0, False),
    ]


def test_a_multi_logger_refuses_a_key_w_and_b_writes_itself_before_any_logger_has_it(
    wandb_offline, tmp_path
):
    """Hostile finding: the file log before W&B kept the call W&B refused, so the retry the
    error suggests logged step 0 twice there."""
    files = FileLogger("run", tmp_path)
    wandb = WandbLogger("run", project="substrax-tests", log_dir=tmp_path)
    with MultiLogger([files, MultiLogger([wandb])]) as logger:  # nested: asked all the same
        with pytest.raises(ReservedMetricNameError):
            logger.log_scalars({"loss": 0.5, "_step": 3.0}, step=0)
        with pytest.raises(ReservedMetricNameError):
            logger.log_text("_wandb", "x", step=0)
        logger.log_scalars({"loss": 0.5, "train_step": 3.0}, step=0)
    assert read_scalars(files.metrics_jsonl) == {"loss": [(0, 0.5)], "train_step": [(0, 3.0)]}
    assert not files.text_jsonl.exists()


def test_a_refused_step_does_not_count_as_the_last_step_sent(wandb_offline, tmp_path, caplog):
    """Hostile finding: a row W&B refused for its step past 2**63 - 1 still set the last step
    sent, so every later row was warned about as dropped."""
    import time

    with (
        caplog.at_level("WARNING", logger="substrax.tracking"),
        WandbLogger("huge", project="substrax-tests", log_dir=tmp_path) as logger,
    ):
        logger.log_scalars({"ok": 1.0}, step=0)
        logger._delivery.submit(("loss", 1.0, 2**63, time.time()))  # as a wrapped counter would
        logger.log_scalars({"ok": 2.0}, step=5)
    assert "came after step" not in caplog.text
    assert "the backend refused metric 'loss' at step 9223372036854775808" in caplog.text


def test_rows_w_and_b_took_before_a_refusal_in_their_batch_are_not_sent_again(
    wandb_offline, read_complete_run, tmp_path, caplog
):
    """Hostile finding: W&B's ``Run.log`` takes a batch one row at a time, so when a row is
    refused the rows before it are already logged; the retry, one record at a time to find the
    refused one, logged them again (W&B dropped them as steps gone back, and this was warned)."""
    from substrax.tracking._records import Record
    from substrax.tracking._send import deliver_in_memory
    from substrax.tracking._wandb_sink import WandbSink

    sink = WandbSink(
        {"backend": "wandb", "run_id": "r"},
        {"project": "substrax-tests", "dir": str(tmp_path), "mode": "offline", "id": "r"},
    )
    records = [
        Record(kind="scalars", step=step, time=1.0, payload={"values": {"ok": float(step)}})
        for step in (0, 1, 2**63, 5)  # W&B refuses a step past 2**63 - 1
    ]
    refused = []
    with caplog.at_level("WARNING", logger="substrax.tracking"):
        sending, error = deliver_in_memory(
            records,
            {"backend": "wandb"},
            sink,
            lambda record, why: refused.append((record.step, why)),
        )
        sink.finish()
    assert error is None
    assert sorted(sending.delivered) == [0, 1, 3]
    assert [step for step, _ in refused] == [2**63]
    assert "came after step" not in caplog.text
    history, _, _ = read_complete_run(tmp_path, [0, 1, 5])
    assert [(row["_step"], row["ok"]) for row in history] == [(0, 0.0), (1, 1.0), (5, 5.0)]


def test_an_option_wandb_init_does_not_take_is_refused_at_construction(tmp_path):
    # hostile finding: 0.1.22's level= went on to wandb.init, which failed in the background;
    # the logger returned, and every record was set aside as refused
    with pytest.raises(TypeError, match="unexpected keyword argument 'level': neither it nor"):
        WandbLogger("run", "proj", log_dir=tmp_path, mode="offline", level=20)
    assert not list(tmp_path.iterdir())
