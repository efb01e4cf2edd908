"""A run that fails ends as failed: MLflow status FAILED on a real server, a W&B exit code != 0."""

import os
import subprocess
import sys
import textwrap
import weakref

import pytest

from substrax.tracking import (
    ConsoleLogger,
    FileLogger,
    MLFlowLogger,
    MultiLogger,
    WandbLogger,
    _failure,
    replay_spool,
)


pytest.importorskip("mlflow", reason="the mlflow extra is needed for MLFlowLogger")
pytest.importorskip("wandb", reason="the wandb extra is needed for WandbLogger")
from mlflow.tracking import MlflowClient


pytestmark = pytest.mark.xdist_group("mlflow_server")


class TrainingDivergedError(RuntimeError):
    """What the training code raises in these tests."""


def diverge(logger):
    """A training loop that logs a step, then raises."""
    logger.log_scalar("loss", 1.0, step=0)
    raise TrainingDivergedError("loss is nan")


def exit_codes(runs):
    """The exit codes the runs recorded, in the order of their files."""
    return [record.exit.exit_code for records in runs for kind, record in records if kind == "exit"]


@pytest.fixture
def wandb_exit_code(wandb_runs):
    """``wandb_exit_code(root)``: the offline run's exit code (None if no exit record came)."""

    def read(root):
        codes = exit_codes(wandb_runs.wait(root, exit_codes))
        return codes[0] if codes else None

    return read


def test_a_raising_block_leaves_a_failed_mlflow_run_on_the_server(mlflow_server, tmp_path):
    logger = MLFlowLogger(
        "fails", experiment_name="failures", tracking_uri=mlflow_server.uri, log_dir=tmp_path
    )
    with pytest.raises(TrainingDivergedError), logger:
        diverge(logger)
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FAILED"
    assert [m.value for m in client.get_metric_history(logger.run_id, "loss")] == [1.0]

    with MLFlowLogger(
        "passes", experiment_name="failures", tracking_uri=mlflow_server.uri, log_dir=tmp_path
    ) as logger:
        logger.log_scalar("loss", 1.0, step=0)
    assert client.get_run(logger.run_id).info.status == "FINISHED"


def test_a_raising_block_gives_the_wandb_run_a_non_zero_exit_code(
    wandb_offline, wandb_exit_code, tmp_path
):
    logger = WandbLogger("fails", project="substrax-tests", log_dir=tmp_path / "fails")
    with pytest.raises(TrainingDivergedError), logger:
        diverge(logger)
    assert logger.failed
    assert wandb_exit_code(tmp_path / "fails") == 1
    with WandbLogger("passes", project="substrax-tests", log_dir=tmp_path / "passes") as logger:
        logger.log_scalar("loss", 1.0, step=0)
    assert wandb_exit_code(tmp_path / "passes") == 0


def test_finish_with_an_exit_code_and_a_clean_system_exit(wandb_offline, wandb_exit_code, tmp_path):
    logger = WandbLogger("coded", project="substrax-tests", log_dir=tmp_path / "coded")
    logger.finish(exit_code=3)
    assert wandb_exit_code(tmp_path / "coded") == 3
    with pytest.raises(SystemExit), FileLogger("done", tmp_path / "files") as files:
        sys.exit(0)  # a clean exit is not a failure
    assert not files.failed


def test_a_multi_logger_marks_each_logger_failed(tmp_path):
    files, console = FileLogger("a", tmp_path), ConsoleLogger("b", stream=None)
    with pytest.raises(KeyError), MultiLogger([files, console]):
        raise KeyError("batch")
    assert files.failed
    assert console.failed


def test_the_excepthook_is_chained_while_a_logger_is_open_and_restored_after(monkeypatch, tmp_path):
    seen = []

    def previous(exc_type, exc, traceback):
        seen.append(exc)

    monkeypatch.setattr(sys, "excepthook", previous)
    monkeypatch.setattr(_failure, "_OPEN", weakref.WeakSet())  # no other test's loggers
    monkeypatch.setattr(_failure, "_installed", False)
    monkeypatch.setattr(_failure, "_previous", None)
    logger = FileLogger("hooked", tmp_path)
    assert sys.excepthook is not previous
    error = TrainingDivergedError("uncaught")
    sys.excepthook(type(error), error, None)
    assert logger.failed
    assert seen == [error]  # the previous hook still ran (it prints the traceback)
    logger.close()
    assert sys.excepthook is previous


