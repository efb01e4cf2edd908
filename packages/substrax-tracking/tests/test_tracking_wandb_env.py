"""WandbLogger honours W&B's own variables: runs under WANDB_DIR, WANDB_PROJECT/_TAGS/_RUN_ID.

Offline runs are read back from their run files with wandb's own record reader.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from substrax.tracking import WandbLogger


pytest.importorskip("wandb", reason="the wandb extra is needed for WandbLogger")


@pytest.fixture
def offline(wandb_offline, monkeypatch, tmp_path):
    for name in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_TAGS", "WANDB_RUN_ID", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AVITAI_OUTPUT_DIR", str(tmp_path / "outputs"))  # spool and media


def run_and_steps(runs):
    """The run record (None before it is written) and the logged steps in ``runs``."""
    run, steps = None, set()
    for kind, record in (item for records in runs for item in records):
        if kind == "run":
            run = record.run
        elif kind == "history":
            steps.add(record.history.step.num)
    return run, steps


@pytest.fixture
def run_record(wandb_runs):
    """``run_record(root)``: the run record and logged steps of the one offline run under root."""

    def read(root):
        def written(runs):
            run, steps = run_and_steps(runs)
            return run is not None and steps

        return run_and_steps(wandb_runs.wait(root, written))

    return read


def test_offline_runs_go_under_wandb_dir(offline, run_record, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    with WandbLogger("env", project="substrax-tests") as logger:
        logger.log_scalar("loss", 0.5, step=3)
    assert logger.root_dir == tmp_path / "wandb-dir"
    run, steps = run_record(tmp_path / "wandb-dir")
    assert run.run_id == logger.run_id
    assert steps == {3}
    assert not list((tmp_path / "outputs").rglob("offline-run-*"))  # only the spool lives there


def test_an_explicit_directory_wins_over_wandb_dir(offline, run_record, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    with WandbLogger("explicit", project="substrax-tests", log_dir=tmp_path / "logs") as logger:
        logger.log_scalar("loss", 0.5, step=1)
    with WandbLogger("init-dir", project="substrax-tests", dir=str(tmp_path / "chosen")) as other:
        other.log_scalar("loss", 0.5, step=1)
    assert run_record(tmp_path / "logs")[0].run_id == logger.run_id
    assert run_record(tmp_path / "chosen")[0].run_id == other.run_id
    assert not (tmp_path / "wandb-dir").exists()


def test_without_any_directory_runs_last_outside_the_temporary_directory(
    offline, run_record, monkeypatch, tmp_path
):
    monkeypatch.delenv("AVITAI_OUTPUT_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    temporary = tmp_path / "tmp"  # the run's default output directory goes here, not in /tmp
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    with WandbLogger("lasting", project="substrax-tests") as logger:
        logger.log_scalar("loss", 0.5, step=1)
    assert logger.root_dir == tmp_path / "data" / "substrax"
    assert run_record(logger.root_dir)[0].run_id == logger.run_id
    monkeypatch.delenv("XDG_DATA_HOME")
    default = WandbLogger("where", project="substrax-tests", process_index=1)  # starts no run
    assert default.root_dir == Path.home() / ".local" / "share" / "substrax"
    assert not default.root_dir.is_relative_to(tempfile.gettempdir())
    default.close()


@pytest.mark.usefixtures("child_processes")
def test_wandb_variables_apply_where_no_argument_is_given(
    offline, run_record, monkeypatch, tmp_path
):
    # W&B reads some variables (WANDB_TAGS) once per process: set them before it starts, as a
    # user does
    child = "from substrax.tracking import WandbLogger\n" + (
        "with WandbLogger('vars') as logger:\n    logger.log_scalar('loss', 0.5, step=1)\n"
    )
    env = {
        **os.environ,
        "WANDB_DIR": str(tmp_path / "wandb-dir"),
        "WANDB_PROJECT": "from-env",
        "WANDB_TAGS": "nightly,env",
        "WANDB_RUN_ID": "envrun123",
    }
    result = subprocess.run(
        [sys.executable, "-c", child],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run, steps = run_record(tmp_path / "wandb-dir")
    assert (run.run_id, run.project, sorted(run.tags)) == (
        "envrun123",
        "from-env",
        ["env", "nightly"],
    )
    assert steps == {1}

    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "second"))
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    with WandbLogger("args", project="from-arg", tags=["mine"]) as logger:
        logger.log_scalar("loss", 0.5, step=1)
    run, _ = run_record(tmp_path / "second")
    assert (run.project, list(run.tags)) == ("from-arg", ["mine"])  # an argument wins


def test_a_relative_xdg_data_home_is_ignored(monkeypatch, tmp_path):
    from substrax.tracking._wandb import wandb_root_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path / "..")
    root = wandb_root_dir("demo", None, {}, env={"XDG_DATA_HOME": "relative/data"})
    assert root == tmp_path.resolve() / ".local" / "share" / "substrax"


def test_a_log_dir_that_cannot_be_created_is_refused_up_front(offline, tmp_path):
    from substrax.tracking import LogDirNotWritableError

    (tmp_path / "a-file").write_text("")
    with pytest.raises(LogDirNotWritableError) as raised:
        WandbLogger("refused", log_dir=tmp_path / "a-file" / "runs")
    assert raised.value.path == tmp_path / "a-file" / "runs"
    assert "pass a writable log_dir=" in str(raised.value)


@pytest.mark.usefixtures("child_processes")
def test_an_unwritable_wandb_dir_is_refused_not_replaced_by_tmp(offline, tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    command = [sys.executable, "-c", "from substrax.tracking import WandbLogger; WandbLogger('ro')"]
    if os.geteuid() == 0:  # root writes anywhere, unless it gives up that capability
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a directory unwritable")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "WANDB_DIR": str(read_only)},
    )
    assert result.returncode == 1
    assert (
        f"LogDirNotWritableError: WandbLogger: cannot write to the directory '{read_only}/wandb'"
        in result.stderr
    )
    assert not (read_only / "wandb").exists()
