"""A resumed TensorBoardLogger: TensorBoard shows every step once, with the resumed run's value.

The first attempt logs past its checkpoint (step ``SAVED``) and stops; the resumed logger, in
the same directory, gets ``resume_step=SAVED`` and logs the steps after it again. Both attempts
run within one second here, as a fast restart would.
"""

from collections import Counter

import numpy as np
import pytest

from substrax.tracking import TensorBoardLogger, create_logger


event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard package (dev dependency) reads the event files back",
)
from tensorboard.backend.event_processing import plugin_event_accumulator  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402


SAVED, REACHED, END = 50, 80, 100  # the checkpoint, where the first attempt stopped, the end


def read(log_dir):
    """TensorBoard's reader (it purges what a restart marker orphans, by default) on ``log_dir``."""
    accumulator = event_accumulator.EventAccumulator(
        str(log_dir),
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0},
    )
    accumulator.Reload()
    return accumulator


def ui_scalars(log_dir, tag):
    """``tag``'s ``(step, value)`` as TensorBoard's UI loader (``--load_fast=false``) reads them."""
    accumulator = plugin_event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={plugin_event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    return [
        (event.step, float(tensor_util.make_ndarray(event.tensor_proto)))
        for event in accumulator.Tensors(tag)
    ]


def test_a_resumed_logger_leaves_each_step_once_with_the_resumed_value(tmp_path):
    with TensorBoardLogger("run", tmp_path) as logger:
        for step in range(1, REACHED + 1):
            logger.log_scalar("loss", float(step), step=step)
            logger.log_histogram("w", np.full(3, float(step)), step=step)
            if step == SAVED:
                logger.flush()  # before the checkpoint: a second event file follows
    with TensorBoardLogger("run", tmp_path, resume_step=SAVED) as logger:
        assert logger.resume_step == SAVED
        for step in range(SAVED + 1, END + 1):
            logger.log_scalar("loss", 1000.0 + step, step=step)
            logger.log_histogram("w", np.full(3, 1000.0 + step), step=step)
            if step == 70:
                logger.flush()  # the resumed logger's next event file purges nothing
    accumulator = read(tmp_path)
    loss = [(event.step, event.value) for event in accumulator.Scalars("loss")]
    expected = [(step, float(step if step <= SAVED else 1000 + step)) for step in range(1, END + 1)]
    assert loss == expected
    assert ui_scalars(tmp_path, "loss") == expected
    histograms = accumulator.Histograms("w")
    assert Counter(h.step for h in histograms) == Counter(range(1, END + 1))
    assert {h.step: h.histogram_value.max for h in histograms}[SAVED + 1] == 1000.0 + SAVED + 1


def test_each_logger_of_a_directory_writes_a_file_named_after_the_last(tmp_path):
    names: list[list[str]] = []
    for resume_step in (None, 2, None):
        before = set(tmp_path.glob("events.out.tfevents.*"))
        with TensorBoardLogger("run", tmp_path, resume_step=resume_step) as logger:
            logger.log_scalar("loss", 1.0, step=3)
        names.append(sorted(p.name for p in set(tmp_path.glob("events.out.tfevents.*")) - before))
    assert all(len(new) == 1 for new in names)  # none reuses (truncates) an earlier one's file
    assert [new[0] for new in names] == sorted(new[0] for new in names)  # read in this order


def test_two_loggers_of_one_directory_never_open_the_same_file(tmp_path):
    # each read the directory's last number once: after a flush one reopened the other's file
    # (same second, same name) and tensorboardX emptied it, losing its first steps
    first, second = TensorBoardLogger("a", tmp_path), TensorBoardLogger("b", tmp_path)
    for start in (1, 11):
        for step in range(start, start + 10):
            first.log_scalar("a", 1.0, step=step)
            second.log_scalar("b", 2.0, step=step)
        second.flush()
        first.flush()
    first.close()
    second.close()
    events = read(tmp_path)
    assert [e.step for e in events.Scalars("a")] == list(range(1, 21))
    assert [e.step for e in events.Scalars("b")] == list(range(1, 21))


def test_create_logger_resumes_its_tensorboard_files(tmp_path):
    options = {"console": False, "log_to_file": False, "tensorboard": True}
    with create_logger("run", tmp_path, **options) as logger:
        for step in range(1, REACHED + 1):
            logger.log_scalar("loss", float(step), step=step)
    with create_logger("run", tmp_path, resume_step=SAVED, **options) as logger:
        for step in range(SAVED + 1, END + 1):
            logger.log_scalar("loss", 1000.0 + step, step=step)
    loss = {}
    for event in read(tmp_path / "tensorboard" / "run").Scalars("loss"):
        assert event.step not in loss
        loss[event.step] = event.value
    assert sorted(loss) == list(range(1, END + 1))
    assert loss[SAVED] == SAVED
    assert loss[SAVED + 1] == 1000.0 + SAVED + 1


def test_create_logger_keeps_the_tensorboard_runs_of_two_names_apart(tmp_path):
    """Hostile finding: two names in one log_dir shared one TensorBoard directory: their series
    merged, and a resume of one hid the other's steps."""
    options = {"console": False, "log_to_file": False, "tensorboard": True}
    with (
        create_logger("train", tmp_path, **options) as train,
        create_logger("eval", tmp_path, **options) as evaluation,
    ):
        for step in range(1, 5):
            train.log_scalar("loss", 1.0, step=step)
            evaluation.log_scalar("loss", 9.0, step=step)
    with create_logger("train", tmp_path, resume_step=2, **options) as train:
        train.log_scalar("loss", 2.0, step=3)
    evaluation_loss = [
        (e.step, e.value) for e in read(tmp_path / "tensorboard" / "eval").Scalars("loss")
    ]
    assert evaluation_loss == [(step, 9.0) for step in range(1, 5)]
    train_loss = {e.step: e.value for e in read(tmp_path / "tensorboard" / "train").Scalars("loss")}
    assert train_loss == {1: 1.0, 2: 1.0, 3: 2.0}


def test_a_resume_step_over_a_directory_with_no_earlier_run_is_warned_about(tmp_path, caplog):
    # hostile finding: a misspelled log_dir resumed nothing, silently (FileLogger warns of it)
    with TensorBoardLogger("run", tmp_path / "typo", resume_step=SAVED) as logger:
        logger.log_scalar("loss", 1.0, step=SAVED + 1)
    warned = [r.getMessage() for r in caplog.records if "earlier attempt" in r.getMessage()]
    assert warned == [
        f"TensorBoardLogger('run'): resume_step={SAVED}, but {tmp_path / 'typo'} holds no event "
        "file of an earlier attempt; check that log_dir is the first attempt's"
    ]
    caplog.clear()
    with TensorBoardLogger("run", tmp_path / "typo", resume_step=SAVED + 1):
        pass
    assert not [r for r in caplog.records if "earlier attempt" in r.getMessage()]
