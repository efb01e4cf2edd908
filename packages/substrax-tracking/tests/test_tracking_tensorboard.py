import io
import json
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from substrax.tracking import FileLogger, TensorBoardLogger


event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard package (dev dependency) reads the event files back",
)


def test_event_files_read_back_with_tensorboards_reader(tmp_path):
    with TensorBoardLogger("run", tmp_path) as logger:
        logger.log_hyperparams({"lr": 1e-3, "layers": [2, 3], "opt": "adam"})
        for step in range(3):
            logger.log_scalars({"loss": 1.0 / (step + 1), "acc": step / 3}, step=step)
        logger.log_metrics({"lr": 0.5}, step=3)
        logger.log_text("note", "hello", step=1)
        logger.log_image("img", np.random.default_rng(0).random((6, 7, 3)), step=2)
        logger.log_image("gray", np.zeros((4, 4), dtype=np.uint8), step=2)
        logger.log_histogram("weights", np.arange(50.0), step=1)
    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0}
    )
    accumulator.Reload()
    tags = accumulator.Tags()
    assert {"loss", "acc", "lr"} <= set(tags["scalars"])
    loss = [(e.step, e.value) for e in accumulator.Scalars("loss")]
    assert loss == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert [(e.step, e.value) for e in accumulator.Scalars("lr")] == [(3, 0.5)]
    assert set(tags["images"]) == {"img", "gray"}
    image = accumulator.Images("img")[0]
    assert (image.step, image.width, image.height) == (2, 7, 6)
    histogram = accumulator.Histograms("weights")[0]
    assert (histogram.step, histogram.histogram_value.num) == (1, 50)
    assert histogram.histogram_value.max == 49.0
    text_tags = [t for t in tags["tensors"] if t.startswith("note")]
    assert text_tags
    text = accumulator.Tensors(text_tags[0])[0]
    assert text.tensor_proto.string_val[0] == b"hello"
    from tensorboard.plugins.hparams import plugin_data_pb2

    contents = accumulator.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["lr"].number_value == pytest.approx(1e-3)
    assert hparams["opt"].string_value == "adam"
    assert hparams["layers"].string_value == "[2, 3]"


def test_a_second_open_logger_of_one_run_is_refused_and_all_processes_each_hold_their_own(
    tmp_path,
):
    """Hostile finding: two open loggers of one name and log_dir mixed their series silently."""
    from substrax.tracking import FileLogBusyError

    with TensorBoardLogger("run", tmp_path) as first:
        first.log_scalar("loss", 1.0, step=0)
        with pytest.raises(FileLogBusyError, match=r"TensorBoard run 'run' .* TensorBoardLogger"):
            TensorBoardLogger("run", tmp_path)
        TensorBoardLogger("other", tmp_path).close()
        with (
            TensorBoardLogger("all", tmp_path, process_index=0, all_processes=True),
            TensorBoardLogger("all", tmp_path, process_index=1, all_processes=True),
        ):
            pass
    with TensorBoardLogger("run", tmp_path, resume_step=0) as resumed:  # once the first closed
        resumed.log_scalar("loss", 2.0, step=1)
    assert not list(tmp_path.glob(".*.lock"))
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == [(0, 1.0), (1, 2.0)]


def test_process_one_writes_nothing(tmp_path):
    with TensorBoardLogger("run", tmp_path / "tb", process_index=1) as logger:
        logger.log_scalar("loss", 1.0, step=0)
    assert not (tmp_path / "tb").exists()


PIXELS = {  # what each logged pixel is stored as, by the file log and TensorBoard alike
    "int_100": (np.full((2, 2, 3), 100, np.int64), 100),
    "int_300": (np.full((2, 2, 3), 300, np.int32), 255),
    "float_over_1": (np.full((2, 2, 3), 1.5), 255),
    "float_negative": (np.full((2, 2, 3), -0.5), 0),
    "float_half_gray": (np.full((2, 2), 0.5), 128),
    "bool": (np.ones((2, 2, 3), bool), 255),
}


def test_tensorboard_and_the_file_log_store_the_same_pixels(tmp_path):
    """Hostile finding: tensorboardX scaled integer images by 255 and wrapped floats outside
    [0, 1] (100 became 156, 1.5 became 126), and the file log refused int64 images."""
    image_module = pytest.importorskip("PIL.Image", reason="Pillow reads the pixels back")
    with TensorBoardLogger("run", tmp_path / "tb") as board, FileLogger("run", tmp_path) as files:
        for name, (image, _) in PIXELS.items():
            board.log_image(name, image, step=0)
            files.log_image(name, image, step=0)
    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path / "tb"), size_guidance={event_accumulator.IMAGES: 0}
    )
    accumulator.Reload()
    for name, (_, pixel) in PIXELS.items():
        encoded = accumulator.Images(name)[0].encoded_image_string
        assert np.asarray(image_module.open(io.BytesIO(encoded))).flat[0] == pixel, name
        [png] = (tmp_path / "images").glob(f"run.{name}_step0*.png")
        assert np.asarray(image_module.open(png)).flat[0] == pixel, name


