"""Jobs that start together on one default sqlite store all start: its creation is serialised."""

import subprocess
import sys
import textwrap

import pytest


pytest.importorskip("mlflow", reason="the mlflow extra is needed for MLFlowLogger")
from mlflow.tracking import MlflowClient


_JOBS = 3  # one creates the store, two race it: enough to show creation is serialised


@pytest.mark.usefixtures("child_processes")
def test_jobs_starting_together_on_a_new_default_store_all_start(tmp_path):
    go = tmp_path / "go"
    child = textwrap.dedent(
        f"""
        import pathlib, time
        from substrax.tracking import MLFlowLogger
        import mlflow.tracking  # imported before the start, so that the jobs start together
        print("ready", flush=True)
        while not pathlib.Path({str(go)!r}).exists():
            time.sleep(0.005)
        logger = MLFlowLogger("sweep", log_dir={str(tmp_path / "sweep")!r})
        logger.log_scalar("loss", 1.0, step=0)
        logger.close()
        print(logger.run_id, flush=True)
        """
    )
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", child],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(_JOBS)
    ]
    try:
        for job in jobs:
            assert job.stdout is not None
            assert job.stdout.readline() == "ready\n"
        go.touch()  # all at once: each creates (or finds) the store and the experiment
        results = [job.communicate(timeout=120) for job in jobs]
    finally:
        for job in jobs:
            job.kill()
            job.wait()
    for job, (_, err) in zip(jobs, results, strict=True):
        assert job.returncode == 0, err[-3000:]
    run_ids = {out.split()[-1] for out, _ in results}
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'sweep' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sweep")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert {run.info.run_id for run in runs} == run_ids
    assert len(run_ids) == _JOBS


@pytest.mark.usefixtures("child_processes")
def test_a_child_forked_while_the_store_lock_is_held_does_not_keep_it(tmp_path):
    """Hostile finding: the lock was let go by closing its file alone, so a child forked while it
    was held (a data loader's worker) kept the store locked, and other jobs waiting, until it
    exited."""
    db = tmp_path / "mlflow.db"
    child = textwrap.dedent(
        f"""
        import fcntl, os
        from substrax.tracking._store_lock import store_lock

        read, write = os.pipe()
        with store_lock("sqlite:///{db}"):
            pid = os.fork()
            if pid == 0:  # a worker that outlives the lock's holder
                os.close(write)
                os.read(read, 1)
                os._exit(0)
        fd = os.open("{db}.lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            print("free")
        except BlockingIOError:
            print("held by the forked child")
        os.close(write)
        os.waitpid(pid, 0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "free"
