"""MLFlowLogger: an MLflow run fed from a background queue, through MLflow's own client."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from substrax.support import check_seconds, require

from ._base import safe_name
from ._errors import UnknownRunIdError
from ._first_attempt import FirstAttempt
from ._records import Record
from ._remote import RemoteLogger, check_resume
from ._spool import register_sink_factory
from ._store_lock import store_lock


__all__ = ["RESUMED_FROM_TAG", "RUN_KEY_TAG", "MLFlowLogger"]

_logger = logging.getLogger(__name__)

RUN_KEY_TAG = "substrax.run_key"
#: The tag a resumed run (``resume_step``) gets: the checkpoint step it resumed from.
RESUMED_FROM_TAG = "substrax.resumed_from_step"

_MAX_METRICS, _MAX_PARAMS = 1000, 100
_STATS = ("min", "max", "mean", "std")
_NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"  # MLflow's error code for an unknown run id
_CONNECT_TIMEOUT = 10.0

type _MetricRow = tuple[str, float, int, int]  # key, value, timestamp (ms), step


def _import_mlflow() -> Any:
    return require("mlflow", who="MLFlowLogger", distribution="substrax-tracking", extra="mlflow")


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value)
    return flat


def refused_for_good(error: BaseException) -> bool:
    """Whether MLflow refused what it was sent, so that no retry can store it.

    MLflow's ``INVALID_PARAMETER_VALUE`` (a metric name it does not accept, a param logged again
    with another value), or a value the client or its store cannot hold (a ``ValueError``,
    ``TypeError`` or ``OverflowError``, raised or behind the error). A server that cannot be
    reached, does not answer, or answers something that is not JSON is retried.

    Example:
        >>> from substrax.tracking._mlflow import refused_for_good
        >>> refused_for_good(ValueError("Value out of range: 9223372036854775808"))
        True
        >>> refused_for_good(ConnectionRefusedError(111, "Connection refused"))
        False
    """
    if getattr(error, "error_code", None) == "INVALID_PARAMETER_VALUE":
        return True
    if isinstance(error, ValueError | TypeError) and not isinstance(
        error, json.JSONDecodeError | UnicodeError
    ):
        return True
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OverflowError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _new_step(last: dict[str, int], key: str, step: int) -> bool:
    """Whether the run has no value of ``key`` at or after ``step`` yet; if so, note ``step``.

    Example:
        >>> from substrax.tracking._mlflow import _new_step
        >>> last = {"loss": 5}
        >>> [_new_step(last, "loss", step) for step in (4, 5, 6, 6)], last
        ([False, False, True, False], {'loss': 6})
    """
    if step <= last.get(key, -1):
        return False
    last[key] = step
    return True


class _RunNotReadyError(ConnectionError):
    """The run is still being created by the first connection attempt."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _RunSpec:
    """How to find or create the run: by id (a resumed run) or by a key tagged on a new run."""

    experiment_name: str
    run_name: str
    tags: dict[str, str]
    artifact_location: str | None
    run_key: str