@pytest.mark.parametrize(
    ("image", "error"),
    [
        (np.zeros((0, 5, 3)), "ImageShapeError"),
        ([], "LoggedTypeError"),  # a list of no images logged nothing, silently
        (np.full((2, 2), "a"), "LoggedTypeError"),
        (np.full((2, 2), 1 + 2j), "LoggedTypeError"),
    ],
)
def test_an_image_of_no_pixels_or_of_no_numbers_is_refused_at_the_call(tmp_path, image, error):
    with (
        TensorBoardLogger("run", tmp_path) as board,
        pytest.raises((TypeError, ValueError)) as raised,
    ):
        board.log_image("sample", image, step=0)
    assert type(raised.value).__name__ == error
    assert "'sample'" in str(raised.value)


def test_every_log_hyperparams_call_is_kept_later_values_winning(tmp_path):
    """Hostile finding: TensorBoard keeps the first hparams summary of a run, so a second
    ``log_hyperparams`` call was silently dropped."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    with TensorBoardLogger("run", tmp_path) as logger:
        logger.log_hyperparams({"lr": 1e-3, "opt": "adam"})
        logger.log_scalar("loss", 1.0, step=0)
        logger.flush()
        logger.log_hyperparams({"lr": 1e-4, "batch": 32})
        logger.log_hyperparams({"warmup": 10})
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    contents = accumulator.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert set(hparams) == {"lr", "opt", "batch", "warmup"}
    assert hparams["lr"].number_value == pytest.approx(1e-4)
    assert hparams["opt"].string_value == "adam"
    assert (hparams["batch"].number_value, hparams["warmup"].number_value) == (32, 10)
    experiment = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/experiment"])
    assert {info.name for info in experiment.experiment.hparam_infos} == set(hparams)
    assert [e.value for e in accumulator.Scalars("loss")] == [1.0]


def test_names_that_become_one_tag_are_logged_as_it_with_a_warning_once_each(tmp_path, caplog):
    """Hostile finding 7: eight names became the tag "a_b" (and "/a" became "a") without a word:
    eight metrics in one series."""
    names = ["a b", "a:b", "a%b", "a,b", 'a"b', "a\\b", "a\tb", "a\x00b"]
    caplog.set_level(logging.WARNING, logger="substrax.tracking")
    with TensorBoardLogger("run", tmp_path) as logger:
        for step in range(2):
            logger.log_scalars({name: float(step) for name in [*names, "/a", "ok"]}, step=step)
        logger.log_histogram("a b", [1.0, 2.0], step=0)
        logger.log_image("a:b", np.zeros((2, 2)), step=0)
    shown = "TensorBoardLogger(name='run')"
    changed = [f"{shown}: {n!r} is not a TensorBoard tag; it is logged as 'a_b'" for n in names]
    merged = [
        f"{shown}: 'a b' and {n!r} are both logged as the tag 'a_b', in one series; give them "
        "names that differ in letters, digits, '_', '-', '.' or '/'"
        for n in names[1:]
    ]
    slash = f"{shown}: '/a' is not a TensorBoard tag; it is logged as 'a'"
    assert sorted(caplog.messages) == sorted([*changed, *merged, slash])
    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={event_accumulator.SCALARS: 0}
    )
    accumulator.Reload()
    assert len(accumulator.Scalars("a_b")) == 2 * len(names)  # merged, none dropped
    assert [(e.step, e.value) for e in accumulator.Scalars("a")] == [(0, 0.0), (1, 1.0)]
    assert [(e.step, e.value) for e in accumulator.Scalars("ok")] == [(0, 0.0), (1, 1.0)]
    assert accumulator.Tags()["images"] == ["a_b"]


def test_a_histogram_without_a_finite_value_is_warned_about_not_raised(tmp_path, caplog):
    """Hostile finding: an empty (or all-NaN) histogram raised tensorboardX's 'The histogram is
    empty, please file a bug report.' at the call."""
    with (
        caplog.at_level(logging.WARNING, logger="substrax.tracking"),
        TensorBoardLogger("run", tmp_path) as logger,
    ):
        for step in range(2):
            logger.log_histogram("empty", np.array([]), step=step)
            logger.log_histogram("nan", np.array([np.nan]), step=step)
        logger.log_histogram("some", np.array([np.nan, 1.0, 2.0]), step=0)
    warned = [r.getMessage() for r in caplog.records if "no finite value" in r.getMessage()]
    assert len(warned) == 2  # once a name
    assert "histogram 'empty' at step 0 has no finite value" in warned[0]
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert accumulator.Tags()["histograms"] == ["some"]


