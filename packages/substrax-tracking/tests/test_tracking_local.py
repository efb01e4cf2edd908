import csv
import decimal
import fractions
import hashlib
import io
import json
import logging
import math
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from substrax.tracking import (
    ConsoleLogger,
    FileLogger,
    LoggedTypeError,
    Logger,
    LoggerClosedError,
    MultiLogger,
    create_logger,
    current_process_index,
    plot_log_dir,
    read_scalars,
)


def refuse_constant(name):
    raise ValueError(f"not strict JSON: {name}")


def lines(path):
    """Every line as strict JSON (NaN, Infinity and -Infinity are refused)."""
    return [
        json.loads(line, parse_constant=refuse_constant) for line in path.read_text().splitlines()
    ]


def test_console_lines_are_aligned_and_cover_every_kind():
    out = io.StringIO()
    with ConsoleLogger("run", stream=out) as logger:
        logger.log_scalars({"loss": 0.25, "acc": 0.91}, step=3)
        logger.log_scalar("loss", 1e-5, step=12345)
        logger.log_metrics({"lr": 0.0}, step=4)
        logger.log_hyperparams({"lr": 1e-3})
        logger.log_text("note", "hello", step=1)
        logger.log_image("img", np.zeros((4, 5, 3)), step=1)
        logger.log_histogram("w", [1.0, 2.0, 3.0], step=1)
    got = out.getvalue().splitlines()
    assert got[0] == "[run] step       3 | loss       0.25 | acc       0.91"
    assert got[1] == "[run] step   12345 | loss  1.000e-05"
    assert got[0].index("| loss") == got[1].index("| loss")
    assert got[3] == '[run] hyperparams {"lr": 0.001}'
    assert "note: hello" in got[4]
    assert "(4, 5, 3)" in got[5]
    assert "mean=2" in got[6]


def test_console_above_info_prints_nothing():
    out = io.StringIO()
    ConsoleLogger("run", stream=out, level=logging.WARNING).log_scalar("loss", 1.0, step=0)
    assert out.getvalue() == ""


def test_console_with_rich_renders_the_same_text():
    out = io.StringIO()
    ConsoleLogger("run", stream=out, use_rich=True).log_scalar("loss", 0.5, step=1)
    assert "[run] step       1 | loss        0.5" in out.getvalue()


@pytest.mark.parametrize("bad", ["1.0", True, np.True_, np.array([False]), None, np.ones(3)])
def test_scalars_must_be_numbers(bad, tmp_path):
    with pytest.raises(TypeError, match="'x'"):
        ConsoleLogger("run", stream=io.StringIO()).log_scalar("x", bad)
    with FileLogger("run", tmp_path) as logger, pytest.raises(TypeError, match="'x'"):
        logger.log_scalars({"y": 1.0, "x": bad}, step=3)  # nothing of the call is written
    assert read_scalars(tmp_path / "run.metrics.jsonl") == {}


def test_images_must_be_image_shaped():
    logger = ConsoleLogger("run", stream=io.StringIO())
    with pytest.raises(ValueError, match=r"\(2, 2, 2, 2\)"):
        logger.log_image("img", np.zeros((2, 2, 2, 2)))
    with pytest.raises(TypeError, match="array"):
        logger.log_image("img", "not an image")


def test_closed_logger_refuses_calls():
    logger = ConsoleLogger("run", stream=io.StringIO())
    logger.close()
    logger.close()  # idempotent
    with pytest.raises(LoggerClosedError, match="'run' is closed"):
        logger.log_scalar("x", 1.0)