class _MlflowSink:
    """One MLflow run, created on the first call that reaches the server if it does not exist yet."""

    def __init__(
        self,
        tracking_uri: str,
        *,
        run_id: str | None = None,
        spec: _RunSpec | None = None,
        registry_uri: str | None = None,
        resume_step: int | None = None,
    ) -> None:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.resume_step = resume_step
        # with resume_step: each metric's last step the run holds; values at or before it are
        # not sent again (MLflow's history is append-only)
        self.last_steps: dict[str, int] | None = None
        self.experiment_id: str | None = None
        self.spec = spec
        self._resume = run_id is not None
        self._ready = False
        self._first: FirstAttempt | None = None
        self.failed = False  # end the run as FAILED
        with store_lock(tracking_uri):  # opening a new sqlite store creates its tables
            self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)

    @classmethod
    def from_target(cls, target: Mapping[str, Any]) -> _MlflowSink:
        if "run_id" in target:
            resume_step = target.get("resume_step")
            return cls(
                str(target["tracking_uri"]),
                run_id=str(target["run_id"]),
                resume_step=None if resume_step is None else int(resume_step),
            )
        spec = _RunSpec(
            experiment_name=str(target["experiment_name"]),
            run_name=str(target["run_name"]),
            tags={str(k): str(v) for k, v in dict(target.get("tags") or {}).items()},
            artifact_location=target.get("artifact_location"),
            run_key=str(target["run_key"]),
        )
        return cls(str(target["tracking_uri"]), spec=spec)

    def connect(self, timeout: float) -> bool:
        """Try to find or create the run for at most ``timeout`` seconds (from a thread of its own).

        Returns:
            whether the run is ready. An answer of the server that refuses (an unknown run id,
            a bad experiment) is raised; a server that does not answer is not an error.
        """
        self._first = FirstAttempt(self.set_up, name="substrax-mlflow-connect")
        if not self._first.wait(timeout):
            return False
        from mlflow.exceptions import RestException  # noqa: PLC0415

        if isinstance(self.first_error, RestException):  # the server answered: it refuses
            raise self.first_error
        return self._ready

    @property
    def first_error(self) -> BaseException | None:
        """What the first attempt raised (None while it runs, or when it succeeded)."""
        return None if self._first is None else self._first.error

    def set_up(self) -> None:
        """Find or create the run (and resume it), through the network."""
        with store_lock(self.tracking_uri):  # jobs starting together create one experiment
            self._set_up()

    def _set_up(self) -> None:
        client = self.client
        if self._resume:
            assert self.run_id is not None  # noqa: S101
            run = client.get_run(self.run_id)
            self.experiment_id = run.info.experiment_id
            if run.info.status != "RUNNING":
                client.update_run(self.run_id, status="RUNNING")
            if self.resume_step is not None and self.last_steps is None:
                self.last_steps = {
                    key: max(m.step for m in client.get_metric_history(self.run_id, key))
                    for key in run.data.metrics
                }
                client.set_tag(self.run_id, RESUMED_FROM_TAG, str(self.resume_step))
        else:
            spec = self.spec
            assert spec is not None  # noqa: S101
            found = client.get_experiment_by_name(spec.experiment_name)
            if found is not None:
                experiment_id = found.experiment_id
            else:
                experiment_id = client.create_experiment(
                    spec.experiment_name, artifact_location=spec.artifact_location
                )
            existing = client.search_runs(
                [experiment_id],
                filter_string=f"tags.`{RUN_KEY_TAG}` = '{spec.run_key}'",
                max_results=1,
            )
            if existing:
                self.run_id = existing[0].info.run_id
            else:
                tags = {**spec.tags, RUN_KEY_TAG: spec.run_key}
                created = client.create_run(experiment_id, run_name=spec.run_name, tags=tags)
                self.run_id = created.info.run_id
            self.experiment_id = experiment_id
        self._ready = True

    def _ensure_run(self) -> str:
        if not self._ready:
            if self._first is not None and self._first.running():
                raise _RunNotReadyError(
                    f"MLflow at {self.tracking_uri} has not answered the first request yet"
                )
            if not self._ready:
                self.set_up()
        assert self.run_id is not None  # noqa: S101
        return self.run_id

    def target(self) -> dict[str, Any]:
        if self.spec is None or self._ready:
            target: dict[str, Any] = {
                "backend": "mlflow",
                "tracking_uri": self.tracking_uri,
                "run_id": self.run_id,
            }
            if self.resume_step is not None:  # a replay skips the steps the run holds, too
                target["resume_step"] = self.resume_step
            return target
        return {
            "backend": "mlflow",
            "tracking_uri": self.tracking_uri,
            **dataclasses.asdict(self.spec),
        }

    def deliver(self, records: list[Record]) -> None:
        from mlflow.entities import Param  # noqa: PLC0415

        run_id = self._ensure_run()
        metrics: list[_MetricRow] = []
        params: list[Any] = []
        for record in records:
            stamp, step, payload = int(record.time * 1000), record.step or 0, record.payload
            if record.kind == "scalars":
                metrics.extend(
                    (key, value, stamp, step) for key, value in payload["values"].items()
                )
            elif record.kind == "hyperparams":
                params.extend(
                    Param(key, value) for key, value in _flatten(payload["params"]).items()
                )
            elif record.kind == "text":
                self.client.log_text(
                    run_id,
                    payload["text"],
                    f"text/{safe_name(payload['name'])}/step_{step}.txt",
                )
            elif record.kind == "image":
                for path in payload["paths"]:
                    self.client.log_artifact(run_id, path, f"images/{safe_name(payload['name'])}")
            elif record.kind == "histogram":
                name = payload["name"]
                metrics.extend((f"{name}/{s}", payload[s], stamp, step) for s in _STATS)
                self.client.log_dict(
                    run_id, payload, f"histograms/{safe_name(name)}/step_{step}.json"
                )
            elif record.kind == "artifact":
                path = Path(payload["path"])
                if path.is_dir():
                    self.client.log_artifacts(run_id, str(path), payload["artifact_path"])
                else:
                    self.client.log_artifact(run_id, str(path), payload["artifact_path"])
        for start in range(0, len(params), _MAX_PARAMS):
            self.client.log_batch(run_id, params=params[start : start + _MAX_PARAMS])
        self._log_metrics(run_id, metrics)

    def _log_metrics(self, run_id: str, metrics: list[_MetricRow]) -> None:
        """Send ``metrics``; with ``resume_step``, none at a step the run holds for its key."""
        from mlflow.entities import Metric  # noqa: PLC0415

        last = None if self.last_steps is None else dict(self.last_steps)
        if last is not None:
            metrics = [row for row in metrics if _new_step(last, row[0], row[3])]
        for start in range(0, len(metrics), _MAX_METRICS):
            rows = metrics[start : start + _MAX_METRICS]
            self.client.log_batch(run_id, metrics=[Metric(*row) for row in rows])
        if last is not None:
            self.last_steps = last  # only once delivered: a retried batch is filtered the same

    def is_permanent(self, error: BaseException) -> bool:
        return refused_for_good(error)

    def finish(self) -> None:
        self.client.set_terminated(
            self._ensure_run(), status="FAILED" if self.failed else "FINISHED"
        )


