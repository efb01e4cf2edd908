import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from substrax.callbacks import BaseCallback, CallbackList, ProfilerWindow


@jax.jit
def _step(x):
    return x @ x.T / x.shape[0]


def _trace_files(log_dir: Path) -> list[Path]:
    return [path for path in log_dir.rglob("*") if path.is_file()]


def _run(callbacks, steps: int, *, begin_hooks: bool = True) -> None:
    x = jnp.ones((64, 64))
    callbacks.on_train_begin(None)
    for index in range(steps):
        if begin_hooks:
            callbacks.on_batch_begin(None, index)
        x = _step(x)
        callbacks.on_batch_end(None, index, {"loss": x[0, 0]})
    callbacks.on_train_end(None)


def _assert_a_readable_trace(log_dir: Path) -> None:
    xplanes = list(log_dir.glob("plugins/profile/*/*.xplane.pb"))
    assert len(xplanes) == 1, _trace_files(log_dir)
    assert xplanes[0].stat().st_size > 0


def _profiler_is_free(tmp_path: Path) -> bool:
    jax.profiler.start_trace(tmp_path / "probe")
    jax.profiler.stop_trace()
    return True


@pytest.mark.parametrize("begin_hooks", [True, False], ids=["batch_begin", "batch_end_only"])
def test_the_window_traces_its_steps_into_the_log_dir(tmp_path, begin_hooks):
    window = ProfilerWindow(start_step=2, num_steps=2, log_dir=tmp_path / "profile", perfetto=True)
    traced: list[int] = []

    class Watch(BaseCallback):
        def on_batch_end(self, _trainer, batch, _logs):
            if window.tracing:
                traced.append(batch)

    _run(CallbackList([Watch(), window]), 6, begin_hooks=begin_hooks)
    assert traced == [2, 3]  # traced while steps 2 and 3 ran; stopped after step 3's outputs
    assert window.done
    assert not window.tracing
    _assert_a_readable_trace(tmp_path / "profile")
    perfetto = list((tmp_path / "profile").rglob("perfetto_trace.json.gz"))
    assert perfetto
    assert perfetto[0].stat().st_size > 0


def test_two_windows_ending_within_one_second_keep_both_traces(tmp_path):
    """Hostile finding: jax names a trace's folder by the second, so the second of two short
    windows in one log_dir replaced the first one's trace."""
    first = ProfilerWindow(start_step=1, num_steps=1, log_dir=tmp_path)
    second = ProfilerWindow(start_step=2, num_steps=1, log_dir=tmp_path)
    _run(CallbackList([first, second]), 4)
    assert len(list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))) == 2


def test_a_window_the_run_never_reaches_is_warned_about_at_its_end(tmp_path, caplog):
    """Hostile finding: a window after the run's last step passed without a word."""
    window = ProfilerWindow(start_step=10, num_steps=2, log_dir=tmp_path)
    _run(CallbackList([window]), 3)
    assert "the run ended before step 10; steps 10-11 are not traced" in caplog.text
    assert not list(tmp_path.rglob("*.xplane.pb"))


def test_a_donated_array_in_the_logs_at_the_window_s_end_still_stops_the_trace(tmp_path):
    # block_until_ready raised on the deleted buffer and the trace kept running
    window = ProfilerWindow(start_step=0, num_steps=1, log_dir=tmp_path / "profile")
    gone = jnp.ones(3) + 1
    gone.delete()
    window.on_train_begin(None)
    window.on_batch_begin(None, 0)
    window.on_batch_end(None, 0, {"loss": _step(jnp.ones((8, 8)))[0, 0], "state": gone})
    assert not window.tracing
    _assert_a_readable_trace(tmp_path / "profile")


def test_a_run_that_ends_inside_the_window_stops_the_trace(tmp_path):
    window = ProfilerWindow(start_step=1, num_steps=100, log_dir=tmp_path / "profile")
    _run(CallbackList([window]), 3)
    assert window.done
    assert not window.tracing
    _assert_a_readable_trace(tmp_path / "profile")
    assert _profiler_is_free(tmp_path)


