"""The loggers on a real full disk (a small tmpfs filled to its last byte): nothing is dropped.

Hostile findings 4 and 9: a spool write that fails killed MLflow's delivery thread for good, and
a file log's failed flush raised from ``log_scalars`` and dropped the lines it held.
"""

import json
import logging
import shutil
import threading

import numpy as np
import pytest

from substrax import tracking
from substrax.tracking import FileLogger, MLFlowLogger, read_scalars


@pytest.fixture
def thread_deaths(monkeypatch):
    """The threads that died of an uncaught exception during the test."""
    died = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    return died


def test_a_file_log_on_a_full_disk_keeps_its_lines_and_writes_them_in_order_once_there_is_room(
    small_disk, caplog
):
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    logger = FileLogger("run", small_disk.path, flush_every=0)  # every call writes its line
    logger.log_scalars({"loss": 0.0}, step=0)
    small_disk.fill()
    for step in range(1, 300):  # no call raises: the lines wait in memory
        logger.log_scalars({"loss": float(step), "acc": step / 300}, step=step)
    logger.flush()  # a flush that cannot write does not raise either
    warned = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(warned) == 1, caplog.text  # once, however many writes failed
    assert str(logger.metrics_jsonl) in warned[0] or str(logger.metrics_csv) in warned[0]
    small_disk.free()
    logger.log_scalar("loss", 300.0, step=300)  # the next write sends every line that waited
    logger.close()
    scalars = read_scalars(logger.metrics_jsonl)
    assert scalars["loss"] == [(step, float(step)) for step in range(301)]
    assert scalars["acc"] == [(step, step / 300) for step in range(1, 300)]
    rows = logger.metrics_csv.read_text().splitlines()
    assert rows[0] == "time,step,name,value"
    assert [row.split(",")[1:3] for row in rows[1:] if ",loss," in row] == [
        [str(step), "loss"] for step in range(301)
    ]


def test_closing_a_file_log_on_a_disk_still_full_says_which_lines_it_could_not_write(small_disk):
    logger = FileLogger("run", small_disk.path, flush_every=0)
    for step in range(5):
        logger.log_scalar("loss", float(step), step=step)
    small_disk.fill()
    for step in range(5, 105):
        logger.log_scalar("loss", float(step), step=step)
    with pytest.raises(tracking.FileLogWriteError) as raised:
        logger.close()
    error = raised.value
    assert isinstance(error, OSError)
    assert error.path in (logger.metrics_jsonl, logger.metrics_csv)
    assert error.lines > 0
    assert str(error.path) in str(error)
    assert logger.closed
    small_disk.free()
    # what was written before the disk filled is intact, and every line written is whole
    written = read_scalars(logger.metrics_jsonl)["loss"]
    assert written[:5] == [(step, float(step)) for step in range(5)]
    assert written == [(step, float(step)) for step in range(len(written))]
    assert len(written) + error.lines >= 105 or error.path == logger.metrics_csv
    assert not (small_disk.path / "run.log.lock").exists()  # the log is let go all the same


def test_mlflow_delivery_outlives_a_full_disk_and_delivers_every_record_once_there_is_room(
    small_disk, sqlite_uri, caplog, thread_deaths, wait_for
):
    from mlflow.tracking import MlflowClient

    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    database = small_disk.path / "mlflow.db"  # the store and the spool share the full disk
    shutil.copyfile(sqlite_uri.removeprefix("sqlite:///"), database)
    uri = f"sqlite:///{database}"
    logger = MLFlowLogger("full", tracking_uri=uri, log_dir=small_disk.path / "log")
    logger.log_scalar("loss", 0.0, step=0)
    assert logger.wait_delivered(60)
    small_disk.fill()
    for step in range(1, 4000):
        logger.log_scalar("loss", float(step), step=step)
    wait_for(lambda: logger._delivery.failures >= 2)  # the store failed, and a retry too
    assert thread_deaths == []
    assert logger._delivery._thread.is_alive()
    small_disk.free()
    assert logger.wait_delivered(120)  # delivered before close: nothing waits for it in memory
    client = MlflowClient(tracking_uri=uri)
    steps = sorted(m.step for m in client.get_metric_history(logger.run_id, "loss"))
    assert steps == list(range(4000))
    logger.close()
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    assert thread_deaths == []
    spool_warnings = [r for r in caplog.records if "could not write" in r.getMessage()]
    assert len(spool_warnings) == 1, caplog.text  # the full disk is reported once
    assert str(logger.spool_path) in spool_warnings[0].getMessage()
    assert not logger.spool_path.exists() or not [
        json.loads(line) for line in logger.spool_path.read_text().splitlines()
    ]


