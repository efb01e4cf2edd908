"""What a backend can never store: refused at the call, or set aside alone while the rest arrives.

Hostile findings 5 and 10, against a real MLflow SQLite store: a step of 2**63 or more (a
wrapped uint64 counter) was taken by every logger, then MLflow's "Python int too large" was
retried as if the store were down, holding back every later record (and a replay of it); a key
MLflow refuses took the valid keys logged in the same call with it.
"""

import io
import json
import logging
import time

import numpy as np
import pytest

from substrax import tracking
from substrax.tracking import (
    ConsoleLogger,
    FileLogger,
    MLFlowLogger,
    MultiLogger,
    read_scalars,
    replay_spool,
)
from substrax.tracking._records import Record
from substrax.tracking._spool import SpoolFile


pytest.importorskip("mlflow", reason="the mlflow extra is needed for MLFlowLogger")
from mlflow.tracking import MlflowClient


def history(uri, run_id, key):
    return sorted(
        (m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    )


def refused_lines(path):
    refused = path.with_name(path.name + ".refused")
    return (
        [json.loads(line) for line in refused.read_text().splitlines()] if refused.exists() else []
    )


def _calls(logger, step):
    """Each logging call at ``step``, by name, with what its refusal names as logged."""
    return {
        "log_scalar": (lambda: logger.log_scalar("loss", 0.5, step=step), "scalar 'loss'"),
        "log_scalars": (
            lambda: logger.log_scalars({"loss": 0.5, "acc": 1.0}, step=step),
            "scalars 'loss', 'acc'",
        ),
        "log_metrics": (lambda: logger.log_metrics({"loss": 0.5}, step=step), "scalars 'loss'"),
        "log_text": (lambda: logger.log_text("note", "x", step=step), "text 'note'"),
        "log_histogram": (
            lambda: logger.log_histogram("w", [1.0, 2.0], step=step),
            "histogram 'w'",
        ),
        "log_image": (lambda: logger.log_image("img", np.zeros((2, 2)), step=step), "image 'img'"),
    }


@pytest.mark.parametrize(
    ("step", "shown"),
    [
        (2**63, "9223372036854775808"),
        (2**64 - 1, "18446744073709551615"),  # a uint64 counter wrapped below zero
        (np.uint64(2**63 + 5), "9223372036854775813"),
        (-1, "-1"),
    ],
)
def test_a_step_no_backend_can_store_is_refused_at_the_call_by_every_logger(
    tmp_path, sqlite_uri, step, shown
):
    files = FileLogger("run", tmp_path / "files", flush_every=0)
    console = ConsoleLogger("run", stream=io.StringIO())
    mlflow = MLFlowLogger("refused-steps", tracking_uri=sqlite_uri, log_dir=tmp_path / "ml")
    multi = MultiLogger([FileLogger("multi", tmp_path / "multi", flush_every=0)])
    for logger in (files, console, mlflow, multi):
        for call, (log, logged) in _calls(logger, step).items():
            with pytest.raises(tracking.InvalidStepError) as raised:
                log()
            error = raised.value
            assert isinstance(error, ValueError), call
            assert error.step == step
            message = str(error)
            assert shown in message, message
            assert f"(logging {logged})" in message, message
            assert "2**63 - 1" in message  # what a step must be
        logger.log_scalar("loss", 0.25, step=2**63 - 1)  # the largest step there is
        logger.close()
    assert read_scalars(files.metrics_jsonl) == {"loss": [(2**63 - 1, 0.25)]}
    assert history(sqlite_uri, mlflow.run_id, "loss") == [(2**63 - 1, 0.25)]
    assert not mlflow.spool_path.exists()
    assert refused_lines(mlflow.spool_path) == []


@pytest.mark.parametrize("step", [1.5, "3", True])
def test_a_step_that_is_not_an_integer_is_refused_at_the_call_naming_it(tmp_path, step):
    with FileLogger("run", tmp_path, flush_every=0) as logger:
        with pytest.raises(tracking.InvalidStepError) as raised:
            logger.log_scalar("loss", 0.5, step=step)
        assert isinstance(raised.value, TypeError)
        assert repr(step) in str(raised.value)
        logger.log_scalar("loss", 0.5, step=np.int64(7))  # a numpy integer is an integer
    assert read_scalars(logger.metrics_jsonl) == {"loss": [(7, 0.5)]}


def test_a_record_mlflow_refuses_for_good_is_set_aside_and_every_later_record_arrives(
    tmp_path, sqlite_uri, caplog
):
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    logger = MLFlowLogger("wrapped", tracking_uri=sqlite_uri, log_dir=tmp_path, close_timeout=60)
    for step in range(100):
        logger.log_scalar("loss", float(step), step=step)
    # as a logger that let a wrapped counter through would have queued it
    logger._delivery.submit(("loss", 1.0, 2**63, time.time()))
    for step in range(100, 300):
        logger.log_scalar("loss", float(step), step=step)
    assert logger.wait_delivered(60)
    logger.close()
    assert history(sqlite_uri, logger.run_id, "loss") == [(s, float(s)) for s in range(300)]
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    assert not logger.spool_path.exists()
    [refused] = refused_lines(logger.spool_path)
    assert refused["record"]["step"] == 2**63
    assert "too large" in refused["error"]


def test_a_replay_sets_aside_a_record_mlflow_refuses_for_good_and_delivers_the_rest(
    tmp_path, sqlite_uri
):
    client = MlflowClient(tracking_uri=sqlite_uri)
    experiment = client.create_experiment(f"replay-wrapped-{time.time_ns()}")
    run_id = client.create_run(experiment).info.run_id
    target = {"backend": "mlflow", "tracking_uri": sqlite_uri, "run_id": run_id}
    spool = SpoolFile(tmp_path / "run.spool.jsonl")

    def scalar(step, value):
        return Record(
            kind="scalars",
            step=step,
            time=1.0 + step % 1000,
            payload={"values": {"loss": value}},
            materialized=True,
        )

    # the bad record comes first, as a wrapped counter's first step would
    spool.append(target, [scalar(2**63, -1.0), *(scalar(s, float(s)) for s in range(299))])
    result = replay_spool(spool.path, timeout=120)
    assert (result.delivered, result.refused, result.remaining) == (299, 1, 0)
    assert history(sqlite_uri, run_id, "loss") == [(s, float(s)) for s in range(299)]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert not spool.path.exists()
    [refused] = refused_lines(spool.path)
    assert refused["record"]["step"] == 2**63


def test_a_key_mlflow_refuses_sets_aside_only_itself_not_the_keys_logged_with_it(
    tmp_path, sqlite_uri
):
    logger = MLFlowLogger("keys", tracking_uri=sqlite_uri, log_dir=tmp_path, close_timeout=60)
    for step in range(5):
        logger.log_metrics({"ok": float(step), "bad key!": 1.0, "also_ok": -float(step)}, step=step)
    assert logger.wait_delivered(60)
    logger.close()
    assert history(sqlite_uri, logger.run_id, "ok") == [(s, float(s)) for s in range(5)]
    assert history(sqlite_uri, logger.run_id, "also_ok") == [(s, -float(s)) for s in range(5)]
    refused = refused_lines(logger.spool_path)
    assert [line["record"]["payload"]["values"] for line in refused] == [{"bad key!": 1.0}] * 5
    assert [line["record"]["step"] for line in refused] == list(range(5))
    assert all(
        "INVALID_PARAMETER_VALUE" in line["error"] or "Invalid" in line["error"] for line in refused
    )


def test_a_replay_sets_aside_only_the_refused_key_of_a_spooled_record(tmp_path, sqlite_uri):
    client = MlflowClient(tracking_uri=sqlite_uri)
    experiment = client.create_experiment(f"replay-keys-{time.time_ns()}")
    run_id = client.create_run(experiment).info.run_id
    target = {"backend": "mlflow", "tracking_uri": sqlite_uri, "run_id": run_id}
    spool = SpoolFile(tmp_path / "run.spool.jsonl")
    spool.append(
        target,
        [
            Record(
                kind="scalars",
                step=step,
                time=float(step),
                payload={"values": {"ok": float(step), "bad key!": 2.0}},
                materialized=True,
            )
            for step in range(3)
        ],
    )
    result = replay_spool(spool.path, timeout=120)
    assert (result.delivered, result.refused, result.remaining) == (3, 3, 0)
    assert history(sqlite_uri, run_id, "ok") == [(0, 0.0), (1, 1.0), (2, 2.0)]
    refused = refused_lines(spool.path)
    assert [line["record"]["payload"]["values"] for line in refused] == [{"bad key!": 2.0}] * 3
    assert not spool.path.exists()


def test_a_replay_never_creates_the_missing_directory_of_a_sqlite_store(tmp_path, capsys):
    from substrax.tracking._cli import main

    gone = tmp_path / "gone" / "x"
    uri = f"sqlite:///{gone}/y.db"
    target = {"backend": "mlflow", "tracking_uri": uri, "run_id": "abc"}
    spool = SpoolFile(tmp_path / "run.spool.jsonl")
    spool.append(target, [Record(kind="scalars", step=1, time=1.0, payload={"values": {"a": 1.0}})])
    assert main(["replay", str(spool.path), "--timeout", "60"]) == 1
    [error] = capsys.readouterr().err.splitlines()
    assert f"the directory {str(gone)!r} of the store {uri} does not exist" in error
    assert not (tmp_path / "gone").exists()
    assert len(spool.read_lines()) == 1  # the record stays in the spool


def test_include_refused_keeps_a_refused_line_that_is_not_a_record(tmp_path, caplog):
    spool = tmp_path / "only.spool.jsonl"
    refused = tmp_path / "only.spool.jsonl.refused"
    refused.write_text('junk\n{"target": {"backend": "mlflow"}, "rec\n')
    with caplog.at_level(logging.WARNING):
        result = replay_spool(spool, include_refused=True, timeout=60)
    assert result.delivered == 0
    assert not refused.exists()
    bad = tmp_path / "only.spool.jsonl.bad"
    assert bad.read_text() == 'junk\n{"target": {"backend": "mlflow"}, "rec\n'
    assert f"2 lines of {refused} are not records; they are moved to {bad}" in caplog.text


@pytest.mark.parametrize("logger", ["file", "tensorboard", "mlflow", "mlflow-store"])
def test_a_file_where_the_log_directory_should_be_is_refused_at_construction_naming_it(
    tmp_path, sqlite_uri, logger
):
    """Hostile finding: a file as log_dir was a bare FileExistsError (file log), a
    NotADirectoryError (TensorBoard), or, for MLflow, records lost at close behind messages
    that blamed a full disk; a store path that is a directory held MLflow's constructor for
    about 100 s of its own retries."""
    not_a_dir = tmp_path / "not_a_dir"
    not_a_dir.write_text("")
    makers = {
        "file": lambda: FileLogger("run", not_a_dir),
        "tensorboard": lambda: tracking.TensorBoardLogger("run", not_a_dir),
        "mlflow": lambda: MLFlowLogger("run", tracking_uri=sqlite_uri, log_dir=not_a_dir),
    }
    if logger == "mlflow-store":
        (tmp_path / "store.db").mkdir()
        uri = f"sqlite:///{tmp_path / 'store.db'}"
        makers[logger] = lambda: MLFlowLogger("run", tracking_uri=uri, log_dir=tmp_path / "logs")
    elif logger == "tensorboard":
        pytest.importorskip("tensorboardX", reason="the tensorboard extra is needed")
    started = time.monotonic()
    with pytest.raises(tracking.LogDirNotWritableError) as raised:
        makers[logger]()
    assert time.monotonic() - started < 10
    assert isinstance(raised.value, PermissionError)
    message = str(raised.value)
    if logger == "mlflow-store":
        assert f"'{tmp_path}'" in message
        assert "its MLflow database 'store.db' is a directory, not a file" in message
    else:
        assert f"'{not_a_dir}' (a file is in its place)" in message
    assert "WANDB_DIR" not in message  # W&B's own hint, only on W&B's error


@pytest.mark.parametrize("logger", ["file", "console", "tensorboard", "mlflow"])
def test_a_call_with_one_bad_value_writes_none_of_its_values(tmp_path, sqlite_uri, logger):
    """Hostile finding: the file log and TensorBoard kept the good keys of a call that raised,
    the other loggers none; and a numpy complex was written as its real part."""
    out = io.StringIO()
    if logger == "tensorboard":
        pytest.importorskip("tensorboardX", reason="the tensorboard extra is needed")
    made = {
        "file": lambda: FileLogger("run", tmp_path),
        "console": lambda: ConsoleLogger("run", stream=out),
        "tensorboard": lambda: tracking.TensorBoardLogger("run", tmp_path),
        "mlflow": lambda: MLFlowLogger("run", tracking_uri=sqlite_uri, log_dir=tmp_path),
    }[logger]()
    with made:  # each error names the key and the step, in every logger
        with pytest.raises(tracking.LoggedTypeError, match=r"'bad' must be .*\(at step 0\)$"):
            made.log_scalars({"ok": 1.0, "bad": "x"}, step=0)
        with pytest.raises(tracking.LoggedTypeError, match=r"'z' must .*complex.*\(at step 1\)$"):
            made.log_scalars({"ok": 2.0, "z": np.complex64(1 + 2j)}, step=1)
        for text in (np.array("1"), np.array(["2"]), np.array(b"3")):  # float() would parse them
            with pytest.raises(tracking.LoggedTypeError, match=r"'s' must .*an array of [<|]"):
                made.log_scalar("s", text, step=1)
        with pytest.raises(tracking.MetricOverflowError, match=r"'big' = .* \(at step 1\) is"):
            made.log_scalar("big", 10**400, step=1)
        made.log_scalar("ok", 3.0, step=2)
    if logger == "file":
        assert read_scalars(tmp_path / "run.metrics.jsonl") == {"ok": [(2, 3.0)]}
    elif logger == "console":
        assert out.getvalue().splitlines() == ["[run] step       2 | ok          3"]
    elif logger == "tensorboard":
        from tensorboard.backend.event_processing import event_accumulator

        accumulator = event_accumulator.EventAccumulator(str(tmp_path))
        accumulator.Reload()
        assert accumulator.Tags()["scalars"] == ["ok"]
        assert [(e.step, e.value) for e in accumulator.Scalars("ok")] == [(2, 3.0)]
    else:
        assert history(sqlite_uri, made.run_id, "ok") == [(2, 3.0)]


def test_a_text_mlflow_cannot_encode_is_set_aside_not_retried_for_ever(tmp_path, sqlite_uri):
    """Hostile finding: a lone surrogate in a hyperparameter (or a text, now refused at the
    call) was retried as if the store were down; nothing after it arrived, close waited its
    whole timeout and the run stayed RUNNING."""
    surrogate = "bad \ud800"
    logger = MLFlowLogger("surrogate", tracking_uri=sqlite_uri, log_dir=tmp_path, close_timeout=60)
    with pytest.raises(tracking.LoggedTypeError, match="hyperparameter 'note'"):
        logger.log_hyperparams({"note": surrogate})  # refused at the call since
    # as a spool of an earlier version holds it
    logger._submit("hyperparams", None, {"params": {"note": surrogate}}, materialized=True)
    for step in range(3):
        logger.log_scalar("loss", float(step), step=step)
    logger.log_hyperparams({"lr": 0.1})
    assert logger.wait_delivered(60)
    logger.close()
    run = MlflowClient(tracking_uri=sqlite_uri).get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1"}
    assert history(sqlite_uri, logger.run_id, "loss") == [(0, 0.0), (1, 1.0), (2, 2.0)]
    refused = refused_lines(logger.spool_path)
    assert [line["record"]["kind"] for line in refused] == ["hyperparams"]
    assert all("surrogates not allowed" in line["error"] for line in refused)


@pytest.mark.parametrize("logger", ["file", "console", "mlflow"])
def test_a_name_or_text_no_backend_can_hold_is_refused_at_the_call(tmp_path, sqlite_uri, logger):
    """Hostile finding: text, image and histogram names were not checked as metric names are
    (None, "" and a lone surrogate reached each backend, which failed its own way), and a text
    holding a lone surrogate was written by one logger and refused later by another."""
    made = {
        "file": lambda: FileLogger("run", tmp_path),
        "console": lambda: ConsoleLogger("run", stream=io.StringIO()),
        "mlflow": lambda: MLFlowLogger("run", tracking_uri=sqlite_uri, log_dir=tmp_path),
    }[logger]()
    with made:
        for bad in (None, ""):
            with pytest.raises(tracking.EmptyMetricNameError):
                made.log_text(bad, "x", step=0)
            with pytest.raises(tracking.EmptyMetricNameError):
                made.log_image(bad, np.zeros((2, 2)), step=0)
            with pytest.raises(tracking.EmptyMetricNameError):
                made.log_histogram(bad, [1.0, 2.0], step=0)
        with pytest.raises(tracking.LoggedTypeError, match="'bad\\\\ud800'"):
            made.log_histogram("bad\ud800", [1.0], step=0)
        with pytest.raises(tracking.LoggedTypeError, match=r"text 'note' must be a str that UTF-8"):
            made.log_text("note", "bad \ud800", step=0)
        made.log_text("note", "fine", step=1)


@pytest.mark.parametrize("logger", ["file", "console", "tensorboard", "mlflow", "wandb"])
def test_a_name_too_long_for_the_files_named_after_it_is_refused_at_construction(
    tmp_path, monkeypatch, logger
):
    """Hostile finding 2: past 255 bytes a spool file's name failed in the sender thread (every
    record lost), at 236 characters no replay could lock the spool, and the file log and
    TensorBoard (at log_hyperparams) raised a bare OSError. Now one bound for every logger."""
    from substrax.tracking._paths import NAME_MOST

    if logger == "tensorboard":
        pytest.importorskip("tensorboardX", reason="the tensorboard extra is needed")
    if logger == "wandb":
        pytest.importorskip("wandb", reason="the wandb extra is needed")
        monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "out"
    monkeypatch.setenv("AVITAI_OUTPUT_DIR", str(out))  # MLflow's default log_dir: out/<name>
    make = {
        "file": lambda name: FileLogger(name, out),
        "console": lambda name: ConsoleLogger(name, stream=io.StringIO()),
        "tensorboard": lambda name: tracking.TensorBoardLogger(name, out),
        "mlflow": lambda name: MLFlowLogger(name, tracking_uri=f"sqlite:///{out}/mlflow.db"),
        "wandb": lambda name: tracking.WandbLogger(name, log_dir=out, mode="offline"),
    }[logger]
    for name in ("n" * (NAME_MOST + 1), "n" * 300, "é" * (NAME_MOST // 2 + 1)):
        with pytest.raises(tracking.InvalidLoggerNameError) as raised:
            make(name)
        assert isinstance(raised.value, ValueError)
        size = len(name.encode())
        assert str(raised.value) == (
            f"name={name[:19]!r}...{name[-9:]!r} ({size} bytes) is too long: a file named after "
            "it would pass 255 bytes, the most a file system allows in one name; give a name of "
            f"at most {NAME_MOST} bytes (UTF-8)"
        ).replace("'...'", "...")
    assert not out.exists()  # nothing made before the refusal


def test_a_name_of_the_most_bytes_allowed_fits_the_longest_files_named_after_it(
    tmp_path, sqlite_uri
):
    from substrax.tracking._paths import NAME_MOST

    name = "n" * NAME_MOST
    options = {"all_processes": True, "process_index": 999999, "flush_every": 0}
    with FileLogger(name, tmp_path, **options) as logger:
        logger.log_histogram("w", [1.0, 2.0], step=2)
        logger.log_scalar("loss", 1.0, step=2)
    with FileLogger(name, tmp_path, resume_step=1, **options) as logger:  # rewrites each log
        logger.log_scalar("loss", 0.5, step=2)
    assert logger.dropped_records == 2  # .<name>.p999999.histograms.jsonl.<hex>.tmp: 255 bytes
    assert read_scalars(logger.metrics_jsonl) == {"loss": [(2, 0.5)]}
    client = MlflowClient(tracking_uri=sqlite_uri)
    run_id = client.create_run(client.create_experiment(f"long-{time.time_ns()}")).info.run_id
    target = {"backend": "mlflow", "tracking_uri": sqlite_uri, "run_id": run_id}
    spool = SpoolFile(tmp_path / f"{name}.p999999.spool.jsonl")  # a remote logger's, alike
    spool.append(target, [Record(kind="scalars", step=1, time=1.0, payload={"values": {"a": 1.0}})])
    assert replay_spool(spool.path, timeout=60).delivered == 1
    assert history(sqlite_uri, run_id, "a") == [(1, 1.0)]


@pytest.mark.parametrize("spool", ["a directory", "under a file", "too long a name"])
def test_a_spool_path_that_cannot_be_a_spool_file_is_refused_at_construction_naming_it(
    tmp_path, sqlite_uri, spool
):
    """Hostile finding 3: a directory as spool_path was taken, and at close its records were
    "lost; make room on its file system", MLflow getting none of them."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    path, reason = {
        "a directory": (tmp_path / "dir", "it is a directory"),
        "under a file": (
            tmp_path / "file" / "run.spool.jsonl",
            "its directory cannot be written: a file is in its place",
        ),
        "too long a name": (tmp_path / ("s" * 234), "its name is longer than 233 bytes"),
    }[spool]
    logs = tmp_path / "logs"
    with pytest.raises(tracking.InvalidSpoolPathError) as raised:
        MLFlowLogger("run", tracking_uri=sqlite_uri, log_dir=logs, spool_path=path)
    assert isinstance(raised.value, ValueError)
    assert str(raised.value).startswith(
        f"MLFlowLogger: spool_path={str(path)!r} cannot be the spool file ({reason}); pass the "
    )
    assert not logs.exists()


def _make_logger(kind, tmp_path, sqlite_uri):
    """A FileLogger, ConsoleLogger, TensorBoardLogger, MLFlowLogger or MultiLogger of two."""
    if kind in ("tensorboard", "multi"):
        pytest.importorskip("tensorboardX", reason="the tensorboard extra is needed")
    return {
        "file": lambda: FileLogger("run", tmp_path),
        "console": lambda: ConsoleLogger("run", stream=io.StringIO()),
        "tensorboard": lambda: tracking.TensorBoardLogger("run", tmp_path),
        "mlflow": lambda: MLFlowLogger("run", tracking_uri=sqlite_uri, log_dir=tmp_path),
        "multi": lambda: MultiLogger(
            [FileLogger("run", tmp_path), tracking.TensorBoardLogger("run", tmp_path / "tb")]
        ),
    }[kind]()


@pytest.mark.parametrize("logger", ["file", "console", "tensorboard", "mlflow"])
def test_hyperparameters_holding_themselves_are_refused_at_the_call(tmp_path, sqlite_uri, logger):
    """Hostile finding: a dict inside itself raised RecursionError (console: 'Circular reference
    detected'), naming nothing."""
    made = _make_logger(logger, tmp_path, sqlite_uri)
    params: dict[str, object] = {"lr": 0.1, "layers": [2, 3]}
    params["nested"] = {"again": params}
    with made:
        with pytest.raises(ValueError, match=r"a dict holds itself \(a cycle\)"):
            made.log_hyperparams(params)
        with pytest.raises(ValueError, match=r"the keys \[1, '1'\] are one name"):
            made.log_hyperparams({1: 2, "1": 3})
        made.log_hyperparams({"lr": 0.1, "shared": [params["layers"], params["layers"]]})


@pytest.mark.parametrize("logger", ["file", "console", "tensorboard", "mlflow", "multi"])
def test_a_hyperparameter_no_backend_can_hold_is_refused_at_the_call_by_every_logger(
    tmp_path, sqlite_uri, logger
):
    """Hostile finding: a lone surrogate in a hyperparameter broke TensorBoardLogger for good
    (UnicodeEncodeError at that call, every later one and close) while the file log, the
    console and W&B took it; through a MultiLogger the file log had it when TensorBoard raised.
    (W&B's: test_tracking_wandb.)"""
    made = _make_logger(logger, tmp_path, sqlite_uri)
    with made:
        for params, key in [
            ({"note": "bad\ud800"}, "note"),
            ({"opt": {"names": ["adam", "\udc80"]}}, "opt.names"),
            ({"opt": {"bad\ud800": 1}}, "opt.bad\\\\ud800"),
        ]:
            with pytest.raises(tracking.LoggedTypeError, match=f"hyperparameter '{key}' must be"):
                made.log_hyperparams(params)
        made.log_hyperparams({"lr": 0.1})  # the logger goes on
    if logger in ("file", "multi"):  # nothing of the refused calls kept
        assert json.loads((tmp_path / "run.hparams.json").read_text()) == {"lr": 0.1}


@pytest.mark.parametrize("kind", ["text", "histogram", "image"])
def test_media_named_dot_or_dot_dot_is_kept_inside_its_folder_and_holds_back_nothing(
    tmp_path, sqlite_uri, kind
):
    """Hostile finding: MLflow refused an image named "." or ".." ("Invalid artifact path"),
    which was retried as if the store were down: the records before it in its batch never
    arrived, close waited its whole timeout and the run stayed RUNNING; a text or histogram
    named ".." was stored at the artifact root, outside text/."""
    logger = MLFlowLogger("dots", tracking_uri=sqlite_uri, log_dir=tmp_path, close_timeout=60)
    logger.log_scalar("loss", 1.0, step=0)
    for name in (".", ".."):
        if kind == "text":
            logger.log_text(name, f"text {name}", step=1)
        elif kind == "histogram":
            logger.log_histogram(name, [1.0, 2.0], step=1)
        else:
            logger.log_image(name, np.zeros((2, 2), np.uint8), step=1)
    logger.log_scalar("loss", 2.0, step=2)
    assert logger.wait_delivered(60)
    logger.close()
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    assert history(sqlite_uri, logger.run_id, "loss") == [(0, 1.0), (2, 2.0)]
    folder = {"text": "text", "histogram": "histograms", "image": "images"}[kind]
    assert [a.path for a in client.list_artifacts(logger.run_id)] == [folder]
    inside = sorted(a.path for a in client.list_artifacts(logger.run_id, folder))
    assert len(inside) == 2
    assert all(path.startswith((f"{folder}/.-", f"{folder}/..-")) for path in inside), inside
    refused = refused_lines(logger.spool_path)
    if kind == "histogram":  # MLflow refuses the metric "./min", as it does log_scalar's
        assert [line["record"]["payload"]["name"] for line in refused] == [".", ".."]
        assert all("Invalid value" in line["error"] for line in refused)
    else:
        assert not refused


def test_an_artifact_path_mlflow_would_normalize_is_uploaded_where_it_points(tmp_path, sqlite_uri):
    """An ``artifact_path`` of ``models/`` or ``./eval`` failed MLflow's check ("Invalid
    artifact path"), which was retried as if the store were down, as an image named "." was."""
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    with MLFlowLogger("paths", tracking_uri=sqlite_uri, log_dir=tmp_path, close_timeout=60) as lg:
        lg.log_artifact(model, "models/")
        lg.log_artifact(model, "./eval//plots")
        lg.log_artifact(model, ".")
        lg.log_scalar("loss", 1.0, step=0)
        assert lg.wait_delivered(60)
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert client.get_run(lg.run_id).info.status == "FINISHED"
    found = {
        a.path
        for root in (None, "models", "eval/plots")
        for a in client.list_artifacts(lg.run_id, root)
    }
    assert {"model.bin", "models/model.bin", "eval/plots/model.bin"} <= found


def test_a_bad_request_is_a_refusal_only_when_mlflow_itself_answered_it():
    """Second-pass finding: a proxy's plain 400 page in front of the server (MLflow makes it a
    BAD_REQUEST MlflowException) set every record aside as refused; it is retried now."""
    from mlflow.exceptions import MlflowException, RestException
    from mlflow.protos.databricks_pb2 import BAD_REQUEST

    from substrax.tracking._mlflow_sink import MlflowSink

    server = RestException({"error_code": "BAD_REQUEST", "message": "Invalid artifact path"})
    proxy = MlflowException(
        "API request to endpoint /api/2.0/mlflow/runs/log-batch failed with error code 400 != "
        "200. Response body: '<html>proxy says no</html>'",
        error_code=BAD_REQUEST,  # as MLflow makes a 400 that is no MLflow answer
    )
    assert proxy.error_code == "BAD_REQUEST"
    assert MlflowSink.is_permanent(server)
    assert not MlflowSink.is_permanent(proxy)
