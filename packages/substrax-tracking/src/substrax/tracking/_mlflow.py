"""MLFlowLogger: an MLflow run fed from a background queue, through MLflow's own client."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Mapping
from typing import Any, cast

from substrax.support import check_seconds, require

from ._errors import LogDirNotWritableError, UnknownRunIdError
from ._hparams import param_leaves
from ._log_files import json_ready
from ._mlflow_sink import MlflowSink, RunSpec, flat_params
from ._paths import ensure_writable_dir
from ._remote import RemoteLogger, check_resume
from ._store_lock import sqlite_path


_logger = logging.getLogger(__name__)

_NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"  # MLflow's error code for an unknown run id
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,255}")  # what MLflow accepts as a run id
_LONGEST_EXPERIMENT = 500  # characters of an experiment's name (MLflow's bound)
_LONGEST_PARAM = 6000  # characters of a param's value MLflow keeps (it cuts the rest)


def _check_run(
    run_id: str | None, experiment_name: str | None, name: str, tracking_uri: str | None
) -> None:
    """Refuse, before any request, a malformed ``run_id`` or too long an experiment name."""
    if run_id is not None and _RUN_ID.fullmatch(run_id) is None:
        uri = (
            tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///<log_dir>/mlflow.db"
        )
        raise UnknownRunIdError("MLFlowLogger", run_id, uri)
    experiment = experiment_name or name
    if run_id is None and len(experiment) > _LONGEST_EXPERIMENT:
        which = "experiment_name" if experiment_name else "name (the experiment_name by default)"
        raise ValueError(
            f"MLFlowLogger: {which} is {len(experiment)} characters long; MLflow allows at most "
            f"{_LONGEST_EXPERIMENT} in an experiment name: pass a shorter experiment_name"
        )


def _empty_mappings(params: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The names (joined with dots) of the empty mappings in nested hyperparameters."""
    found: list[str] = []
    for key, value in params.items():
        if isinstance(value, Mapping):
            inner = cast("Mapping[str, Any]", value)
            found += _empty_mappings(inner, f"{prefix}{key}.") if inner else [f"{prefix}{key}"]
    return found