def test_tensorboard_events_wait_for_room_on_a_full_disk_and_are_written_once_each(
    small_disk, caplog
):
    """Before, tensorboardX's writer thread died on a full disk, its queue filled, and the next
    call waited forever; written from the calling thread, the error reached the training loop."""
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="the tensorboard package (dev dependency) reads the event files back",
    )
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    logger = tracking.TensorBoardLogger("run", small_disk.path, flush_secs=1e-9)  # every call
    logger.log_scalar("loss", 0.0, step=0)
    small_disk.fill()
    for step in range(1, 300):  # no call raises: the events wait in memory
        logger.log_scalar("loss", float(step), step=step)
    logger.flush()
    assert caplog.text.count("cannot write") == 1, caplog.text
    small_disk.free()
    logger.close()
    accumulator = event_accumulator.EventAccumulator(str(small_disk.path))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == [
        (step, float(step)) for step in range(300)
    ]


def test_tensorboard_hyperparameters_a_full_disk_refused_are_written_at_a_later_flush(
    small_disk, caplog
):
    """Hostile finding: log_hyperparams raised the OSError and left its temporary file."""
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="the tensorboard package (dev dependency) reads the event files back",
    )
    from tensorboard.plugins.hparams import plugin_data_pb2

    logger = tracking.TensorBoardLogger("run", small_disk.path)
    small_disk.fill()
    logger.log_hyperparams({"lr": 0.1})  # no error: warned, and kept for a later flush
    assert "cannot write its hyperparameters" in caplog.text
    assert not list(small_disk.path.glob("*.tmp"))
    small_disk.free()
    logger.close()
    accumulator = event_accumulator.EventAccumulator(str(small_disk.path))
    accumulator.Reload()
    contents = accumulator.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["lr"].number_value == pytest.approx(0.1)


def test_a_full_disk_and_a_dead_server_back_off_and_warn_once(small_disk, caplog, wall_clock):
    """Hostile finding: with no spool file (emptied before the disk filled) the sender called
    the missing spool a recovery at every pass: a "delivering again" warning each 55 ms."""
    from substrax.testing import free_port

    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    small_disk.fill()
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    logger = MLFlowLogger(
        "dead", tracking_uri=uri, log_dir=small_disk.path, connect_timeout=1, close_timeout=1
    )
    for step in range(10):
        logger.log_scalar("loss", float(step), step=step)
    wall_clock.sleep(3)
    assert 2 <= logger._delivery.failures <= 12  # backing off (0.05 s doubling to 2 s)
    logger.close()
    again = [r for r in caplog.records if "delivering again" in r.getMessage()]
    assert again == [], again[:3]


@pytest.mark.parametrize("which", ["file", "tensorboard"])
def test_a_logger_opened_on_a_full_disk_starts(small_disk, which):
    """Hostile finding: the pid written into the lock file raised a bare OSError (no path)."""
    small_disk.fill()
    if which == "file":
        logger = FileLogger("run", small_disk.path)
    else:
        pytest.importorskip("tensorboardX")
        logger = tracking.TensorBoardLogger("run", small_disk.path / "tb")
    logger.log_scalar("loss", 1.0, step=0)
    small_disk.free()
    logger.close()


def test_a_plot_or_image_a_full_disk_refuses_is_warned_about_and_leaves_no_empty_file(
    small_disk, caplog
):
    """A third pass: log_histogram raised the OSError of a full disk out of the call (a file log
    call never raises for a full disk) and left a 0-byte PNG, as a refused image did, and the
    plot's name stayed taken."""
    pytest.importorskip("matplotlib", reason="the plots extra writes PNGs")
    logger = FileLogger("run", small_disk.path, flush_every=0)
    logger.log_histogram("h", np.arange(10.0), step=0)
    logger.flush()
    small_disk.fill()
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        logger.log_histogram("h", np.random.default_rng(0).random(1000), step=1)
        logger.log_image("im", np.random.default_rng(0).random((64, 64)), step=1)
        logger.flush()
    assert "no PNG of histogram 'h' at step 1" in caplog.text
    assert "could not be written" in caplog.text
    media = [*(small_disk.path / "histograms").iterdir(), *(small_disk.path / "images").iterdir()]
    assert all(path.stat().st_size for path in media), media
    small_disk.free()
    logger.log_histogram("h", np.arange(10.0), step=1)
    logger.close()
    assert (small_disk.path / "histograms" / "run.h_step1.png").stat().st_size


def test_an_image_or_plot_whose_folder_a_full_disk_cannot_make_is_warned_about(small_disk, caplog):
    """A fourth pass: with no inode left, the first image or histogram of a run raised the disk's
    OSError out of the call, making its folder (images/, histograms/)."""
    pytest.importorskip("matplotlib", reason="the plots extra writes PNGs")
    logger = FileLogger("run", small_disk.path, flush_every=0)
    logger.log_scalar("loss", 1.0, step=0)
    logger.flush()
    small_disk.fill_inodes()
    with caplog.at_level(logging.WARNING, logger="substrax.tracking"):
        logger.log_image("im", np.zeros((4, 4)), step=1)
        logger.log_histogram("h", np.arange(10.0), step=1)
        logger.flush()
    assert "could not be written" in caplog.text
    assert "no PNG of histogram 'h' at step 1" in caplog.text
    small_disk.free()
    logger.log_image("im", np.zeros((4, 4)), step=2)
    logger.close()
    assert [path.name for path in (small_disk.path / "images").iterdir()] == ["run.im_step2.png"]
