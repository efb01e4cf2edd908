"""Every logger takes a jax value whose step still runs and returns without waiting for it.

A slow value: a jitted loop of (512, 512) matmuls, sized to take about a quarter of a second,
dispatched and logged at once. Each test checks that the logging call returned while the value
was still being computed (``is_ready()`` was still false), then that the backend, read back after
``close``, holds the exact float32 value at the step it was logged at. No threshold in seconds: a
machine that speeds up or slows down between the sizing and the test changes how long the value
takes, not whether the call waited for it.
"""

import functools
import io
import json
import logging
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from substrax.tracking import (
    ConsoleLogger,
    FileLogger,
    LoggedTypeError,
    MultiLogger,
    create_logger,
    read_scalars,
)


jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

CALIBRATED = 0.25  # seconds the slow computation is sized for: a call that does not wait for it
# returns long before, on a loaded machine too (sized loaded and run idle, it may take a third;
# the slowest logging call, a FileLogger flushing at every call, returned in under 30 ms loaded)


@functools.cache
def _slow_fn():
    """A jitted ``(x, n, base) -> base``, which takes ``n`` matmuls of 512 x 512 to compute."""

    @jax.jit
    def slow(x, n, base):
        y = jax.lax.fori_loop(0, n, lambda _, y: jnp.tanh(y @ x), x)
        return base + 0.0 * y.sum()  # tanh keeps y finite: exactly base, after all the work

    x = jnp.full((512, 512), 1e-3, jnp.float32)
    n = 8
    slow(x, n, jnp.float32(0.0)).block_until_ready()  # compiled here, not timed below
    while True:  # grow the loop until it takes CALIBRATED seconds (compiled once: n is traced)
        started = time.perf_counter()
        slow(x, n, jnp.float32(0.0)).block_until_ready()
        took = time.perf_counter() - started
        if took >= CALIBRATED:
            return functools.partial(slow, x, n)
        n = max(n + 1, math.ceil(1.25 * n * CALIBRATED / max(took, 1e-6)))  # past it, at once


class Slow:
    """One slow value: ``Slow(0.25).value`` is computing ``0.25`` (float32) from its creation."""

    def __init__(self, base):
        fn = _slow_fn()
        self.expected = float(np.float32(base))
        self.started = time.perf_counter()
        self.value = fn(jnp.float32(base))

    def returned_early(self):
        """Assert the logging call just made returned before the value was computed."""
        returned = time.perf_counter() - self.started
        running = not self.value.is_ready()
        self.value.block_until_ready()
        computed = time.perf_counter() - self.started
        assert running, (
            f"the logging call returned after {returned:.3f} s, when the value was computed: it "
            f"waited for it (the value took {computed:.3f} s)"
        )


# --- each backend returns at once, then holds the exact value ---------------------------------


@pytest.mark.parametrize("flush_every", [1.0, 0.0])
def test_file_logger(tmp_path, flush_every):
    with FileLogger("run", tmp_path, flush_every=flush_every) as logger:
        slow = Slow(0.3)
        logger.log_scalar("loss", slow.value, step=7)
        slow.returned_early()
    assert read_scalars(tmp_path / "run.metrics.jsonl") == {"loss": [(7, slow.expected)]}
    [row] = (tmp_path / "run.metrics.csv").read_text().splitlines()[1:]
    assert row.split(",")[1:] == ["7", "loss", repr(slow.expected)]


def test_console_logger():
    out = io.StringIO()
    with ConsoleLogger("run", stream=out) as logger:
        slow = Slow(0.3)
        logger.log_scalars({"loss": slow.value, "acc": 0.5}, step=7)
        slow.returned_early()
    assert out.getvalue() == "[run] step       7 | loss        0.3 | acc        0.5\n"