def test_an_int_hyperparameter_past_int64_is_shown_as_its_digits(tmp_path):
    """Hostile finding: 2**70 raised a numpy TypeError from the hparams summary."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    with TensorBoardLogger("run", tmp_path) as logger:
        logger.log_hyperparams({"big": 2**70, "small": 3})
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    contents = accumulator.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["big"].string_value == str(2**70)
    assert hparams["small"].number_value == 3


def _hparams(directory):
    from tensorboard.plugins.hparams import plugin_data_pb2

    accumulator = event_accumulator.EventAccumulator(str(directory))
    accumulator.Reload()
    contents = accumulator.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"])
    return start.session_start_info.hparams


def test_a_resumed_logger_keeps_the_first_attempts_hyperparameters(tmp_path):
    """Hostile finding: a resumed logger's hyperparameters replaced the first attempt's."""
    with TensorBoardLogger("run", tmp_path) as logger:
        logger.log_hyperparams({"lr": 1e-3, "batch": 32})
    with TensorBoardLogger("run", tmp_path, resume_step=0) as logger:
        logger.log_hyperparams({"resumed": True, "lr": 1e-4})
    hparams = _hparams(tmp_path)
    assert set(hparams) == {"lr", "batch", "resumed"}
    assert hparams["lr"].number_value == pytest.approx(1e-4)
    with TensorBoardLogger("run", tmp_path / "new") as logger:  # a new run starts afresh
        logger.log_hyperparams({"other": 1})
    assert set(_hparams(tmp_path / "new")) == {"other"}


def test_nested_hyperparameters_of_two_calls_are_merged_key_by_key(tmp_path):
    """Hostile finding: a second call's ``{"optimizer": {"b2": ...}}`` replaced the first's
    ``optimizer`` (b1 lost) here, in the file log and W&B, while MLflow kept both."""
    with TensorBoardLogger("run", tmp_path) as logger:
        logger.log_hyperparams({"model": {"width": 64}, "optimizer": {"b1": 0.9}})
        logger.log_hyperparams({"optimizer": {"b2": 0.99}})
    hparams = _hparams(tmp_path)
    shown = {key: value.string_value for key, value in hparams.items()}
    assert shown == {"model": "{'width': 64}", "optimizer": "{'b1': 0.9, 'b2': 0.99}"}
    with TensorBoardLogger("run", tmp_path, resume_step=0) as logger:  # the first attempt's too
        logger.log_hyperparams({"optimizer": {"b1": 0.8}})
    assert _hparams(tmp_path)["optimizer"].string_value == "{'b1': 0.8, 'b2': 0.99}"


@pytest.mark.parametrize("flush_secs", ["x", 0, -1, float("nan")])
def test_flush_secs_that_is_no_positive_number_of_seconds_is_refused(tmp_path, flush_secs):
    """Hostile finding: a string killed the writer thread (every scalar lost); 0 or less spun it."""
    with pytest.raises((TypeError, ValueError), match="flush_secs"):
        TensorBoardLogger("run", tmp_path, flush_secs=flush_secs)


def test_a_resume_from_the_largest_step_writes_no_marker_past_it(tmp_path):
    """Hostile finding: the restart marker at step 2**63 raised protobuf's range error."""
    with TensorBoardLogger("run", tmp_path, resume_step=2**63 - 1) as logger:
        logger.log_scalar("loss", 1.0, step=2**63 - 1)
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("loss")] == [2**63 - 1]