class MLFlowLogger(RemoteLogger):
    """Log to an MLflow run; calls return at once and reach MLflow from a worker thread.

    The run is created (or resumed with ``run_id``) on process 0 only. Hyperparameters become
    params (nested mappings flattened with dots, non-strings as JSON); an empty mapping has no
    param and a value past 6000 characters is cut by MLflow, each warned about once. Text and
    histograms become artifacts ``text/<name>/step_<step>_<time_us>.txt`` and
    ``histograms/<name>/step_<step>_<time_us>.json`` (a file each, two of one step included),
    images ones under ``images/<name>/``. A histogram's summary is also logged as the metrics
    ``<name>/min``, ``/max``, ``/mean`` and ``/std``, among the metrics logged: one logged under
    such a name too is warned about once. A value MLflow refuses is set aside alone in
    ``<spool>.refused`` (warned about once per key). The tracking guide says which store to
    use, what happens while the server is down, and how ``resume_step`` resumes a run.

    Args:
        name: the run name (and the experiment name when ``experiment_name`` is None).
        experiment_name: the experiment, created if missing.
        run_name: the run's name; default ``name``.
        run_id: resume this run instead of creating one.
        resume_step: with ``run_id``, the checkpoint step the run resumes from.
        tracking_uri: the store; default ``MLFLOW_TRACKING_URI`` or ``sqlite:///<log_dir>/mlflow.db``.
        registry_uri: the model registry URI.
        artifact_location: a new experiment's artifacts; default ``<log_dir>/mlflow-artifacts`` (local).
        tags: tags of a new run.
        log_dir: where images are staged and the spool file lives; default ``resolve_output_dir(name)``.
        spool_path: the spool file; default ``<log_dir>/<name>.spool.jsonl``.
        close_timeout: seconds :meth:`close` keeps trying before spooling what is left.
        connect_timeout: the most seconds construction waits for a server.
        max_queue: records waiting past which the worker writes them to the spool at once.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: log from every process (each then makes its own run).

    Raises:
        ImportError: mlflow is not installed (the ``mlflow`` extra).
        ValueError: ``connect_timeout`` is not a finite number > 0, or ``close_timeout`` one >= 0.
        ResumeWithoutRunIdError: ``resume_step`` without ``run_id`` (a ``ValueError``).
        UnknownRunIdError: the store has no run ``run_id``, or it is no MLflow run id.
        ValueError: the experiment's name is longer than the 500 characters MLflow allows.
        LogDirNotWritableError: ``log_dir`` or a ``sqlite:///`` store's directory is not writable.

    Example:
        >>> import tempfile
        >>> from substrax.tracking import MLFlowLogger
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with MLFlowLogger("demo", tracking_uri=f"sqlite:///{d}/mlflow.db", log_dir=d) as logger:
        ...         logger.log_scalar("loss", 0.5, step=1)
    """

    _sink: MlflowSink | None = None
    _warned_params: set[str]

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
        connect_timeout: float = 10.0,
        max_queue: int = 100_000,
        process_index: int | None = None,
        all_processes: bool = False,
        resume_step: int | None = None,
    ) -> None:
        require("mlflow", who="MLFlowLogger", distribution="substrax-tracking", extra="mlflow")
        self._warned_params = set()  # params warned about: an empty mapping, a value cut short
        self._param_paths: set[tuple[str, ...]] = set()  # the key path of every param sent
        self._param_inner: set[tuple[str, ...]] = set()  # and of the mappings above them
        connect_timeout = check_seconds("connect_timeout", connect_timeout, positive=True)
        check_resume("MLFlowLogger", resume_step, run_id)
        _check_run(run_id, experiment_name, name, tracking_uri)
        super().__init__(
            name,
            log_dir=log_dir,
            spool_path=spool_path,
            close_timeout=close_timeout,
            max_queue=max_queue,
            process_index=process_index,
            all_processes=all_processes,
        )
        self.tracking_uri = (
            tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{self.log_dir / 'mlflow.db'}"
        )
        if not self.active:
            return
        ensure_writable_dir(self.log_dir, "MLFlowLogger")  # the spool's and the media's
        if (db := sqlite_path(self.tracking_uri)) is not None:  # MLflow would retry it for 100 s
            ensure_writable_dir(db.parent, "MLFlowLogger")
            if db.exists() and not db.is_file():
                reason = f"its MLflow database {db.name!r} is a directory, not a file"
                raise LogDirNotWritableError("MLFlowLogger", db.parent, reason)
        local = self.tracking_uri.startswith(("sqlite:", "file:", "/"))
        if artifact_location is None and local:
            artifact_location = (self.log_dir / "mlflow-artifacts").as_uri()
        spec = RunSpec(
            experiment_name=experiment_name or name,
            run_name=run_name or name,
            tags={str(k): str(v) for k, v in dict(tags or {}).items()},
            artifact_location=artifact_location,
            run_key=uuid.uuid4().hex,
        )
        sink = MlflowSink(
            self.tracking_uri,
            run_id=run_id,
            spec=None if run_id is not None else spec,
            registry_uri=registry_uri,
            resume_step=resume_step,
        )
        why = None
        try:
            if local:  # no network: set up here, and let any error through
                sink.set_up()
            elif (why := sink.connect(connect_timeout)) is not None:
                _logger.warning(
                    "MLFlowLogger(%r): MLflow at %s %s; logging goes on, records are kept in %s "
                    "and the run is created when the server answers",
                    name,
                    self.tracking_uri,
                    why,
                    self.spool_path,
                )
        except BaseException as error:
            if run_id is not None and getattr(error, "error_code", None) == _NOT_FOUND:
                raise UnknownRunIdError("MLFlowLogger", run_id, self.tracking_uri) from error
            raise
        self._sink = sink
        self._start(sink, f"MLFlowLogger({name!r})", reached=why is None)

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
        if self._sink is not None and not self.closed:
            self._sink.failed = True

    def _check_params(self, params: Mapping[str, Any]) -> None:
        for _ in flat_params(json_ready(dict(params))):  # two that become one MLflow param
            pass

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        ready = json_ready(dict(params))
        for key in _empty_mappings(ready):
            self._warn_param(
                key, "is an empty mapping, which MLflow has no param for: it is left out"
            )
        # one record a param: a param MLflow refuses is set aside alone, the others arrive
        for path, value in param_leaves(ready):  # two that become one param: refused at the call
            key = ".".join(path)
            shown = value if isinstance(value, str) else json.dumps(value)
            if len(shown) > _LONGEST_PARAM:
                self._warn_param(
                    key,
                    f"is {len(shown)} characters long; MLflow keeps the first {_LONGEST_PARAM} "
                    "of a param's value (log the whole with log_text)",
                )
            self._note_path(path, key)
            self._submit("hyperparams", None, {"params": {key: value}}, materialized=True)

    def _note_path(self, path: tuple[str, ...], key: str) -> None:
        """Keep a param's key path; warn where a value takes a mapping's place, or the reverse."""
        above = [path[:i] for i in range(1, len(path))]
        if path in self._param_inner or any(p in self._param_paths for p in above):
            stale = sorted(
                ".".join(held)
                for held in self._param_paths
                if held[: len(path)] == path or held in above
            )
            self._warn_param(
                key,
                f"takes the place of {', '.join(map(repr, stale))} logged before (a mapping "
                "and a value under one name); MLflow cannot delete a param: the run keeps both",
            )
        self._param_paths.add(path)
        self._param_inner.update(above)

    def _warn_param(self, key: str, what: str) -> None:
        """Warn once per param of what MLflow does not keep of it."""
        if key not in self._warned_params:
            self._warned_params.add(key)
            _logger.warning(f"MLFlowLogger({self.name!r}): hyperparameter {key!r} {what}")

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