def test_an_exception_inside_the_window_stops_the_trace(tmp_path):
    x = jnp.ones((64, 64))
    window = ProfilerWindow(start_step=0, num_steps=10, log_dir=tmp_path / "profile")
    with pytest.raises(ZeroDivisionError), window:  # noqa: PT012 - the loop raises mid-window
        window.on_train_begin(None)
        for index in range(3):
            x = _step(x)
            window.on_batch_end(None, index, {"loss": x[0, 0]})
            if index == 1:
                _ = 1 / 0
    assert not window.tracing
    _assert_a_readable_trace(tmp_path / "profile")
    assert _profiler_is_free(tmp_path)


def test_a_trace_already_running_is_left_alone(tmp_path, caplog):
    jax.profiler.start_trace(tmp_path / "other")
    try:
        window = ProfilerWindow(start_step=0, num_steps=2, log_dir=tmp_path / "profile")
        with caplog.at_level("WARNING", logger="substrax.callbacks"):
            _run(CallbackList([window]), 3)
    finally:
        jax.profiler.stop_trace()
    assert window.done
    assert not window.tracing
    assert "could not start its trace" in caplog.text
    _assert_a_readable_trace(tmp_path / "other")


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="num_steps=0"):
        ProfilerWindow(start_step=0, num_steps=0, log_dir=tmp_path)
    with pytest.raises(TypeError, match="start_step"):
        ProfilerWindow(start_step=1.5, num_steps=1, log_dir=tmp_path)  # type: ignore[arg-type]


@pytest.mark.usefixtures("child_processes")
def test_a_process_that_dies_of_an_exception_inside_the_window_keeps_its_trace(tmp_path):
    program = f"""
import jax.numpy as jnp
from substrax.callbacks import ProfilerWindow
window = ProfilerWindow(start_step=0, num_steps=10, log_dir={str(tmp_path / "profile")!r})
window.on_train_begin(None)
for step in range(3):
    loss = jnp.sum(jnp.ones(8) * step)
    window.on_batch_end(None, step, {{"loss": loss}})
raise SystemExit("the loop died inside the window")
"""
    result = subprocess.run(
        [sys.executable, "-c", program],
        env={k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
        | {"JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "the loop died inside the window" in result.stderr
    _assert_a_readable_trace(tmp_path / "profile")


@pytest.mark.parametrize("below", [False, True], ids=["the_file", "a_folder_in_it"])
def test_a_log_dir_that_is_a_file_is_refused_at_construction(tmp_path, below):
    """Hostile finding: a log_dir naming a file was taken, and failed (FileExistsError) only
    when the window started, in the middle of the run."""
    (tmp_path / "trace").write_text("not a folder")
    log_dir = tmp_path / "trace" / "profile" if below else tmp_path / "trace"
    with pytest.raises(ValueError, match=r"must be a directory.*'.*trace' is a file"):
        ProfilerWindow(start_step=0, num_steps=1, log_dir=log_dir)


@pytest.mark.parametrize("begin_hooks", [True, False], ids=["batch_begin", "batch_end_only"])
def test_a_window_already_past_at_the_first_step_is_warned_about_once(
    tmp_path, caplog, begin_hooks
):
    """Hostile finding: a resumed run that starts after the window traced nothing, silently."""
    window = ProfilerWindow(start_step=2, num_steps=2, log_dir=tmp_path / "profile")
    x = jnp.ones((8, 8))
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        window.on_train_begin(None)
        for step in range(100, 104):  # resumed at step 100
            if begin_hooks:
                window.on_batch_begin(None, step)
            x = _step(x)
            window.on_batch_end(None, step, {"loss": x[0, 0]})
        window.on_train_end(None)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "ProfilerWindow skips steps 2-3, already past at step 100 (a resumed run?): nothing is "
        "traced; choose a window after the run's first step"
    ]
    assert window.done
    assert not (tmp_path / "profile").exists()


def test_a_last_traced_step_whose_logs_are_empty_is_warned_about(tmp_path, caplog):
    """Hostile finding (as ThroughputMeter's): with no jax array in the last traced step's logs
    the trace stopped at its dispatch, without its compute, and without a word."""
    window = ProfilerWindow(start_step=1, num_steps=2, log_dir=tmp_path / "profile")
    x = jnp.ones((8, 8))
    with caplog.at_level("WARNING", logger="substrax.callbacks"):
        window.on_train_begin(None)
        for step in range(4):
            window.on_batch_begin(None, step)
            x = _step(x)
            window.on_batch_end(None, step, {})
        window.on_train_end(None)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "the batch-end logs of step 2, its last traced step, are empty" in warnings[0]
    assert window.done