def test_other_inputs_refused():
    logger = ConsoleLogger("run", stream=io.StringIO())
    with pytest.raises(TypeError, match="mapping"):
        logger.log_hyperparams([("lr", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="str"):
        logger.log_text("t", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        ConsoleLogger("")


def test_file_logger_writes_jsonl_csv_hparams_text_images_histograms(tmp_path):
    with FileLogger("my run", tmp_path) as logger:
        logger.log_hyperparams({"lr": 1e-3, "layers": (2, 3)})
        logger.log_hyperparams({"batch": 32})
        logger.log_scalars({"loss": 0.5, "acc": np.float32(0.25)}, step=1)
        logger.log_scalar("loss", math.nan, step=2)
        logger.log_scalar("loss", 0.1)
        logger.log_text("note", "first\nsecond", step=1)
        logger.log_image("sample", np.random.default_rng(0).random((8, 8, 3)), step=1)
        logger.log_image("gray", [np.zeros((4, 4)), np.ones((4, 4, 1))], step=2)
        logger.log_histogram("weights", np.arange(100.0), step=1)
    assert logger.metrics_jsonl == tmp_path / "my_run-d33e7609.metrics.jsonl"  # made file-safe
    metrics = lines(logger.metrics_jsonl)
    assert [(m["step"], m["name"], m["value"]) for m in metrics[:2]] == [
        (1, "loss", 0.5),
        (1, "acc", 0.25),
    ]
    assert metrics[2]["value"] == "NaN"
    assert metrics[3]["step"] is None
    with (tmp_path / "my_run-d33e7609.metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["time", "step", "name", "value"]
    assert [(r["step"], r["name"], float(r["value"])) for r in rows[:2]] == [
        ("1", "loss", 0.5),
        ("1", "acc", 0.25),
    ]
    assert json.loads((tmp_path / "my_run-d33e7609.hparams.json").read_text()) == {
        "lr": 1e-3,
        "layers": [2, 3],
        "batch": 32,
    }
    assert lines(tmp_path / "my_run-d33e7609.text.jsonl")[0]["text"] == "first\nsecond"
    images = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert images == [
        "my_run-d33e7609.gray_step2.png",
        "my_run-d33e7609.gray_step2_1.png",
        "my_run-d33e7609.sample_step1.png",
    ]
    assert (tmp_path / "images" / "my_run-d33e7609.sample_step1.png").read_bytes()[:4] == b"\x89PNG"
    histogram = lines(tmp_path / "my_run-d33e7609.histograms.jsonl")[0]
    assert (histogram["count"], histogram["min"], histogram["max"]) == (100, 0.0, 99.0)
    assert sum(histogram["counts"]) == 100
    assert (tmp_path / "histograms" / "my_run-d33e7609.weights_step1.png").read_bytes()[
        :4
    ] == b"\x89PNG"


def test_nested_hyperparameters_of_two_calls_are_merged_key_by_key(tmp_path):
    """Hostile finding: a second call's ``{"optimizer": {"b2": ...}}`` replaced ``optimizer``
    (b1 lost) in the file log, TensorBoard and W&B, while MLflow kept both."""
    with FileLogger("run", tmp_path) as logger:
        logger.log_hyperparams({"model": {"width": 64}, "optimizer": {"b1": 0.9}, "seed": 1})
        logger.log_hyperparams({"optimizer": {"b2": 0.99}, "seed": {"data": 2}})
    with FileLogger("run", tmp_path) as logger:  # a resumed run's merge into the file's
        logger.log_hyperparams({"optimizer": {"b1": 0.8}, "model": 3})
    assert json.loads((tmp_path / "run.hparams.json").read_text()) == {
        "model": 3,  # a leaf replaces a mapping, and a mapping a leaf
        "optimizer": {"b1": 0.8, "b2": 0.99},
        "seed": {"data": 2},
    }


def test_a_resumed_file_logger_appends_to_the_same_files(tmp_path, caplog):
    with FileLogger("run", tmp_path) as logger:
        logger.log_scalar("loss", 1.0, step=0)
    with FileLogger("run", tmp_path, resume_step=0) as logger:
        logger.log_scalar("loss", 0.5, step=1)
    assert "earlier run" not in caplog.text
    assert [m["step"] for m in lines(tmp_path / "run.metrics.jsonl")] == [0, 1]
    csv_lines = (tmp_path / "run.metrics.csv").read_text().splitlines()
    assert csv_lines[0] == "time,step,name,value"
    assert len(csv_lines) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.metrics.csv", "run.metrics.jsonl"]


def test_a_new_run_into_a_file_log_holding_an_earlier_one_is_warned_of(
    tmp_path, caplog, monkeypatch
):
    """A review as a 0.1.22 user: running a script again added its steps 0, 1, 2 after the
    first run's in the same series without a word (0.1.22 wrote each run its own file)."""
    from substrax.tracking import _log_files

    for first in (10.0, 20.0):
        monkeypatch.setattr(_log_files, "_opened", set())  # each run its own process
        with FileLogger("exp", tmp_path) as logger:
            logger.log_scalars({"loss": first}, step=0)
            logger.log_scalars({"loss": first + 1}, step=1)
    [warning] = [r.getMessage() for r in caplog.records if "earlier run" in r.getMessage()]
    assert f"FileLogger('exp'): {tmp_path} holds an earlier run's records" in warning
    assert "(the last at step 1)" in warning
    assert "resume_step=" in warning
    kept = [(0, 10.0), (1, 11.0), (0, 20.0), (1, 21.0)]  # both runs, as the warning says
    assert read_scalars(tmp_path / "exp.metrics.jsonl")["loss"] == kept


def test_a_file_log_of_records_without_a_step_is_warned_of_too(tmp_path, caplog, monkeypatch):
    """A second pass: an earlier run that logged text alone, or scalars without a step, was
    added to without a word."""
    from substrax.tracking import _log_files

    with FileLogger("exp", tmp_path) as logger:
        logger.log_text("note", "first run")
    monkeypatch.setattr(_log_files, "_opened", set())
    with FileLogger("exp", tmp_path):
        pass
    [warning] = [r.getMessage() for r in caplog.records if "earlier run" in r.getMessage()]
    assert "holds an earlier run's records; this run's are added" in warning


def test_a_file_log_this_process_opened_before_is_no_earlier_run(tmp_path, caplog):
    """A second pass: a script that closes its log after training and opens it again for the
    test metrics was told of "an earlier run"."""
    with FileLogger("exp", tmp_path) as logger:
        logger.log_scalar("loss", 1.0, step=0)
    with FileLogger("exp", tmp_path) as logger:
        logger.log_scalar("test_loss", 0.5, step=0)
    assert "earlier run" not in caplog.text


@pytest.mark.parametrize(
    ("name", "other"), [("lr=0.1/seed=0", "lr=0.1_seed=0"), ("实验一", "实验二"), ("a b", "a_b")]
)
def test_two_names_never_share_a_file_log_and_a_resume_keeps_the_others_steps(
    tmp_path, name, other
):
    """Names that are one once made file-safe (``a b``, ``a_b``; any two of Chinese) keep apart."""
    with FileLogger(name, tmp_path) as logger:
        for step in range(5):
            logger.log_scalar("loss", 0.1, step=step)
    with FileLogger(other, tmp_path, resume_step=1) as logger:  # a run of its own, resumed
        logger.log_scalar("loss", 0.2, step=2)
    with FileLogger(name, tmp_path) as logger:
        assert read_scalars(logger.metrics_jsonl) == {"loss": [(s, 0.1) for s in range(5)]}
    with FileLogger(other, tmp_path) as logger:
        assert read_scalars(logger.metrics_jsonl) == {"loss": [(2, 0.2)]}
    assert len(list(tmp_path.glob("*.metrics.jsonl"))) == 2


def test_file_logger_csv_quotes_awkward_names(tmp_path):
    with FileLogger("run", tmp_path) as logger:
        logger.log_scalar('a,b "c"', 1.0, step=0)
    with (tmp_path / "run.metrics.csv").open() as file:
        assert next(iter(csv.DictReader(file)))["name"] == 'a,b "c"'


def test_file_logger_flushes_without_close(tmp_path):
    logger = FileLogger("run", tmp_path, flush_every=0)
    logger.log_scalar("loss", 1.0, step=0)
    assert len(lines(tmp_path / "run.metrics.jsonl")) == 1
    logger.close()


_LEFT_OPEN = """
import sys
from substrax.tracking import FileLogger

logger = FileLogger("run", sys.argv[1])  # never closed, never flushed
for step in range(3):
    logger.log_scalar("loss", 1.0 / (step + 1), step=step)
if sys.argv[2] == "raise":
    raise RuntimeError("training diverged")
if sys.argv[2] == "exit":
    sys.exit(0)
"""


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("end", ["return", "raise", "exit"])
def test_a_file_logger_left_open_writes_its_last_scalars_at_exit(tmp_path, end):
    """Hostile finding: the lines waiting for the once-a-second flush were lost at exit, unless
    the logger had held a jax value (only then did it flush at exit)."""
    result = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, str(tmp_path), end],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == (1 if end == "raise" else 0), result.stderr
    assert read_scalars(tmp_path / "run.metrics.jsonl") == {
        "loss": [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    }
    rows = (tmp_path / "run.metrics.csv").read_text().splitlines()
    assert len(rows) == 4  # the header and a row a value


def test_multi_logger_fans_out_and_still_reaches_all_on_error(tmp_path):
    out = io.StringIO()

    class Broken(ConsoleLogger):
        def _write_scalars(self, _metrics, _step):
            raise RuntimeError("backend down")

    broken = Broken("broken", stream=io.StringIO())
    console = ConsoleLogger("c", stream=out)
    files = FileLogger("f", tmp_path)
    multi = MultiLogger([broken, console, files])
    with pytest.raises(RuntimeError, match="backend down"):
        multi.log_scalar("loss", 1.0, step=0)
    multi.log_text("t", "x")
    multi.close()
    assert "loss" in out.getvalue()
    assert lines(tmp_path / "f.metrics.jsonl")[0]["value"] == 1.0
    assert console.closed
    assert files.closed
    with pytest.raises(TypeError, match="Logger"):
        MultiLogger([object()])  # type: ignore[list-item]


def test_multi_logger_raises_a_refusal_every_logger_makes_once_and_warns_of_other_errors(
    tmp_path, caplog
):
    class Broken(ConsoleLogger):
        def _write_scalars(self, _metrics, _step):
            raise RuntimeError(f"{self.name} is down")

    with (
        MultiLogger([ConsoleLogger("c", stream=io.StringIO()), FileLogger("f", tmp_path)]) as multi,
        pytest.raises(LoggedTypeError, match="'x' must be a number"),
    ):
        multi.log_scalar("x", None, step=1)
    assert "also failed" not in caplog.text  # the same refusal by both: raised, not repeated
    loggers = [Broken("a", stream=io.StringIO()), Broken("b", stream=io.StringIO())]
    with MultiLogger(loggers) as multi, pytest.raises(RuntimeError, match="a is down"):
        multi.log_scalar("y", 1.0, step=1)
    assert "also failed: b is down" in caplog.text


def test_create_logger_gives_console_and_files(tmp_path):
    out = io.StringIO()
    logger = create_logger("demo", log_dir=tmp_path, stream=out)
    assert isinstance(logger, Logger)
    logger.log_hyperparams({"lr": 1e-3, "batch_size": 32})
    for step in range(3):
        logger.log_scalar("loss", 1.0 / (step + 1), step=step)
    logger.close()
    assert out.getvalue().count("loss") == 3
    assert [m["value"] for m in lines(tmp_path / "demo.metrics.jsonl")] == [1.0, 0.5, 1 / 3]
    only_console = create_logger("demo", log_to_file=False, stream=io.StringIO())
    assert isinstance(only_console, ConsoleLogger)
    with pytest.raises(ValueError, match="logs nowhere"):
        create_logger("demo", log_to_file=False, console=False)


def test_create_logger_defaults_to_the_output_dir_not_the_cwd(tmp_path, monkeypatch):
    out_root, cwd = tmp_path / "outputs", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("AVITAI_OUTPUT_DIR", str(out_root))
    with create_logger("demo", stream=io.StringIO()) as logger:
        logger.log_scalar("loss", 1.0, step=0)
    assert (out_root / "demo" / "demo.metrics.jsonl").exists()
    assert list(cwd.iterdir()) == []


def test_create_logger_with_tensorboard(tmp_path):
    with create_logger("demo", log_dir=tmp_path, console=False, tensorboard=True) as logger:
        logger.log_scalar("loss", 1.0, step=0)
    assert list((tmp_path / "tensorboard" / "demo").glob("events.out.tfevents.*"))
    assert (tmp_path / "demo.metrics.jsonl").exists()


def test_process_index_sources(monkeypatch):
    for var in ("SUBSTRAX_PROCESS_INDEX", "JAX_PROCESS_ID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    assert current_process_index() == 0
    monkeypatch.setenv("RANK", "3")
    assert current_process_index() == 3
    monkeypatch.setenv("SUBSTRAX_PROCESS_INDEX", "2")
    assert current_process_index() == 2
    assert current_process_index(5) == 5
    monkeypatch.setenv("SUBSTRAX_PROCESS_INDEX", "x")
    with pytest.raises(ValueError, match="SUBSTRAX_PROCESS_INDEX"):
        current_process_index()
    with pytest.raises(ValueError, match=r">= 0"):
        current_process_index(-1)


def test_with_jax_imported_but_no_distributed_job_the_environment_names_the_process(monkeypatch):
    """Hostile finding: a logger made after `import jax`, before jax.distributed.initialize,
    asked jax, which started its backend (the process could no longer join its job) and
    answered 0 on every process."""
    import jax

    assert not jax.distributed.is_initialized()
    for var in ("SUBSTRAX_PROCESS_INDEX", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    assert current_process_index() == 1
    monkeypatch.delenv("JAX_PROCESS_ID")
    assert current_process_index() == jax.process_index() == 0


def test_a_multilogger_of_loggers_silent_here_is_silent_here(tmp_path, caplog):
    """Hostile finding: create_logger's MultiLogger on process 1 wrote its messages (through
    Python's last-resort handler) and said process_index=0."""
    quiet = create_logger("demo", log_dir=tmp_path, stream=io.StringIO(), process_index=1)
    assert not quiet.active
    with caplog.at_level("INFO", logger="substrax.tracking.run.demo"):
        quiet.warning("from process %d", 1)
    assert not [r for r in caplog.records if r.name == "substrax.tracking.run.demo"]
    quiet.close()
    mixed = MultiLogger(
        [ConsoleLogger("c", stream=io.StringIO(), process_index=1), FileLogger("f", tmp_path)]
    )
    assert mixed.active  # one of them logs here
    mixed.close()


def test_only_process_zero_logs_unless_asked(tmp_path):
    out = io.StringIO()
    quiet = create_logger("demo", log_dir=tmp_path / "p1", stream=out, process_index=1)
    quiet.log_scalar("loss", 1.0, step=0)
    quiet.log_hyperparams({"a": 1})
    quiet.close()
    assert out.getvalue() == ""
    assert not (tmp_path / "p1").exists()
    with FileLogger("demo", tmp_path / "all", process_index=1, all_processes=True) as loud:
        loud.log_scalar("loss", 1.0, step=0)
    assert (tmp_path / "all" / "demo.p1.metrics.jsonl").exists()


@pytest.mark.usefixtures("child_processes")
def test_importing_tracking_imports_no_jax_and_no_sdk():
    code = (
        "import sys, substrax.tracking, substrax.callbacks\n"
        "bad = [m for m in ('jax', 'wandb', 'mlflow', 'tensorboardX', 'matplotlib', 'rich', 'optax') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.usefixtures("child_processes")
def test_importing_tracking_loads_each_name_on_first_use():
    code = (
        "import sys, substrax.tracking as tracking\n"
        "loaded = lambda: sorted(m for m in sys.modules if m.startswith('substrax.tracking.'))\n"
        "assert loaded() == [], loaded()\n"
        "assert tracking.FileLogger.__module__ == 'substrax.tracking._file'\n"
        "assert 'substrax.tracking._mlflow' not in loaded(), loaded()\n"
        "assert set(tracking.__all__) <= set(dir(tracking))\n"
        "assert all(getattr(tracking, name) is not None for name in tracking.__all__)\n"
        "try:\n"
        "    tracking.NoSuchName\n"
        "except AttributeError as error:\n"
        "    assert 'NoSuchName' in str(error)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.usefixtures("child_processes")
def test_plot_command_renders_png_and_html(tmp_path, capsys):
    with FileLogger("run", tmp_path) as logger:
        for step in range(5):
            logger.log_scalars({"loss": 1.0 / (step + 1), "train/acc": step / 5}, step=step)
    assert read_scalars(tmp_path / "run.metrics.jsonl")["loss"][0] == (0, 1.0)
    result = subprocess.run(
        [sys.executable, "-m", "substrax.tracking", "plot", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    page = tmp_path / "plots" / "index.html"
    assert result.stdout.strip() == str(page)
    from substrax.tracking._cli import main

    assert main(["plot", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"page": str(page)}
    html = page.read_text()
    slashed = f"run.train_acc-{hashlib.sha256(b'train/acc').hexdigest()[:8]}.png"  # no other's
    for png in ("run.loss.png", slashed):
        assert (tmp_path / "plots" / png).read_bytes()[:4] == b"\x89PNG"
        assert f'src="{png}"' in html


def test_plot_refuses_a_directory_without_a_file_log(tmp_path, capsys):
    from substrax.tracking import NoFileLogError
    from substrax.tracking._cli import main

    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl") as caught:
        plot_log_dir(tmp_path)
    assert isinstance(caught.value, NoFileLogError)
    assert caught.value.log_dir == tmp_path
    assert main(["plot", str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("python -m substrax.tracking: error: ")
    assert "holds no *.metrics.jsonl file" in line


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda root: root / "no-such-dir", "does not exist"),
        (lambda root: FileLogger("run", root).close() or root / "run.metrics.jsonl", "is a file"),
    ],
    ids=["missing", "a-file"],
)
def test_plot_names_a_missing_log_dir_or_a_file_given_for_it(tmp_path, capsys, make, said):
    """Hostile finding: both said the directory "holds no *.metrics.jsonl file"."""
    from substrax.tracking._cli import main

    assert main(["plot", str(make(tmp_path))]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert said in line
    assert main(["plot", ""]) == 2  # it plotted the working directory
    assert "LOG_DIR is empty" in capsys.readouterr().err


def test_plot_names_a_curve_it_cannot_draw_and_draws_the_others(tmp_path, caplog):
    """Hostile finding: values from -1e308 to 1e308 ended the command in matplotlib's traceback,
    and no page was written for the other metrics."""
    with FileLogger("run", tmp_path) as logger:
        logger.log_scalars({"huge": 1e308, "loss": 1.0}, step=0)
        logger.log_scalars({"huge": -1e308, "loss": 0.5}, step=1)
    page = plot_log_dir(tmp_path).read_text()
    assert 'src="run.loss.png"' in page
    assert "huge: 2 points, last -1e+308; not drawn" in page
    assert "huge of" in caplog.text


def test_plot_refuses_an_out_that_is_a_file(tmp_path, capsys):
    from substrax.tracking._cli import main

    with FileLogger("run", tmp_path / "log") as logger:
        logger.log_scalar("loss", 1.0, step=0)
    file = tmp_path / "afile"
    file.write_text("x")
    for out in (file, file / "plots"):
        assert main(["plot", "--out", str(out), str(tmp_path / "log")]) == 2
        out_text, err = capsys.readouterr()
        assert out_text == ""
        [line] = err.splitlines()
        assert line.startswith(f"python -m substrax.tracking: error: --out {out}: {file} is a file")
        assert "Errno" not in line
    assert file.read_text() == "x"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"time": 0, "step": 1, "value": 0.5}', "no 'name' field"),
        ('{"time": 0, "step": 1, "name": "loss", "value": "high"}', "'high' is neither"),
        ("[1, 2]", "has no attribute 'get'"),
    ],
)
def test_a_file_log_line_that_is_no_metric_is_named_with_its_number(tmp_path, capsys, line, reason):
    from substrax.tracking import FileLogValueError
    from substrax.tracking._cli import main

    log = tmp_path / "run.metrics.jsonl"
    log.write_text('{"time": 0, "step": 0, "name": "loss", "value": 1.0}\n' + line + "\n")
    with pytest.raises(ValueError, match=reason) as caught:
        read_scalars(log)
    assert isinstance(caught.value, FileLogValueError)
    assert (caught.value.path, caught.value.line) == (log, 2)
    assert main(["plot", str(tmp_path)]) == 2
    [error] = capsys.readouterr().err.splitlines()
    assert error.startswith(f"python -m substrax.tracking: error: line 2 of {str(log)!r} is not")


def test_read_scalars_refuses_the_csv_instead_of_reading_no_metric(tmp_path):
    """Hostile finding: given the .metrics.csv beside the log, it returned {} (no metric)."""
    from substrax.tracking import FileLogValueError

    with FileLogger("run", tmp_path) as logger:
        logger.log_scalar("loss", 0.5, step=0)
    with pytest.raises(FileLogValueError, match=r"line 1 .* no JSON object .*metrics\.csv"):
        read_scalars(logger.metrics_csv)
    (tmp_path / "cut.metrics.jsonl").write_text('\n{"time": 0, "step"')  # a crash, not a csv
    assert read_scalars(tmp_path / "cut.metrics.jsonl") == {}


@pytest.mark.parametrize("flush_every", [-1.0, math.nan])
def test_file_logger_refuses_a_flush_interval_that_is_not_seconds(tmp_path, flush_every):
    with pytest.raises(ValueError, match="flush_every="):
        FileLogger("run", tmp_path, flush_every=flush_every)


def test_the_file_log_is_strict_json_and_reads_back_non_finite_floats(tmp_path):
    with FileLogger("strict", tmp_path) as logger:
        logger.log_scalars({"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5}, step=0)
        logger.log_scalar("e", np.float32("inf"), step=1)
        logger.log_scalar("f", -math.inf, step=2)  # the fast path
        logger.log_hyperparams({"clip": math.inf})
        logger.log_histogram("empty", np.array([math.nan]), step=0)
    metrics = lines(tmp_path / "strict.metrics.jsonl")
    assert [m["value"] for m in metrics] == [
        "NaN",
        "Infinity",
        "-Infinity",
        1.5,
        "Infinity",
        "-Infinity",
    ]
    json.loads((tmp_path / "strict.hparams.json").read_text(), parse_constant=refuse_constant)
    [histogram] = lines(tmp_path / "strict.histograms.jsonl")
    assert histogram["min"] == "NaN"
    series = read_scalars(tmp_path / "strict.metrics.jsonl")
    assert math.isnan(series["a"][0][1])
    assert series["b"] == [(0, math.inf)]
    assert series["c"] == [(0, -math.inf)]
    assert series["e"] == [(1, math.inf)]
    assert series["f"] == [(2, -math.inf)]


@pytest.mark.parametrize(
    ("call", "value"),
    [
        (lambda logger: logger.log_scalar("", 1.0, step=0), 1.0),
        (lambda logger: logger.log_scalars({"ok": 1.0, "": 2.0}, step=0), 2.0),
    ],
    ids=["log_scalar", "log_scalars"],
)
def test_an_empty_metric_name_is_refused(tmp_path, call, value):
    from substrax.tracking import EmptyMetricNameError

    with FileLogger("names", tmp_path) as logger:
        with pytest.raises(EmptyMetricNameError, match="must be a non-empty string") as caught:
            call(logger)
        assert isinstance(caught.value, ValueError)
        assert (caught.value.name, caught.value.value) == ("", value)
    assert lines(tmp_path / "names.metrics.jsonl") == []
    with pytest.raises(EmptyMetricNameError):
        ConsoleLogger("c", stream=io.StringIO()).log_scalars({"": 1.0})
    # a process that does not log refuses it too: the mistake shows on every process
    with (
        FileLogger("names", tmp_path / "p1", process_index=1) as quiet,
        pytest.raises(EmptyMetricNameError),
    ):
        call(quiet)


def test_a_value_too_large_for_a_float_names_its_key(tmp_path):
    from substrax.tracking import MetricOverflowError

    with FileLogger("big", tmp_path) as logger:
        with pytest.raises(MetricOverflowError, match="'tokens_seen'") as caught:
            logger.log_scalar("tokens_seen", 10**400, step=0)
        assert isinstance(caught.value, OverflowError)
        assert caught.value.name == "tokens_seen"
        with pytest.raises(MetricOverflowError, match="'big/int'"):
            logger.log_scalars({"big/int": -(10**400)}, step=0)
        with pytest.raises(MetricOverflowError, match="'as_array'"):
            logger.log_scalar("as_array", np.array(10**400, dtype=object), step=0)
        with pytest.raises(MetricOverflowError, match="'decimal'"):  # float() made it infinite
            logger.log_scalar("decimal", decimal.Decimal("1e400"), step=0)
        logger.log_scalar("fine", 10**300, step=0)
        logger.log_scalar("infinite", decimal.Decimal("Infinity"), step=0)  # infinite already
    assert read_scalars(tmp_path / "big.metrics.jsonl") == {
        "fine": [(0, 1e300)],
        "infinite": [(0, math.inf)],
    }


def test_numpy_scalars_and_steps_are_written_as_plain_json_numbers(tmp_path):
    values = {
        "f64": np.float64(0.5),
        "f32": np.float32(0.25),
        "i64": np.int64(3),
        "mean": np.mean([0.1, 0.2]),
        "nan": np.float64("nan"),
        "decimal": decimal.Decimal("0.125"),  # a number as fractions.Fraction is
        "fraction": fractions.Fraction(1, 4),
    }
    with FileLogger("np", tmp_path) as logger:
        logger.log_scalar("one", np.float64(1.5), step=np.int64(7))
        logger.log_scalars(values, step=np.int32(8))
        logger.log_hyperparams({"lr": np.float64(0.1), "layers": [np.int64(2)]})
    metrics = lines(tmp_path / "np.metrics.jsonl")  # strict JSON: every line parses
    assert [(m["name"], m["step"], m["value"]) for m in metrics] == [
        ("one", 7, 1.5),
        ("f64", 8, 0.5),
        ("f32", 8, 0.25),
        ("i64", 8, 3.0),
        ("mean", 8, float(np.mean([0.1, 0.2]))),
        ("nan", 8, "NaN"),
        ("decimal", 8, 0.125),
        ("fraction", 8, 0.25),
    ]
    rows = list(csv.DictReader(io.StringIO((tmp_path / "np.metrics.csv").read_text())))
    assert [(r["step"], r["value"]) for r in rows] == [
        ("7", "1.5"),
        ("8", "0.5"),
        ("8", "0.25"),
        ("8", "3.0"),
        ("8", repr(float(np.mean([0.1, 0.2])))),
        ("8", "nan"),
        ("8", "0.125"),
        ("8", "0.25"),
    ]
    assert len(read_scalars(tmp_path / "np.metrics.jsonl")) == 8
    assert json.loads((tmp_path / "np.hparams.json").read_text()) == {"layers": [2], "lr": 0.1}


def test_the_file_log_writes_its_messages_to_log_file(tmp_path):
    with FileLogger("msgs", tmp_path) as logger:
        logger.python_logger.setLevel(logging.INFO)
        logger.info("epoch %d done", 3)
        logger.debug("not at this level")
        assert logger.metrics_file == logger.metrics_csv
    logger.python_logger.setLevel(logging.NOTSET)
    lines = logger.log_file.read_text().splitlines()
    assert logger.log_file == tmp_path / "msgs.log"
    assert len(lines) == 1
    assert lines[0].endswith("INFO epoch 3 done")
    assert not logger.python_logger.handlers  # closed: the file's handler is gone


@pytest.mark.parametrize(
    ("name", "shown"),
    [("acc\ud800", "'\\ud800'"), ("a\nb", "'\\n'"), ("a\rb", "'\\r'")],
    ids=["lone-surrogate", "newline", "carriage-return"],
)
def test_a_metric_name_no_file_can_hold_is_refused_at_the_call_by_every_logger(
    tmp_path, name, shown
):
    from substrax.tracking import LoggedTypeError

    with FileLogger("names", tmp_path, flush_every=3600) as logger:
        logger.log_scalar("loss", 1.0, step=0)
        for call in (
            lambda: logger.log_scalar(name, 0.5, step=1),
            lambda: logger.log_scalars({"ok": 2.0, name: 0.5}, step=1),
            lambda: ConsoleLogger("c", stream=io.StringIO()).log_scalar(name, 0.5),
        ):
            with pytest.raises(LoggedTypeError, match="metric name") as caught:
                call()
            assert repr(name) in str(caught.value)
            assert shown in str(caught.value)
        logger.log_scalar("loss", 2.0, step=2)
        logger.log_scalar("héllo wörld\ttab", 3.0, step=3)  # other characters are fine
    assert [(r["name"], r["step"]) for r in lines(tmp_path / "names.metrics.jsonl")] == [
        ("loss", 0),
        ("loss", 2),
        ("héllo wörld\ttab", 3),
    ]
    assert len((tmp_path / "names.metrics.csv").read_text().splitlines()) == 4


def test_a_line_the_file_log_cannot_encode_never_loses_the_lines_taken_with_it(tmp_path):
    with FileLogger("enc", tmp_path, flush_every=3600) as logger:
        for step in range(3):
            logger.log_scalar("loss", float(step), step=step)
        logger._names["bad\ud800"] = ('"bad\\ud800"', "bad\ud800")  # past the call's check
        logger._pending.append((0.0, 3, "bad\ud800", 1.0))
        logger.log_scalar("loss", 4.0, step=4)
    assert [r["step"] for r in lines(tmp_path / "enc.metrics.jsonl")] == [0, 1, 2, 3, 4]
    assert len((tmp_path / "enc.metrics.csv").read_text().splitlines()) == 6


def test_file_logger_from_several_threads_loses_no_row(tmp_path):
    import threading

    errors = []
    with FileLogger("threads", tmp_path, flush_every=0) as logger:

        def work(k):
            try:
                for step in range(3000):
                    logger.log_scalar(f"m{k}", float(step), step=step)
                    if step % 500 == 0:
                        logger.log_text("note", f"{k} {step}", step=step)
            except Exception as error:
                errors.append(error)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    scalars = read_scalars(tmp_path / "threads.metrics.jsonl")
    assert {name: sorted(step for step, _ in points) for name, points in scalars.items()} == {
        f"m{k}": list(range(3000)) for k in range(4)
    }
    assert len(lines(tmp_path / "threads.text.jsonl")) == 24
    with (tmp_path / "threads.metrics.csv").open(newline="") as file:
        assert len(list(csv.reader(file))) == 1 + 4 * 3000


def test_resume_keeps_a_csv_row_whose_name_holds_a_line_separator(tmp_path):
    names = {"loss": 0, 'q"uo,te': 1, "a\u2028b": 2, "c\x85d": 3}
    with FileLogger("r", tmp_path) as logger:
        for step in range(10):
            logger.log_scalars({name: float(step) for name in names}, step=step)
    with FileLogger("r", tmp_path, resume_step=4) as logger:
        assert logger.dropped_records == 5 * len(names)
    with (tmp_path / "r.metrics.csv").open(newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    assert len(rows) == 1 + 5 * len(names)
    assert sorted({row[2] for row in rows[1:]}) == sorted(names)
    assert {row[1] for row in rows[1:]} == {str(step) for step in range(5)}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"time": 0, "step": 1, "name": "\xff\xfe", "value": 1}', "is not UTF-8 text"),
        (b'{"time": 0, "step": 1e400, "name": "loss", "value": 1}', "infinity"),
        (b'{"time": 0, "step": 1, "name": ["a"], "value": 1}', r"its name \['a'\] is not a string"),
    ],
    ids=["not-utf8", "step-inf", "name-list"],
)
def test_plot_reports_a_hostile_line_in_one_line_naming_it(tmp_path, capsys, line, reason):
    from substrax.tracking import FileLogValueError
    from substrax.tracking._cli import main

    log = tmp_path / "run.metrics.jsonl"
    log.write_bytes(b'{"time": 0, "step": 0, "name": "loss", "value": 1.0}\n' + line + b"\n")
    with pytest.raises(FileLogValueError, match=reason) as caught:
        read_scalars(log)
    assert caught.value.line == 2
    assert main(["plot", str(tmp_path)]) == 2
    [error] = capsys.readouterr().err.splitlines()
    assert error.startswith(f"python -m substrax.tracking: error: line 2 of {str(log)!r} is not")
    log.write_bytes(b'{"time": 0, "step": 0, "name": "loss", "value": 1.0}\n{"name": "\xc3')
    assert read_scalars(log) == {"loss": [(0, 1.0)]}  # a last line cut inside a character


@pytest.mark.parametrize("timeout", ["1e300", "1e10"])
def test_replay_refuses_a_timeout_past_the_longest_wait_in_one_line(tmp_path, capsys, timeout):
    from substrax.tracking._cli import main

    spool = tmp_path / "run.spool.jsonl"
    spool.write_text("")
    assert main(["replay", str(spool), "--timeout", timeout]) == 2
    [error] = capsys.readouterr().err.splitlines()
    assert error.startswith(
        f"python -m substrax.tracking: error: --timeout={float(timeout)} is past"
    )
    assert main(["replay", str(spool), "--timeout", "9e9"]) == 0


def test_console_hyperparams_of_keys_of_several_types_print_without_a_raw_error():
    out = io.StringIO()
    with ConsoleLogger("run", stream=out) as logger:
        logger.log_hyperparams({1: "a", "b": 2, (3, 4): {5: 6, "c": 7}})
    assert '[run] hyperparams {"(3, 4)": {"5": 6, "c": 7}, "1": "a", "b": 2}' in out.getvalue()


def test_a_histogram_of_values_that_are_not_numbers_is_refused_naming_it(tmp_path):
    from substrax.tracking import LoggedTypeError

    for logger in (ConsoleLogger("c", stream=io.StringIO()), FileLogger("f", tmp_path)):
        with logger, pytest.raises(LoggedTypeError, match="histogram 'weights' must be"):
            logger.log_histogram("weights", ["a"], step=1)


def test_a_one_element_array_is_logged_as_its_number(tmp_path):
    # numpy 2.5 refuses float() of a 1-d array; the logger reads its one element
    from substrax.tracking import LoggedTypeError

    with FileLogger("one", tmp_path) as logger:
        logger.log_scalars({"a": np.array([1.5]), "b": np.zeros((1, 1))}, step=0)
        with pytest.raises(LoggedTypeError, match="'c' must be a number"):
            logger.log_scalar("c", np.array(["x"]), step=1)
    assert read_scalars(tmp_path / "one.metrics.jsonl") == {"a": [(0, 1.5)], "b": [(0, 0.0)]}


@pytest.fixture
def held_encoder(monkeypatch):
    """PIL's PNG encoder made to wait for ``gate`` (10 s at most), recording the thread it ran on."""
    image_module = pytest.importorskip("PIL.Image", reason="Pillow (the plots extra) encodes")
    gate, threads = threading.Event(), []
    real_save = image_module.Image.save

    def save(image, *args, **kwargs):
        threads.append(threading.current_thread())
        gate.wait(10)
        return real_save(image, *args, **kwargs)

    monkeypatch.setattr(image_module.Image, "save", save)
    return gate, threads


@pytest.mark.parametrize("kind", ["file", "tensorboard"])
def test_an_image_is_encoded_off_the_calling_thread_from_a_copy_of_its_pixels(
    tmp_path, held_encoder, kind
):
    """Hostile finding: a 10000x10000x3 image blocked the training thread for 30-40 s, encoding
    its PNG in the call."""
    gate, threads = held_encoder
    if kind == "file":
        logger = FileLogger("run", tmp_path)
    else:
        pytest.importorskip("tensorboardX", reason="the tensorboard extra is needed")
        from substrax.tracking import TensorBoardLogger

        logger = TensorBoardLogger("run", tmp_path)
    image = np.full((6, 5, 3), 200, np.uint8)
    started = time.monotonic()
    logger.log_image("big", image, step=0)
    took = time.monotonic() - started
    image[:] = 0  # the caller reuses its buffer at once
    gate.set()
    logger.close()
    assert took < 5, f"log_image waited {took:.1f} s for the encoder"
    assert threads, "nothing was encoded"
    assert threading.current_thread() not in threads
    image_module = pytest.importorskip("PIL.Image", reason="Pillow reads the pixels back")
    if kind == "file":
        stored = np.asarray(image_module.open(tmp_path / "images" / "run.big_step0.png"))
    else:
        event_accumulator = pytest.importorskip(
            "tensorboard.backend.event_processing.event_accumulator",
            reason="the tensorboard package (dev dependency) reads the event files back",
        )
        accumulator = event_accumulator.EventAccumulator(str(tmp_path))
        accumulator.Reload()
        encoded = accumulator.Images("big")[0].encoded_image_string
        stored = np.asarray(image_module.open(io.BytesIO(encoded)))
    assert stored.shape == (6, 5, 3)
    assert (stored == 200).all()


def test_an_image_a_full_disk_refuses_is_named_in_a_warning_and_raises_nothing(
    tmp_path, monkeypatch, caplog
):
    image_module = pytest.importorskip("PIL.Image", reason="Pillow (the plots extra) encodes")

    def full_disk(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(image_module.Image, "save", full_disk)
    with FileLogger("run", tmp_path) as logger:
        logger.log_image("img", np.zeros((4, 4, 3)), step=0)
        logger.flush()  # as for lines, a full disk does not stop the run
        logger.log_scalar("loss", 1.0, step=0)
    [warning] = [r.getMessage() for r in caplog.records if "could not be written" in r.getMessage()]
    assert str(tmp_path / "images" / "run.img_step0") in warning
    assert "No space left" in warning
    assert read_scalars(logger.metrics_jsonl) == {"loss": [(0, 1.0)]}


def test_multi_logger_uploads_an_artifact_to_mlflow_and_passes_the_local_loggers_by(
    tmp_path, sqlite_uri
):
    """Hostile finding: MultiLogger had no log_artifact, which its remote loggers have."""
    from mlflow.tracking import MlflowClient

    from substrax.tracking import MLFlowLogger, UploadNotFoundError

    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    remote = MLFlowLogger("multi", tracking_uri=sqlite_uri, log_dir=tmp_path / "mlflow")
    local = [ConsoleLogger("multi", stream=io.StringIO()), FileLogger("multi", tmp_path / "files")]
    with MultiLogger([*local, remote]) as multi:
        multi.log_artifact(model, "models")
        missing = tmp_path / "no" / "such.bin"
        with pytest.raises(UploadNotFoundError, match=str(missing)) as raised:
            multi.log_artifact(missing)
        assert isinstance(raised.value, FileNotFoundError)
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert [a.path for a in client.list_artifacts(remote.run_id, "models")] == ["models/model.bin"]
    with pytest.raises(LoggerClosedError):
        multi.log_artifact(model)


def test_media_of_names_that_clean_to_one_file_name_never_share_a_file(tmp_path):
    """Hostile finding 7: "a b" and "a:b" at one step were both written to c.a_b_step1.png, the
    second overwriting the first."""
    import hashlib

    def digest(name):
        return hashlib.sha256(name.encode()).hexdigest()[:8]

    with FileLogger("c", tmp_path) as logger:
        for value, name in enumerate(("a b", "a:b", "a_b", "sample")):
            logger.log_image(name, np.full((2, 2), value / 4), step=1)
            logger.log_histogram(name, [1.0, float(value + 2)], step=1)
    expected = [
        f"c.a_b-{digest('a b')}_step1.png",
        f"c.a_b-{digest('a:b')}_step1.png",
        "c.a_b_step1.png",  # a file-safe name keeps its file name
        "c.sample_step1.png",
    ]
    for kind in ("images", "histograms"):
        assert sorted(p.name for p in (tmp_path / kind).iterdir()) == sorted(expected)


def test_media_of_a_name_past_a_file_names_bytes_are_written_under_a_cut_name_and_its_hash(
    tmp_path,
):
    """Hostile finding: a metric name of 300 characters made a media file name past 255 bytes."""
    long_names = ["m" * 300 + "1", "m" * 300 + "2", "é" * 200]  # the first two differ at the end
    with FileLogger("c", tmp_path) as logger:
        for name in long_names:
            logger.log_image(name, np.zeros((2, 2)), step=1)
            logger.log_histogram(name, [1.0, 2.0], step=1)
    for kind in ("images", "histograms"):
        names = [p.name for p in (tmp_path / kind).iterdir()]
        assert len(names) == 3
        assert all(len(n.encode()) <= 255 and n.endswith("_step1.png") for n in names)


def test_a_value_no_later_call_writes_is_written_flush_every_later(tmp_path, wait_for):
    """Multi-process review: a run that logged step 1, then hung in a save and was killed, left
    an empty metrics file: the lines waited for a later logging call, which never came."""
    logger = FileLogger("run", tmp_path, flush_every=0.2)
    logger.log_scalar("loss", 0.5, step=0)  # both wait for the interval: no call comes after
    logger.log_scalar("loss", 0.25, step=1)
    wait_for(lambda: len(read_scalars(logger.metrics_jsonl).get("loss", [])) == 2, timeout=30)
    assert read_scalars(logger.metrics_jsonl)["loss"] == [(0, 0.5), (1, 0.25)]
    assert logger.metrics_csv.read_text().splitlines()[-1].split(",")[1:] == ["1", "loss", "0.25"]
    logger.close()
    assert read_scalars(logger.metrics_jsonl)["loss"] == [(0, 0.5), (1, 0.25)]  # each once


@pytest.mark.usefixtures("child_processes")
def test_a_forked_child_never_writes_the_lines_its_parent_holds(tmp_path):
    """Review of the writer thread: each forked child that closed its copy of the logger wrote
    the parent's waiting step again (6 copies of one step after 5 forks)."""
    program = f"""
import os
from substrax.tracking import FileLogger
logger = FileLogger("run", {str(tmp_path)!r}, flush_every=60)
logger.log_scalar("parent", 1.0, step=1)  # waits for the next flush: the parent's to write
for step in (100, 101):
    child = os.fork()
    if child == 0:  # the child's own lines are its to write
        logger.log_scalar("child", 1.0, step=step)
        logger.close()
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
logger.close()
"""
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)
    logged = read_scalars(tmp_path / "run.metrics.jsonl")
    assert logged == {"parent": [(1, 1.0)], "child": [(100, 1.0), (101, 1.0)]}


@pytest.mark.parametrize("step", [1, None])
def test_an_image_or_plot_logged_again_under_its_name_and_step_keeps_every_file(tmp_path, step):
    """A hostile review: the second image of a name at a step (or without one) overwrote the
    first, and so did a list's first image, and a histogram's plot."""
    pytest.importorskip("matplotlib", reason="the plots extra writes PNGs")
    from PIL import Image

    with FileLogger("run", tmp_path) as logger:
        logger.log_image("sample", np.zeros((2, 2)), step=step)
        logger.log_image("sample", np.ones((2, 2)), step=step)
        logger.log_image("grid", [np.zeros((2, 2)), np.zeros((2, 2))], step=step)
        logger.log_image("grid", np.ones((2, 2)), step=step)
        logger.log_histogram("h", [1.0, 2.0], step=step)
        logger.log_histogram("h", [3.0, 4.0], step=step)
    pixels = sorted(
        int(np.asarray(Image.open(path)).max()) for path in (tmp_path / "images").iterdir()
    )
    assert pixels == [0, 0, 0, 255, 255]
    assert len(list((tmp_path / "histograms").iterdir())) == 2


def test_two_file_logs_in_one_folder_whose_image_names_meet_keep_both_images(tmp_path):
    """A hostile review: ``exp``'s image ``val.sample`` and ``exp.val``'s ``sample`` have one
    file name; the second took it while the first was still being written, and overwrote it."""
    pytest.importorskip("matplotlib", reason="the plots extra writes PNGs")
    from PIL import Image

    with FileLogger("exp", tmp_path) as train, FileLogger("exp.val", tmp_path) as val:
        train.log_image("val.sample", np.zeros((1024, 1024)), step=1)  # slow to write
        val.log_image("sample", np.ones((2, 2)), step=1)
    pixels = sorted(
        int(np.asarray(Image.open(path)).max()) for path in (tmp_path / "images").iterdir()
    )
    assert pixels == [0, 255]


def test_a_histogram_s_statistics_show_its_nan_and_infinite_values(tmp_path):
    """A hostile review: min, max, mean and std left out inf and NaN, so grads/max never showed
    a blow-up; the bins still hold the finite values."""
    out = io.StringIO()
    with FileLogger("run", tmp_path) as logger, ConsoleLogger("c", stream=out) as console:
        for each in (logger, console):
            each.log_histogram("inf", np.array([0.1, 0.2, np.inf]), step=0)
            each.log_histogram("nan", np.array([0.1, np.nan]), step=0)
    records = {
        r["name"]: r
        for r in map(json.loads, (tmp_path / "run.histograms.jsonl").read_text().splitlines())
    }
    # the file log writes what strict JSON lacks as text, as it does a metric's
    assert (records["inf"]["max"], records["inf"]["min"], records["inf"]["count"]) == (
        "Infinity",
        0.1,
        3,
    )
    assert sum(records["inf"]["counts"]) == 2
    assert records["nan"]["max"] == "NaN"
    assert "inf: histogram n=3 min=0.1 max=inf" in out.getvalue()


@pytest.mark.parametrize(
    "values",
    [None, [1j, 2j], [[1.0], [1.0, 2.0]], ["a"], np.array(["2024-01-01"], dtype="datetime64[D]")],
    ids=["None", "complex", "ragged", "str", "datetime"],
)
def test_a_histogram_of_no_real_numbers_is_refused_by_every_logger(tmp_path, values):
    """A hostile review: None was a histogram of one NaN, a complex array lost its imaginary
    part, and TensorBoard raised numpy's bare ValueError naming no histogram."""
    from substrax.tracking import TensorBoardLogger

    loggers = (
        ConsoleLogger("c", stream=io.StringIO()),
        FileLogger("f", tmp_path),
        TensorBoardLogger("t", tmp_path / "tb"),
    )
    for logger in loggers:
        with logger, pytest.raises(LoggedTypeError, match="histogram 'weights' must be"):
            logger.log_histogram("weights", values, step=1)


def test_numpy_values_of_ml_dtypes_are_numbers(tmp_path):
    """A hostile review: numpy's bfloat16 and float8 values were refused as "not a number",
    though a jax bfloat16 array was taken."""
    import ml_dtypes

    with FileLogger("run", tmp_path) as logger:
        logger.log_scalars(
            {
                "bf16": np.array(0.5, dtype=ml_dtypes.bfloat16),
                "one": np.array([1.5], dtype=ml_dtypes.bfloat16),
                "scalar": np.array(2.0, dtype=ml_dtypes.bfloat16)[()],
                "f8": np.array(0.5, dtype=ml_dtypes.float8_e4m3fn),
                "i4": np.array(3, dtype=ml_dtypes.int4),
            },
            step=0,
        )
        logger.log_histogram("h", np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16), step=0)
        with pytest.raises(LoggedTypeError, match="'raw' must be a number"):
            logger.log_scalar("raw", np.zeros(1, dtype="V4"), step=1)
    assert read_scalars(tmp_path / "run.metrics.jsonl") == {
        "bf16": [(0, 0.5)],
        "one": [(0, 1.5)],
        "scalar": [(0, 2.0)],
        "f8": [(0, 0.5)],
        "i4": [(0, 3.0)],
    }


def test_a_histogram_of_one_value_too_large_for_numpy_s_half_unit_range_is_written(tmp_path):
    """A hostile review: uint64's largest value raised "Too many bins for data range" (numpy
    puts one value in a bin of +-0.5 around it, which a float that large cannot hold)."""
    with FileLogger("run", tmp_path) as logger:
        logger.log_histogram("big", np.array([2**64 - 1, 2**64 - 1], dtype=np.uint64), step=0)
    record = json.loads((tmp_path / "run.histograms.jsonl").read_text())
    assert (record["count"], record["counts"]) == (2, [2])


def test_threads_logging_one_histogram_at_one_step_keep_every_plot(tmp_path):
    """A second pass: two threads picked the same free plot name, and one plot replaced the other
    (20 of 80 kept)."""
    pytest.importorskip("matplotlib", reason="the plots extra writes PNGs")
    with FileLogger("run", tmp_path) as logger:

        def log() -> None:
            for step in range(5):
                logger.log_histogram("h", np.arange(10.0), step=step)

        threads = [threading.Thread(target=log) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(list((tmp_path / "histograms").iterdir())) == 20
