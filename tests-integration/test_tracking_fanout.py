"""End to end: one run logged to files, TensorBoard and MLflow at once shows the same metrics in
all three, each read back with its own reader (our JSONL reader, tensorboard's event accumulator,
MLflow's client over a SQLite store)."""

import math
from pathlib import Path

from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from substrax.tracking import (
    FileLogger,
    MLFlowLogger,
    MultiLogger,
    TensorBoardLogger,
    read_scalars,
)


STEPS = 25


def test_the_same_metrics_arrive_in_files_tensorboard_and_mlflow(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_logger = MLFlowLogger("fanout", tracking_uri=uri, log_dir=tmp_path / "mlflow")
    logged: dict[str, list[tuple[int, float]]] = {"loss": [], "accuracy": []}
    with MultiLogger(
        [
            FileLogger("fanout", tmp_path / "files"),
            TensorBoardLogger("fanout", tmp_path / "tensorboard"),
            mlflow_logger,
        ]
    ) as logger:
        logger.log_hyperparams({"learning_rate": 0.01})
        for step in range(STEPS):
            values = {"loss": math.exp(-step / 10), "accuracy": step / STEPS}
            logger.log_scalars(values, step=step)
            for name, value in values.items():
                logged[name].append((step, value))

    (jsonl,) = (tmp_path / "files").glob("*.metrics.jsonl")
    from_files = read_scalars(jsonl)

    (events,) = (tmp_path / "tensorboard").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    from_tensorboard = {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }

    client = MlflowClient(tracking_uri=uri)
    assert mlflow_logger.run_id is not None
    from_mlflow = {
        name: sorted(
            (m.step, m.value) for m in client.get_metric_history(mlflow_logger.run_id, name)
        )
        for name in logged
    }
    assert client.get_run(mlflow_logger.run_id).data.params == {"learning_rate": "0.01"}

    for name, expected in logged.items():
        for source, got in (
            ("files", from_files[name]),
            ("tensorboard", from_tensorboard[name]),
            ("mlflow", from_mlflow[name]),
        ):
            assert [step for step, _ in got] == [step for step, _ in expected], (source, name)
            for (_, value), (_, want) in zip(got, expected, strict=True):
                assert math.isclose(value, want, rel_tol=1e-6), (source, name, value, want)