def test_create_logger_file_and_console(tmp_path):
    out = io.StringIO()
    logger = create_logger("run", log_dir=tmp_path, stream=out)
    assert isinstance(logger, MultiLogger)
    slow = Slow(0.3)
    logger.log_metrics({"loss": slow.value}, step=7)
    slow.returned_early()
    logger.close()
    assert read_scalars(tmp_path / "run.metrics.jsonl") == {"loss": [(7, slow.expected)]}
    assert out.getvalue() == "[run] step       7 | loss        0.3\n"


def test_tensorboard_logger(tmp_path):
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    from substrax.tracking import TensorBoardLogger

    with TensorBoardLogger("run", tmp_path) as logger:
        slow = Slow(0.3)
        logger.log_scalar("loss", slow.value, step=7)
        slow.returned_early()
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == [(7, slow.expected)]


def test_mlflow_logger(sqlite_uri, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from substrax.tracking import MLFlowLogger

    with MLFlowLogger("device", tracking_uri=sqlite_uri, log_dir=tmp_path) as logger:
        slow = Slow(0.3)
        logger.log_metric("loss", slow.value, step=7)
        slow.returned_early()
    history = MlflowClient(tracking_uri=sqlite_uri).get_metric_history(logger.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(7, slow.expected)]


def test_wandb_logger(wandb_offline, wandb_runs, tmp_path):
    from substrax.tracking import WandbLogger

    with WandbLogger("device", project="substrax-tests", log_dir=tmp_path) as logger:
        slow = Slow(0.3)
        logger.log_scalars({"loss": slow.value}, step=7)
        slow.returned_early()

    def rows(runs):
        return [
            (record.history.step.num, json.loads(item.value_json))
            for records in runs
            for kind, record in records
            if kind == "history"
            for item in record.history.item
            if (item.key or "/".join(item.nested_key)) == "loss"
        ]

    assert rows(wandb_runs.wait(tmp_path, rows)) == [(7, slow.expected)]


# --- order, close, refusals, deleted buffers ------------------------------------------------------


def test_order_is_kept_and_a_flush_stops_at_a_value_still_computed(tmp_path):
    logger = FileLogger("run", tmp_path, flush_every=0)  # a (non-waiting) flush at every call
    computed = jnp.float32(2.5).block_until_ready()  # before the slow value queues ahead of it
    logger.log_scalar("loss", 1.0, step=0)
    slow = Slow(0.3)
    logger.log_scalar("loss", slow.value, step=1)
    logger.log_scalar("loss", computed, step=2)  # computed, but behind step 1
    logger.log_scalar("loss", 3.0, step=3)
    slow.returned_early()
    assert read_scalars(tmp_path / "run.metrics.jsonl") == {"loss": [(0, 1.0)]}
    logger.log_scalar("loss", 4.0, step=4)  # step 1 is computed now: all are written
    assert read_scalars(tmp_path / "run.metrics.jsonl")["loss"] == [
        (0, 1.0),
        (1, slow.expected),
        (2, 2.5),
        (3, 3.0),
        (4, 4.0),
    ]
    logger.close()


def test_close_waits_for_every_value_still_computed(tmp_path):
    out = io.StringIO()
    logger = create_logger("run", log_dir=tmp_path, stream=out)
    slows = [Slow(1 / (step + 2)) for step in range(3)]
    for step, slow in enumerate(slows):
        logger.log_scalars({"loss": slow.value, "step": float(step)}, step=step)
    assert not slows[-1].value.is_ready()
    logger.close()
    assert read_scalars(tmp_path / "run.metrics.jsonl") == {
        "loss": [(step, slow.expected) for step, slow in enumerate(slows)],
        "step": [(step, float(step)) for step in range(3)],
    }
    assert [line.split("|")[0] for line in out.getvalue().splitlines()] == [
        f"[run] step {step:>7} " for step in range(3)
    ]


class _DownSink:
    """A backend that is down: every record stays in the spool."""

    def target(self):
        return {"backend": "test", "run": "r1"}

    def deliver(self, _records):
        raise ConnectionError("server gone")

    def is_permanent(self, _error):
        return False

    def finish(self):
        raise ConnectionError("server gone")


def test_a_close_that_runs_out_on_a_value_still_computed_spools_what_was_logged_before_it(
    make, tmp_path
):
    delivery = make(_DownSink(), batch_interval=60.0)  # both records reach the writer at close
    value = jnp.float32(0.5)
    for _ in range(8):  # each waits for the one before: about 2 s of work in all
        value = _slow_fn()(value)
    delivery.submit(("loss", 1.0, 0, time.time()))
    delivery.submit(("loss", value, 1, time.time()))
    assert delivery.close(timeout=0.05) == 1  # step 0 is in the spool; step 1 still computes
    assert not value.is_ready()
    lines = (tmp_path / "run.spool.jsonl").read_text().splitlines()
    assert [json.loads(line)["record"]["step"] for line in lines] == [0, None]  # None: end mark
    value.block_until_ready()


def test_console_lines_keep_their_order_behind_a_value_still_computed():
    out = io.StringIO()
    logger = ConsoleLogger("run", stream=out)
    logger.log_scalar("loss", 1.0, step=0)
    slow = Slow(0.3)
    logger.log_scalar("loss", slow.value, step=1)
    logger.log_text("note", "after step 1", step=1)
    slow.returned_early()
    assert out.getvalue() == "[run] step       0 | loss          1\n"
    logger.log_scalar("loss", 2.0, step=2)  # step 1 is computed now: the held lines go first
    assert out.getvalue().splitlines() == [
        "[run] step       0 | loss          1",
        "[run] step       1 | loss        0.3",
        "[run] step       1 | note: after step 1",
        "[run] step       2 | loss          2",
    ]
    logger.close()


def test_jax_values_read_as_python_numbers_do(tmp_path):
    with FileLogger("run", tmp_path) as logger:
        logger.log_scalars(
            {"f16": jnp.float16(0.1), "bf16": jnp.bfloat16(0.1), "i": jnp.int32(3)}, step=0
        )
        with pytest.raises(LoggedTypeError, match=r"scalar 'b' must be a number, got a bool"):
            logger.log_scalar("b", jnp.bool_(True), step=0)  # refused, as Python's True is
        logger.log_scalar("nan", jnp.float32(math.nan), step=0)
    scalars = read_scalars(tmp_path / "run.metrics.jsonl")
    assert scalars["f16"] == [(0, float(np.float16(0.1)))]
    assert scalars["bf16"] == [(0, float(jnp.bfloat16(0.1)))]
    assert scalars["i"] == [(0, 3.0)]
    assert "b" not in scalars
    assert math.isnan(scalars["nan"][0][1])


def make_logger(make, tmp_path, request, out=None):
    """A FileLogger, ConsoleLogger (printing to ``out``), TensorBoardLogger or MLFlowLogger."""
    if make == "file":
        return FileLogger("run", tmp_path)
    if make == "console":
        return ConsoleLogger("run", stream=io.StringIO() if out is None else out)
    if make == "tensorboard":
        pytest.importorskip("tensorboardX")
        from substrax.tracking import TensorBoardLogger

        return TensorBoardLogger("run", tmp_path)
    pytest.importorskip("mlflow")
    from substrax.tracking import MLFlowLogger

    uri = request.getfixturevalue("sqlite_uri")
    return MLFlowLogger(request.node.name, tracking_uri=uri, log_dir=tmp_path)


@pytest.mark.parametrize("make", ["file", "console", "tensorboard", "mlflow"])
def test_a_jax_array_of_several_values_is_refused_at_the_call(make, tmp_path, request):
    logger = make_logger(make, tmp_path, request)
    with logger:
        with pytest.raises(LoggedTypeError, match="'x' must be a number or a one-element array"):
            logger.log_scalar("x", jnp.ones(3))
        with pytest.raises(TypeError):
            logger.log_scalar("key", jax.random.key(0))


@pytest.mark.parametrize("make", ["file", "console", "tensorboard", "mlflow"])
def test_a_one_element_array_is_logged_as_its_value_by_every_logger(make, tmp_path, request):
    """A jax array of shape (1,) (a still-running one, and one computed) and a numpy one."""
    out = io.StringIO()
    logger = make_logger(make, tmp_path, request, out)
    jnp.float32(0.0).reshape(1).block_until_ready()  # reshape compiled: not timed below
    slow = Slow(0.25)
    logger.log_scalars({"loss": slow.value.reshape(1)}, step=1)
    slow.returned_early()
    logger.log_scalar("loss", jnp.array([0.5], jnp.float32), step=2)
    logger.log_metrics({"loss": np.array([0.75])}, step=3)
    logger.close()
    expected = [(1, 0.25), (2, 0.5), (3, 0.75)]
    if make == "file":
        assert read_scalars(tmp_path / "run.metrics.jsonl") == {"loss": expected}
    elif make == "console":
        assert [line.split()[-1] for line in out.getvalue().splitlines()] == ["0.25", "0.5", "0.75"]
    elif make == "tensorboard":
        from tensorboard.backend.event_processing import event_accumulator

        accumulator = event_accumulator.EventAccumulator(str(tmp_path))
        accumulator.Reload()
        assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == expected
    else:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=request.getfixturevalue("sqlite_uri"))
        history = client.get_metric_history(logger.run_id, "loss")
        assert sorted((m.step, m.value) for m in history) == expected
        assert not logger.spool_path.exists()


