"""MLFlowLogger: an MLflow run fed from a background queue, through MLflow's own client."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._base import safe_name
from ._extras import require
from ._records import Record
from ._remote import RemoteLogger
from ._spool import register_sink_factory


__all__ = ["MLFlowLogger"]

_MAX_METRICS, _MAX_PARAMS = 1000, 100
_STATS = ("min", "max", "mean", "std")


def _import_mlflow() -> Any:
    return require("mlflow", who="MLFlowLogger", extra="mlflow")


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value)
    return flat


class _MlflowSink:
    def __init__(self, tracking_uri: str, run_id: str, registry_uri: str | None = None) -> None:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)

    def target(self) -> dict[str, Any]:
        return {"backend": "mlflow", "tracking_uri": self.tracking_uri, "run_id": self.run_id}

    def deliver(self, records: list[Record]) -> None:
        from mlflow.entities import Metric, Param  # noqa: PLC0415

        metrics: list[Any] = []
        params: list[Any] = []
        for record in records:
            stamp, step, payload = int(record.time * 1000), record.step or 0, record.payload
            if record.kind == "scalars":
                metrics.extend(
                    Metric(key, value, stamp, step) for key, value in payload["values"].items()
                )
            elif record.kind == "hyperparams":
                params.extend(
                    Param(key, value) for key, value in _flatten(payload["params"]).items()
                )
            elif record.kind == "text":
                self.client.log_text(
                    self.run_id,
                    payload["text"],
                    f"text/{safe_name(payload['name'])}/step_{step}.txt",
                )
            elif record.kind == "image":
                for path in payload["paths"]:
                    self.client.log_artifact(
                        self.run_id, path, f"images/{safe_name(payload['name'])}"
                    )
            elif record.kind == "histogram":
                name = payload["name"]
                self.client.log_batch(
                    self.run_id,
                    metrics=[Metric(f"{name}/{s}", payload[s], stamp, step) for s in _STATS],
                )
                self.client.log_dict(
                    self.run_id, payload, f"histograms/{safe_name(name)}/step_{step}.json"
                )
            elif record.kind == "artifact":
                path = Path(payload["path"])
                if path.is_dir():
                    self.client.log_artifacts(self.run_id, str(path), payload["artifact_path"])
                else:
                    self.client.log_artifact(self.run_id, str(path), payload["artifact_path"])
        for start in range(0, len(params), _MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[start : start + _MAX_PARAMS])
        for start in range(0, len(metrics), _MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + _MAX_METRICS])

    def is_permanent(self, error: BaseException) -> bool:
        return getattr(error, "error_code", None) == "INVALID_PARAMETER_VALUE"

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


register_sink_factory(
    "mlflow", lambda target: _MlflowSink(str(target["tracking_uri"]), str(target["run_id"]))
)


class MLFlowLogger(RemoteLogger):
    """Log to an MLflow run; calls return at once and reach MLflow from a worker thread.

    The run is created (or resumed with ``run_id``) at construction, on process 0 only, so a
    job has one run however many processes it has. Hyperparameters become params (nested
    mappings flattened with dots, non-strings as JSON); text, images and histograms become
    artifacts under ``text/``, ``images/`` and ``histograms/`` (histograms also log
    ``<name>/min|max|mean|std`` metrics).

    Args:
        name: the run name (and the experiment name when ``experiment_name`` is None).
        experiment_name: the experiment, created if missing.
        run_name: the run's name; default ``name``.
        run_id: resume this run instead of creating one.
        tracking_uri: the store (``http://...``, ``sqlite:///...``); default ``MLFLOW_TRACKING_URI``
            or ``sqlite:///<log_dir>/mlflow.db``, never the working tree.
        registry_uri: the model registry URI.
        artifact_location: where a new experiment keeps artifacts; default for a local store
            ``<log_dir>/mlflow-artifacts``, for a server the server's choice.
        tags: tags of a new run.
        log_dir: where images are staged and the spool file lives; default
            ``resolve_output_dir(name)``.
        spool_path: the spool file; default ``<log_dir>/<name>.spool.jsonl``.
        close_timeout: seconds :meth:`close` keeps trying before spooling what is left.
        max_queue: the queue bound (a full queue spills into the spool file).
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: log from every process (each then makes its own run).

    Raises:
        ImportError: mlflow is not installed (the ``mlflow`` extra).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with MLFlowLogger("demo", tracking_uri=f"sqlite:///{d}/mlflow.db", log_dir=d) as logger:
        ...     logger.log_scalar("loss", 0.5, step=1)
    """

    def __init__(
        self,
        name: str,
        *,
        experiment_name: str | None = None,
        run_name: str | None = None,
        run_id: str | None = None,
        tracking_uri: str | None = None,
        registry_uri: str | None = None,
        artifact_location: str | None = None,
        tags: Mapping[str, str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        spool_path: str | os.PathLike[str] | None = None,
        close_timeout: float = 30.0,
        max_queue: int = 100_000,
        process_index: int | None = None,
        all_processes: bool = False,
    ) -> None:
        _import_mlflow()
        super().__init__(
            name,
            log_dir=log_dir,
            spool_path=spool_path,
            close_timeout=close_timeout,
            max_queue=max_queue,
            process_index=process_index,
            all_processes=all_processes,
        )
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.tracking_uri = (
            tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{self.log_dir / 'mlflow.db'}"
        )
        if not self.active:
            return
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=registry_uri)
        if run_id is not None:
            run = client.get_run(run_id)
            self.experiment_id = run.info.experiment_id
            if run.info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")
        else:
            experiment = experiment_name or name
            found = client.get_experiment_by_name(experiment)
            if found is not None:
                self.experiment_id = found.experiment_id
            else:
                if artifact_location is None and self.tracking_uri.startswith(
                    ("sqlite:", "file:", "/")
                ):
                    artifact_location = (self.log_dir / "mlflow-artifacts").as_uri()
                self.experiment_id = client.create_experiment(
                    experiment, artifact_location=artifact_location
                )
            run_id = client.create_run(
                self.experiment_id, run_name=run_name or name, tags=dict(tags or {})
            ).info.run_id
        self.run_id = run_id
        self._start(_MlflowSink(self.tracking_uri, run_id, registry_uri), f"MLFlowLogger({name!r})")

    def log_metric(self, name: str, value: Any, step: int | None = None) -> None:
        """Alias of :meth:`log_scalar` (MLflow's name)."""
        self.log_scalar(name, value, step)

    def log_artifacts(
        self, local_dir: str | os.PathLike[str], artifact_path: str | None = None
    ) -> None:
        """Upload every file under ``local_dir``."""
        self.log_artifact(local_dir, artifact_path)

    def end_run(self) -> None:
        """End the run (the same as :meth:`close`)."""
        self.close()