@pytest.mark.usefixtures("child_processes")
def test_a_process_dying_of_an_exception_leaves_failed_runs(
    mlflow_server, wandb_offline, wandb_exit_code, tmp_path
):
    child = textwrap.dedent(
        f"""
        from substrax.tracking import MLFlowLogger, WandbLogger
        mlflow = MLFlowLogger(
            "died", experiment_name="failures", tracking_uri={mlflow_server.uri!r},
            log_dir={str(tmp_path / "mlflow")!r},
        )
        wandb = WandbLogger("died", project="substrax-tests", log_dir={str(tmp_path / "wandb")!r})
        print(mlflow.run_id, flush=True)
        for step in range(3):
            mlflow.log_scalar("loss", float(step), step=step)
            wandb.log_scalar("loss", float(step), step=step)
        raise RuntimeError("the training loop died")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    # the usual traceback, once: W&B's hook prints it too, then calls the one it replaced
    assert result.stderr.count("RuntimeError: the training loop died") == 1, result.stderr
    run_id = result.stdout.split()[0]
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    assert client.get_run(run_id).info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0, 1, 2]
    assert wandb_exit_code(tmp_path / "wandb") == 1


def test_a_killed_attempts_replay_leaves_the_run_to_a_later_attempt_logging_elsewhere(
    mlflow_server, tmp_path, spool_scalars
):
    """A killed attempt's spool, replayed while a later attempt that resumed the run logs from
    another directory (a hostile review): the run ended FAILED under the live attempt, and stayed
    FAILED after it closed. The attempt tag says who holds the run; a run no later attempt took
    (or one resumed here and killed again, whose lock names the last attempt) still ends FAILED."""
    from substrax.tracking._live import hold_live, process_attempt
    from substrax.tracking._mlflow_sink import ATTEMPT_TAG, MlflowSink
    from substrax.tracking._send import run_of

    uri, client = mlflow_server.uri, MlflowClient(tracking_uri=mlflow_server.uri)
    experiment = client.create_experiment(f"taken-{tmp_path.name}")
    statuses = {}
    for case in ("taken elsewhere", "not taken", "killed twice here"):
        run_id = client.create_run(experiment).info.run_id
        spool = tmp_path / case / "run.spool.jsonl"
        spool.parent.mkdir()
        target = {"backend": "mlflow", "tracking_uri": uri, "run_id": run_id}
        spool_scalars(spool, target, range(3, 5), {"loss": 1.0})  # sent late: left by the kill
        attempts = ["killed", "again"] if case == "killed twice here" else ["killed"]
        for attempt in attempts:  # each sets the tag at its start; the kill leaves its lock file
            client.set_tag(run_id, ATTEMPT_TAG, attempt)
            os.close(hold_live(spool, run_of(target), attempt))
        later = None
        if case == "taken elsewhere":
            later = MLFlowLogger(
                "run", tracking_uri=uri, log_dir=tmp_path / "b", run_id=run_id, resume_step=2
            )
        assert replay_spool(spool, timeout=60).delivered == 2
        statuses[case] = [client.get_run(run_id).info.status]
        if later is not None:
            later.close()
            statuses[case].append(client.get_run(run_id).info.status)
        assert [m.step for m in client.get_metric_history(run_id, "loss")] == [3, 4]
    assert statuses == {
        "taken elsewhere": ["RUNNING", "FINISHED"],
        "not taken": ["FAILED"],
        "killed twice here": ["FAILED"],
    }
    # the loggers of one process (a train and an eval logger of one run) are one attempt
    sinks = [MlflowSink(uri, run_id=run_id) for _ in range(2)]
    assert [sink.attempt for sink in sinks] == [process_attempt()] * 2


@pytest.mark.usefixtures("child_processes")
def test_dropped_loggers_and_multiprocessing_workers_end_their_runs(mlflow_server, tmp_path):
    child = textwrap.dedent(
        f"""
        import multiprocessing, sys
        from substrax.tracking import MLFlowLogger

        def train(name):
            logger = MLFlowLogger(  # never closed: dropped when train returns or raises
                name, experiment_name="dropped", tracking_uri={mlflow_server.uri!r},
                log_dir={str(tmp_path)!r},
            )
            logger.log_scalar("loss", 0.5, step=7)
            print("RUN", name, logger.run_id, flush=True)

        def worker(name):
            train(name)
            raise RuntimeError("the worker died")

        if __name__ == "__main__":
            for method in ("fork", "spawn"):
                process = multiprocessing.get_context(method).Process(target=worker, args=(method,))
                process.start()
                process.join()
            train("main")
        """
    )
    script = tmp_path / "child.py"
    script.write_text(child)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = dict(line.split()[1:] for line in result.stdout.splitlines() if line.startswith("RUN "))
    assert set(runs) == {"fork", "spawn", "main"}, result.stdout
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    statuses = {name: client.get_run(run_id).info.status for name, run_id in runs.items()}
    assert statuses == {"fork": "FAILED", "spawn": "FAILED", "main": "FINISHED"}
    for run_id in runs.values():  # logged just before the end: delivered all the same
        assert [m.value for m in client.get_metric_history(run_id, "loss")] == [0.5]


def test_a_run_one_of_its_loggers_failed_stays_failed_until_it_is_resumed(mlflow_server, tmp_path):
    uri = mlflow_server.uri
    first = MLFlowLogger("shared", experiment_name="sharers", tracking_uri=uri, log_dir=tmp_path)
    second = MLFlowLogger("shared", tracking_uri=uri, log_dir=tmp_path / "b", run_id=first.run_id)
    with pytest.raises(TrainingDivergedError), first:
        diverge(first)
    second.log_scalar("loss", 2.0, step=1)
    second.close()  # it did not fail, but the run did: the last to close does not undo that
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(first.run_id).info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(first.run_id, "loss")] == [0, 1]
    with MLFlowLogger("shared", tracking_uri=uri, log_dir=tmp_path / "c", run_id=first.run_id):
        assert client.get_run(first.run_id).info.status == "RUNNING"  # a later attempt resumes it
    assert client.get_run(first.run_id).info.status == "FINISHED"


@pytest.fixture
def fresh_hook(monkeypatch):
    """``sys.excepthook`` as a test sets it, and no other test's loggers watched."""
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(_failure, "_OPEN", weakref.WeakSet())
    monkeypatch.setattr(_failure, "_installed", False)
    monkeypatch.setattr(_failure, "_previous", None)
    monkeypatch.setattr(_failure, "_ORIGINAL", [])


def test_a_logger_opened_after_the_hook_was_replaced_chains_it_again(fresh_hook, tmp_path):
    seen = []
    first = FileLogger("first", tmp_path)
    sys.excepthook = lambda _type, exc, _traceback: seen.append(exc)  # chains to nothing
    first.close()
    second = FileLogger("second", tmp_path)
    error = TrainingDivergedError("uncaught")
    sys.excepthook(type(error), error, None)
    assert second.failed
    assert seen == [error]
    second.close()
    assert sys.excepthook is not _failure._hook  # the application's hook is back


def test_a_hook_that_chains_back_to_ours_runs_each_hook_once(fresh_hook, tmp_path):
    seen = []
    sys.excepthook = lambda *_: seen.append("original")
    first = FileLogger("first", tmp_path)
    ours = sys.excepthook

    def application(exc_type, exc, traceback):
        seen.append("application")
        ours(exc_type, exc, traceback)

    sys.excepthook = application
    second = FileLogger("second", tmp_path)  # above the application's hook again
    error = TrainingDivergedError("uncaught")
    sys.excepthook(type(error), error, None)
    assert first.failed
    assert second.failed
    assert seen == ["application", "original"]
    first.close()
    second.close()


@pytest.mark.usefixtures("child_processes")
def test_a_script_dying_under_a_replaced_hook_still_fails_its_run(mlflow_server, tmp_path):
    uri = mlflow_server.uri  # the session's server: a new SQLite store costs seconds of migrations
    child = textwrap.dedent(
        f"""
        import sys
        from substrax.tracking import MLFlowLogger
        logger = MLFlowLogger(
            "replaced", experiment_name="failures", tracking_uri={uri!r}, log_dir={str(tmp_path)!r}
        )
        print("RUN", logger.run_id, flush=True)
        sys.excepthook = sys.__excepthook__  # an application's hook, chaining to nothing
        raise RuntimeError("loss is nan")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 1, result.stderr[-3000:]
    run_id = next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("RUN "))
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "FAILED"