@pytest.mark.usefixtures("child_processes")
def test_jax_values_held_by_a_logger_left_open_are_written_at_exit(tmp_path):
    """Hostile finding: tensorboardX's writer threads cannot start at exit, so the held values
    of a logger never closed (or flushed before) were lost, with a traceback."""
    child = textwrap.dedent(
        f"""
        import jax, jax.numpy as jnp
        from substrax.tracking import TensorBoardLogger

        slow = jax.jit(lambda x: jax.lax.fori_loop(0, 40, lambda i, x: jnp.tanh(x @ x), x).mean())
        x = jnp.full((600, 600), 1e-3)
        slow(x).block_until_ready()
        logger = TensorBoardLogger("run", {str(tmp_path)!r})
        logger.log_scalar("first", 1.0, step=0)
        logger.flush()  # the event file written so far is flushed: the held values come after
        for step in range(1, 4):
            logger.log_scalar("loss", slow(x + step), step=step)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("loss")] == [1, 2, 3]


def test_a_logger_dropped_unclosed_writes_the_events_it_kept(tmp_path):
    import gc

    logger = TensorBoardLogger("run", tmp_path)  # flush_secs=10: the events wait in memory
    logger.log_scalar("loss", 0.5, step=1)
    del logger
    gc.collect()
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == [(1, 0.5)]


def test_loggers_opened_in_one_second_in_one_directory_write_files_of_their_own(tmp_path):
    """Hostile finding: an event file was made at its first write, so a second logger opened
    meanwhile took the same name, and both appended to one file."""
    first, second = TensorBoardLogger("a", tmp_path), TensorBoardLogger("b", tmp_path)
    first.log_scalar("x", 1.0, step=0)
    second.log_scalar("y", 2.0, step=0)
    first.close()
    second.close()
    files = sorted(tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 2
    assert [name.name.split(".")[-2] for name in files] == ["000001", "000002"]


@pytest.mark.parametrize(
    "values",
    [[1.0, float(np.nextafter(1.0, 2.0))], [1.0, 1e308, -1e308], [5e-324, 0.0]],
    ids=["narrow", "wide", "subnormal"],
)
def test_a_histogram_of_any_finite_values_is_written(tmp_path, values):
    """Hostile finding: numpy's "Too many bins for data range" reached the training loop."""
    with TensorBoardLogger("run", tmp_path / "tb") as board, FileLogger("run", tmp_path) as log:
        board.log_histogram("h", values, step=1)
        log.log_histogram("h", values, step=1)
    accumulator = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    with np.errstate(over="ignore", invalid="ignore"):  # the reader's own percentiles of 1e308
        accumulator.Reload()
    assert accumulator.Histograms("h")[0].histogram_value.num == len(values)
    assert sum(json.loads(log.histograms_jsonl.read_text())["counts"]) == len(values)


@pytest.mark.usefixtures("child_processes")
def test_a_forked_child_leaves_its_parents_events_to_the_parent(tmp_path):
    """Hostile finding: a forked child that exited wrote its parent's waiting events again."""
    child = textwrap.dedent(
        f"""
        import os, sys
        from substrax.tracking import TensorBoardLogger

        logger = TensorBoardLogger("run", {str(tmp_path)!r})
        for step in range(3):
            logger.log_scalar("loss", float(step), step=step)  # waiting: flush_secs is 10
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        logger.close()
        """
    )
    result = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", child],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("loss")] == [0, 1, 2]


def test_events_reach_the_file_within_flush_secs_without_another_call(tmp_path, wall_clock):
    """Hostile finding: with no later call, nothing wrote the events (tensorboardX's thread did)."""
    logger = TensorBoardLogger("run", tmp_path, flush_secs=0.2)
    logger.log_scalar("loss", 1.0, step=0)
    wall_clock.sleep(2.0)
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("loss")] == [0]
    logger.close()


def test_a_value_past_float32_is_warned_about_once_a_name(tmp_path, caplog):
    """Hostile finding: 1e300 became TensorBoard's infinity without a word."""
    with TensorBoardLogger("run", tmp_path) as logger:
        for step in range(3):
            logger.log_scalars({"big": 1e300, "fine": 1.0}, step=step)
    assert caplog.text.count("'big' = 1e+300 at step 0 is past float32") == 1
    assert "'fine'" not in caplog.text


def test_a_hyperparameter_int_a_double_would_round_is_shown_as_its_text(tmp_path):
    """A hostile review: the seed 12345678901234567 showed as 1.2345678901234568e+16."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    with TensorBoardLogger("run", tmp_path) as logger:
        logger.log_hyperparams({"seed": 12345678901234567, "exact": 2**53, "small": -7})
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    contents = accumulator.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["seed"].string_value == "12345678901234567"
    assert (hparams["exact"].number_value, hparams["small"].number_value) == (2**53, -7)


def test_a_histogram_with_some_values_not_finite_is_warned_about_once_a_name(tmp_path, caplog):
    """A hostile review: a gradient histogram holding inf and NaN showed only its finite values,
    without a word."""
    with (
        caplog.at_level(logging.WARNING, logger="substrax.tracking"),
        TensorBoardLogger("run", tmp_path) as logger,
    ):
        for step in range(2):
            logger.log_histogram("grads", np.array([0.1, 0.2, np.inf, np.nan]), step=step)
        logger.log_histogram("fine", np.array([0.1, 0.2]), step=0)
    warned = [r.getMessage() for r in caplog.records if "NaN or infinite" in r.getMessage()]
    assert len(warned) == 1
    assert "histogram 'grads' at step 0 holds 2 values that are NaN or infinite" in warned[0]
