"""Two real jax processes (jax.distributed on 127.0.0.1) log the same job: only process 0 writes
files, and MLflow gets one run for the job, not one per process."""

import json
import textwrap

from mlflow.tracking import MlflowClient

from substrax.runtime import JaxRuntime
from substrax.testing import run_distributed


WORKER = textwrap.dedent(
    """
    import io, json, sys
    import jax

    from substrax.runtime import initialize_distributed

    initialize_distributed(initialization_timeout=90, heartbeat_timeout=60)  # load is no dead peer
    out = sys.argv[1]
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


def test_only_process_zero_logs_and_mlflow_gets_one_run(tmp_path, monkeypatch):
    for variable in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(variable, raising=False)
    runs = run_distributed(
        WORKER, str(tmp_path), num_processes=2, runtime=JaxRuntime(cpu_devices=1), timeout=240
    )
    results = [run.check().last_json() for run in runs]
    first, second = sorted(results, key=lambda r: r["process"])
    assert "loss" in first["printed"]
    assert second["printed"] == ""
    assert first["run_id"] is not None
    assert second["run_id"] is None
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == [
        "job.hparams.json",
        "job.log",  # the console's lines, as FileLogger's log_file
        "job.metrics.csv",
        "job.metrics.jsonl",
    ]
    assert "loss" in (tmp_path / "files" / "job.log").read_text()
    assert json.loads((tmp_path / "files" / "job.hparams.json").read_text()) == {"processes": 2}
    assert sorted(p.name for p in (tmp_path / "every").glob("*.metrics.jsonl")) == [
        "job.metrics.jsonl",
        "job.p1.metrics.jsonl",
    ]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("job").experiment_id])
    assert run.info.run_id == first["run_id"]