@pytest.mark.parametrize("make", ["file", "console", "tensorboard", "mlflow"])
def test_a_deleted_value_is_skipped_with_a_warning_and_the_rest_is_kept(
    make, tmp_path, request, caplog
):
    """A buffer deleted (donated to the next step) before the logger read it."""
    caplog.set_level(logging.WARNING, logger="substrax.tracking._values")
    out = io.StringIO()
    logger = make_logger(make, tmp_path, request, out)
    # made (their multiply compiled) before the slow value starts: nothing in the window below
    # takes long enough for the slow value to be computed and what follows it read (the lowest
    # tier's CI run compiled the multiply there, and the logger read a value before its delete)
    doomed = {step: jnp.asarray(float(step), jnp.float32) * 2 for step in (2, 3)}
    jax.block_until_ready(list(doomed.values()))
    slow = Slow(0.3)
    logger.log_scalar("loss", slow.value, step=1)  # holds what comes after it unread
    for step in (2, 3):
        logger.log_scalars({"doomed": doomed[step], "loss": float(step)}, step=step)
        doomed[step].delete()
    logger.close()
    warnings = [r.getMessage() for r in caplog.records if "'doomed'" in r.getMessage()]
    assert len(warnings) == 1, caplog.text  # once per metric
    assert "step 2" in warnings[0]
    assert "donate" in warnings[0]
    expected = [(1, slow.expected), (2, 2.0), (3, 3.0)]
    if make == "file":
        assert read_scalars(tmp_path / "run.metrics.jsonl") == {"loss": expected}
    elif make == "console":
        assert out.getvalue().splitlines() == [
            "[run] step       1 | loss        0.3",
            "[run] step       2 | loss          2",
            "[run] step       3 | loss          3",
        ]
    elif make == "tensorboard":
        from tensorboard.backend.event_processing import event_accumulator

        accumulator = event_accumulator.EventAccumulator(str(tmp_path))
        accumulator.Reload()
        assert accumulator.Tags()["scalars"] == ["loss"]
        assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == expected
    else:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=request.getfixturevalue("sqlite_uri"))
        history = client.get_metric_history(logger.run_id, "loss")
        assert sorted((m.step, m.value) for m in history) == expected
        assert client.get_metric_history(logger.run_id, "doomed") == []
        assert not logger.spool_path.exists()


