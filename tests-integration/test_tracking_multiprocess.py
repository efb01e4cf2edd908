"""Two real jax processes (jax.distributed on 127.0.0.1) log the same job: only process 0 writes
files, and MLflow gets one run for the job, not one per process."""

import json
import os
import socket
import subprocess
import sys
import textwrap

from mlflow.tracking import MlflowClient


WORKER = textwrap.dedent(
    """
    import io, json, sys
    import jax

    pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=pid, initialization_timeout=90)
    from substrax.tracking import MLFlowLogger, create_logger

    console = io.StringIO()
    with create_logger("job", log_dir=f"{out}/files", stream=console) as logger:
        logger.log_hyperparams({"processes": jax.process_count()})
        logger.log_scalar("loss", 1.0, step=0)
    with create_logger("job", log_dir=f"{out}/every", console=False, all_processes=True) as every:
        every.log_scalar("loss", float(jax.process_index()), step=0)
    with MLFlowLogger("job", tracking_uri=f"sqlite:///{out}/mlflow.db", log_dir=f"{out}/mlflow") as ml:
        ml.log_scalar("loss", 1.0, step=0)
    print(json.dumps({"process": jax.process_index(), "printed": console.getvalue(), "run_id": ml.run_id}))
    """
)


def _last_json_line(stdout: str) -> str:
    """The child's last JSON object line: gloo prints connection notes to stdout, racing it."""
    return next(line for line in reversed(stdout.splitlines()) if line.startswith("{"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_only_process_zero_logs_and_mlflow_gets_one_run(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "MLFLOW_"))}
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), str(pid), port, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for pid in (0, 1)
    ]
    results = []
    for worker in workers:
        try:
            stdout, stderr = worker.communicate(timeout=240)
        finally:
            if worker.poll() is None:
                for other in workers:
                    other.kill()
        assert worker.returncode == 0, stderr[-3000:]
        results.append(json.loads(_last_json_line(stdout)))

    first, second = sorted(results, key=lambda r: r["process"])
    assert "loss" in first["printed"]
    assert second["printed"] == ""
    assert first["run_id"] is not None
    assert second["run_id"] is None
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == [
        "job.hparams.json",
        "job.metrics.csv",
        "job.metrics.jsonl",
    ]
    assert json.loads((tmp_path / "files" / "job.hparams.json").read_text()) == {"processes": 2}
    assert sorted(p.name for p in (tmp_path / "every").glob("*.metrics.jsonl")) == [
        "job.metrics.jsonl",
        "job.p1.metrics.jsonl",
    ]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("job").experiment_id])
    assert run.info.run_id == first["run_id"]