register_sink_factory("mlflow", _MlflowSink.from_target)


class MLFlowLogger(RemoteLogger):
    """Log to an MLflow run; calls return at once and reach MLflow from a worker thread.

    The run is created (or resumed with ``run_id``) on process 0 only, so a job has one run
    however many processes it has. Hyperparameters become params (nested mappings flattened
    with dots, non-strings as JSON); text, images and histograms become artifacts under
    ``text/``, ``images/`` and ``histograms/`` (histograms also log
    ``<name>/min|max|mean|std`` metrics).

    Construction waits at most ``connect_timeout`` seconds for a server. One that does not
    answer by then is warned about, and the run goes on: records are spooled, and the run is
    created (tagged ``substrax.run_key``) and sent everything once the server answers, by
    this logger or by ``python -m substrax.tracking replay``. :attr:`run_id` is None until
    then. A server that answers with an error raises at construction (an unknown ``run_id``:
    :class:`UnknownRunIdError`).
    Every request runs off the training thread, so construction and :meth:`close` keep their
    bounds whatever MLflow's own HTTP settings are (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
    ``MLFLOW_HTTP_REQUEST_TIMEOUT``: left as the user set them; their defaults retry a dead
    server for minutes on the worker thread). A tracking server (``mlflow server``) is the
    recommended store: the training process then pays an HTTP call per batch, where an
    in-process ``sqlite:`` store runs MLflow's ORM under the training loop's GIL.

    Resuming a run from a checkpoint of step ``S``: pass the first attempt's ``run_id`` and
    ``resume_step=S``. MLflow's metric history is append-only (no API deletes a value), so the
    values the interrupted attempt logged after ``S`` stay in the run. The resumed logger reads
    each metric's last step from the run's history when it starts and does not send a scalar at
    or before that step again (it keeps noting the steps it delivers): every step appears
    once, and the steps between ``S`` and the interruption keep the first attempt's values.
    Within the resumed logger a metric's steps must therefore increase. The run is tagged
    ``substrax.resumed_from_step=S``. Params, text and artifacts are sent as usual (a file at
    the same artifact path replaces the earlier one). Histogram statistics are filtered like
    scalars, and records spooled by a resumed logger carry ``S``: a replay skips the steps the
    run holds in the same way.

    Args:
        name: the run name (and the experiment name when ``experiment_name`` is None).
        experiment_name: the experiment, created if missing.
        run_name: the run's name; default ``name``.
        run_id: resume this run instead of creating one.
        resume_step: with ``run_id``, the checkpoint step the run resumes from: values at steps
            the run already holds for a metric are not sent again (see above).
        tracking_uri: the store (``http://...``, ``sqlite:///...``); default ``MLFLOW_TRACKING_URI``
            or ``sqlite:///<log_dir>/mlflow.db``, never the working tree.
        registry_uri: the model registry URI.
        artifact_location: where a new experiment keeps artifacts; default for a local store
            ``<log_dir>/mlflow-artifacts``, for a server the server's choice.
        tags: tags of a new run.
        log_dir: where images are staged and the spool file lives; default
            ``resolve_output_dir(name)``.
        spool_path: the spool file; default ``<log_dir>/<name>.spool.jsonl`` (with
            ``all_processes``, ``<name>.p<index>.spool.jsonl`` on a process other than 0).
        close_timeout: seconds :meth:`close` keeps trying before spooling what is left.
        connect_timeout: the most seconds construction waits for a server.
        max_queue: the queue bound (a full queue spills into the spool file).
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: log from every process (each then makes its own run).

    Raises:
        ImportError: mlflow is not installed (the ``mlflow`` extra).
        ValueError: ``connect_timeout`` is not a finite number > 0, or ``close_timeout`` not
            a finite number >= 0 (NaN and infinity are refused: pick a bound).
        ResumeWithoutRunIdError: ``resume_step`` without ``run_id`` (a ``ValueError``).
        UnknownRunIdError: the store has no run ``run_id`` (a ``ValueError``).

    Example:
        >>> import tempfile
        >>> from substrax.tracking import MLFlowLogger
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with MLFlowLogger("demo", tracking_uri=f"sqlite:///{d}/mlflow.db", log_dir=d) as logger:
        ...         logger.log_scalar("loss", 0.5, step=1)
    """

    _sink: _MlflowSink | None

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
        connect_timeout: float = _CONNECT_TIMEOUT,
        max_queue: int = 100_000,
        process_index: int | None = None,
        all_processes: bool = False,
        resume_step: int | None = None,
    ) -> None:
        _import_mlflow()
        connect_timeout = check_seconds("connect_timeout", connect_timeout, positive=True)
        check_resume("MLFlowLogger", resume_step, run_id)
        super().__init__(
            name,
            log_dir=log_dir,
            spool_path=spool_path,
            close_timeout=close_timeout,
            max_queue=max_queue,
            process_index=process_index,
            all_processes=all_processes,
        )
        self._sink = None
        self.tracking_uri = (
            tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{self.log_dir / 'mlflow.db'}"
        )
        if not self.active:
            return
        local = self.tracking_uri.startswith(("sqlite:", "file:", "/"))
        if artifact_location is None and local:
            artifact_location = (self.log_dir / "mlflow-artifacts").as_uri()
        spec = _RunSpec(
            experiment_name=experiment_name or name,
            run_name=run_name or name,
            tags={str(k): str(v) for k, v in dict(tags or {}).items()},
            artifact_location=artifact_location,
            run_key=uuid.uuid4().hex,
        )
        sink = _MlflowSink(
            self.tracking_uri,
            run_id=run_id,
            spec=None if run_id is not None else spec,
            registry_uri=registry_uri,
            resume_step=resume_step,
        )
        try:
            if local:  # no network: set up here, and let any error through
                sink.set_up()
            elif not sink.connect(connect_timeout):
                failure = sink.first_error
                _logger.warning(
                    "MLFlowLogger(%r): MLflow at %s %s; logging goes on, records are kept in %s "
                    "and the run is created when the server answers",
                    name,
                    self.tracking_uri,
                    f"did not answer within {connect_timeout:g} s"
                    if failure is None
                    else f"could not be reached ({type(failure).__name__}: {failure})",
                    self.spool_path,
                )
        except BaseException as error:
            if run_id is not None and getattr(error, "error_code", None) == _NOT_FOUND:
                raise UnknownRunIdError("MLFlowLogger", run_id, self.tracking_uri) from error
            raise
        self._sink = sink
        self._start(sink, f"MLFlowLogger({name!r})")

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (None on processes that do not log, and until the server answered)."""
        return None if self._sink is None else self._sink.run_id

    @property
    def experiment_id(self) -> str | None:
        """The MLflow experiment id (None until known)."""
        return None if self._sink is None else self._sink.experiment_id

    def mark_failed(self) -> None:
        """End the run with status ``FAILED`` when it closes."""
        super().mark_failed()
        sink = getattr(self, "_sink", None)  # None also while __init__ runs
        if sink is not None and not self.closed:
            sink.failed = True

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