@pytest.mark.usefixtures("child_processes")
def test_importing_tracking_and_logging_floats_imports_no_jax(tmp_path):
    code = (
        "import sys, io, substrax.tracking as tracking\n"
        f"logger = tracking.create_logger('run', log_dir={str(tmp_path)!r}, stream=io.StringIO())\n"
        "logger.log_scalar('loss', 0.5, step=0)\n"
        "logger.close()\n"
        "assert 'jax' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- SIGTERM ------------------------------------------------------------------------------------

_SIGTERMED = """
import io, os, signal, sys, time
import jax, jax.numpy as jnp
from substrax.tracking import ConsoleLogger, FileLogger, MLFlowLogger, MultiLogger

log_dir, tracking_uri = sys.argv[1:3]  # a store migrated already: the test's, not a new one
# As PreemptionHandler does at the next step boundary: SIGTERM ends the process by SystemExit.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

@jax.jit
def step_fn(x, base):
    y = jax.lax.fori_loop(0, 50, lambda _, y: jnp.tanh(y @ x), x)
    return base + 0.0 * y.sum()

x = jnp.full((512, 512), 1e-3, jnp.float32)
step_fn(x, jnp.float32(0)).block_until_ready()
logger = MultiLogger([  # never closed: the process exits with it open
    FileLogger("run", log_dir),
    ConsoleLogger("run", stream=sys.stdout),
    MLFlowLogger("run", tracking_uri=tracking_uri, log_dir=log_dir),
])
print("run id", logger.loggers[2].run_id, flush=True)
for step in range(100):
    loss = step_fn(x, jnp.float32(1 / (step + 2)))
    logger.log_scalar("loss", loss, step=step)
    if step == 2:
        assert not loss.is_ready()
        os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.usefixtures("child_processes")
def test_values_still_computed_at_a_sigterm_are_written(tmp_path, sqlite_uri):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    script = tmp_path / "sigtermed.py"
    script.write_text(_SIGTERMED)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), sqlite_uri],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = [(step, float(np.float32(1 / (step + 2)))) for step in range(3)]
    output = f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert read_scalars(tmp_path / "run.metrics.jsonl") == {"loss": expected}, output
    printed = [line for line in result.stdout.splitlines() if line.startswith("[run] step")]
    assert len(printed) == 3, output
    run_id = next(
        line.split()[-1] for line in result.stdout.splitlines() if line.startswith("run id")
    )
    client = MlflowClient(tracking_uri=sqlite_uri)
    history = client.get_metric_history(run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == expected, output
    assert client.get_run(run_id).info.status == "FINISHED"


def _stored_pixel(make, logger, tmp_path):
    """The first pixel ``logger`` stored of the image it logged as "img"."""
    image_module = pytest.importorskip("PIL.Image", reason="Pillow reads the pixels back")
    if make == "file":
        [png] = (tmp_path / "images").glob("run.img_step0*.png")
        return np.asarray(image_module.open(png)).flat[0]
    if make == "tensorboard":
        from tensorboard.backend.event_processing import event_accumulator

        accumulator = event_accumulator.EventAccumulator(
            str(tmp_path), size_guidance={event_accumulator.IMAGES: 0}
        )
        accumulator.Reload()
        encoded = accumulator.Images("img")[0].encoded_image_string
        return np.asarray(image_module.open(io.BytesIO(encoded))).flat[0]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=logger.tracking_uri)
    [png] = client.list_artifacts(logger.run_id, "images/img")
    return np.asarray(image_module.open(client.download_artifacts(logger.run_id, png.path))).flat[0]


@pytest.mark.parametrize("make", ["file", "console", "tensorboard", "mlflow"])
def test_a_bfloat16_image_is_stored_as_a_float32_one_is(make, tmp_path, request):
    """Hostile finding: every logger refused a bfloat16 image ("must be an array of numbers
    (bool, int or float), got dtype bfloat16"): numpy calls ml_dtypes' floats void."""
    logger = make_logger(make, tmp_path, request)
    with logger:
        logger.log_image("img", jnp.full((4, 4, 3), 0.5, jnp.bfloat16), step=0)
        logger.log_image("gray", np.full((2, 2), 1.5, jnp.bfloat16), step=0)
    if make != "console":
        assert _stored_pixel(make, logger, tmp_path) == 128  # 0.5, as float32's
