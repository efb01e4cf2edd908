"""The MLflow sink: one run found or created through MlflowClient, and each batch sent with log_batch."""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from ._first_attempt import FirstAttempt
from ._hparams import param_leaves
from ._live import process_attempt
from ._paths import file_part
from ._records import Record
from ._sink import register_sink_factory
from ._store_lock import store_lock


_logger = logging.getLogger(__name__)

_MAX_METRICS, _MAX_PARAMS = 1000, 100  # MLflow's limits per log_batch
_STATS = ("min", "max", "mean", "std")
RUN_KEY_TAG = "substrax.run_key"

#: The tag a resumed run (``resume_step``) gets: the checkpoint step it resumed from.
RESUMED_FROM_TAG = "substrax.resumed_from_step"
#: The tag each logger sets on its run: its process's attempt id (the attempt that took it last).
ATTEMPT_TAG = "substrax.attempt"

type _MetricRow = tuple[str, float, int, int]  # key, value, timestamp (ms), step


def flat_params(params: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each leaf of nested hyperparameters, named with dots (``opt.lr``), with its value.

    Raises:
        ValueError: two of them become one param (``{"a": {"b": 1}, "a.b": 2}``).

    Example:
        >>> from substrax.tracking._mlflow_sink import flat_params
        >>> dict(flat_params({"opt": {"lr": 0.1}, "name": "adam"}))
        {'opt.lr': 0.1, 'name': 'adam'}
    """
    seen: set[str] = set()
    for path, leaf in param_leaves(params):
        if (part := ".".join(path)) in seen:
            raise ValueError(
                f"MLFlowLogger: two hyperparameters become the MLflow param {part!r} "
                "(nested names are joined with dots); rename one of them"
            )
        seen.add(part)
        yield part, leaf


def artifact_dir(path: str | None) -> str | None:
    """``path`` as MLflow takes an artifact directory: normalized, None for the run's root.

    MLflow refuses a path that a normalization changes (``models/``, ``./a``) with an error that
    reads like a failure of the server; one outside the run is refused here, for good.

    Example:
        >>> from substrax.tracking._mlflow_sink import artifact_dir
        >>> artifact_dir("models/"), artifact_dir("./eval//plots"), artifact_dir(".")
        ('models', 'eval/plots', None)
        >>> artifact_dir("../up")
        Traceback (most recent call last):
        ...
        ValueError: artifact path '../up' is outside the run; give a relative path inside it, such as 'checkpoints'
    """
    if not path:
        return None
    normal = posixpath.normpath(path)
    if normal == ".":
        return None
    if normal == ".." or normal.startswith(("/", "../")):
        raise ValueError(
            f"artifact path {path!r} is outside the run; give a relative path inside it, such "
            "as 'checkpoints'"
        )
    return normal


def _media_file(folder: str, record: Record, suffix: str) -> str:
    """Where a text or histogram record goes: a file of its own, even at a step logged twice.

    Its time (in microseconds) tells two records of one step apart; a record sent again (a
    retry, a replay) goes to its own file again.
    """
    name, step = file_part(record.payload["name"]), record.step or 0
    return f"{folder}/{name}/step_{step}_{int(record.time * 1e6)}{suffix}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """How to find or create the run: by id (a resumed run) or by a key tagged on a new run."""

    experiment_name: str
    run_name: str
    tags: dict[str, str]
    artifact_location: str | None
    run_key: str


class MlflowSink:
    """One MLflow run, created on the first call that reaches the server if it does not exist yet."""

    def __init__(
        self,
        tracking_uri: str,
        *,
        run_id: str | None = None,
        spec: RunSpec | None = None,
        registry_uri: str | None = None,
        resume_step: int | None = None,
        replayed: bool = False,
    ) -> None:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.spec = spec  # None: resume run_id
        self.resume_step = resume_step
        self.held: dict[str, set[int]] | None = None  # with resume_step: see _not_held
        self._resumed_from: int | None = resume_step  # or read from the run: see _resumed
        # a live logger's run was not resumed since it started; a replayed spool's may have been
        self._tag_read = resume_step is not None or not replayed
        self._warned_held = False
        # the metrics logged, and those histograms are summarised in: one name in both is warned of
        self._metric_names: set[str] = set()
        self._stat_names: dict[str, str] = {}  # each summary metric, and its histogram
        self._warned_stats = False
        self.experiment_id: str | None = None
        self.failed = False  # end the run as FAILED
        self.died = False  # its process died before close: FAILED, unless taken or ended since
        self.attempt = "" if replayed else process_attempt()  # see ATTEMPT_TAG
        self.died_attempt = ""  # a died run's: the attempt its process was
        self.found_attempt: str | None = None  # the run's ATTEMPT_TAG when this sink found it
        self.found_status: str | None = None  # the run's status when this sink found it
        self._ready = False
        self._first: FirstAttempt | None = None
        with store_lock(tracking_uri):  # opening a new sqlite store creates its tables
            self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)

    @classmethod
    def from_target(cls, target: Mapping[str, Any]) -> MlflowSink:
        if "run_id" in target:
            resume_step = target.get("resume_step")
            return cls(
                str(target["tracking_uri"]),
                run_id=str(target["run_id"]),
                resume_step=None if resume_step is None else int(resume_step),
                replayed=True,
            )
        spec = RunSpec(
            experiment_name=str(target["experiment_name"]),
            run_name=str(target["run_name"]),
            tags={str(k): str(v) for k, v in dict(target.get("tags") or {}).items()},
            artifact_location=target.get("artifact_location"),
            run_key=str(target["run_key"]),
        )
        return cls(str(target["tracking_uri"]), spec=spec, replayed=True)

    def connect(self, timeout: float) -> str | None:
        """Find or create the run in its own thread: why not ready in ``timeout`` s (refusals raise)."""
        from mlflow.exceptions import RestException  # noqa: PLC0415

        self._first = FirstAttempt(self.set_up, name="substrax-mlflow-connect")
        return self._first.why_not_ready(
            timeout, refused=RestException, late="did not answer", failed="could not be reached"
        )

    def set_up(self) -> None:
        """Find or create the run (and resume it), through the network."""
        client, spec = self.client, self.spec
        with store_lock(self.tracking_uri):  # jobs starting together create one experiment
            if spec is None:
                run = client.get_run(str(self.run_id))
            else:
                experiment_id = self._experiment_id(spec)
                key = f"tags.`{RUN_KEY_TAG}` = '{spec.run_key}'"
                existing = client.search_runs([experiment_id], filter_string=key, max_results=1)
                if existing:  # resumed by its key
                    run = existing[0]
                else:
                    tags = {**spec.tags, RUN_KEY_TAG: spec.run_key}
                    if self.attempt:
                        tags[ATTEMPT_TAG] = self.attempt
                    run = client.create_run(experiment_id, run_name=spec.run_name, tags=tags)
            self.run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
            self.found_status = run.info.status  # FINISHED: ended by a later attempt, maybe
            self.found_attempt = run.data.tags.get(ATTEMPT_TAG)
            if self.attempt and self.found_attempt != self.attempt:
                try:  # only tells a replay after a kill who holds the run: never stops a run
                    client.set_tag(self.run_id, ATTEMPT_TAG, self.attempt)
                except Exception as error:  # then a killed attempt's replay could end it FAILED
                    _logger.warning(f"run {self.run_id}: no {ATTEMPT_TAG} tag set ({error})")
            if run.info.status != "RUNNING":  # resumed: running again
                client.update_run(self.run_id, status="RUNNING")
            if self.resume_step is not None:
                client.set_tag(self.run_id, RESUMED_FROM_TAG, str(self.resume_step))
            self._ready = True

    def _experiment_id(self, spec: RunSpec) -> str:
        """The id of ``spec``'s experiment, created if none has its name (or by another process meanwhile)."""
        found = self.client.get_experiment_by_name(spec.experiment_name)
        if found is None:
            try:
                return self.client.create_experiment(spec.experiment_name, spec.artifact_location)
            except Exception as error:
                if getattr(error, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                    raise
                found = self.client.get_experiment_by_name(spec.experiment_name)
                if found is None:
                    raise
        return found.experiment_id

    def _ensure_run(self) -> str:
        if not self._ready and self._first is not None:
            self._first.check_returned(f"MLflow at {self.tracking_uri}")
        if not self._ready:
            self.set_up()
        assert self.run_id is not None  # noqa: S101
        return self.run_id

    def target(self) -> dict[str, Any]:
        target: dict[str, Any] = {"backend": "mlflow", "tracking_uri": self.tracking_uri}
        if self.spec is not None and not self._ready:
            return target | dataclasses.asdict(self.spec)
        target["run_id"] = self.run_id
        if self.resume_step is not None:  # a replay skips the steps the run holds, too
            target["resume_step"] = self.resume_step
        return target

    def deliver(self, records: list[Record]) -> None:
        from mlflow.entities import Metric, Param  # noqa: PLC0415

        run_id = self._ensure_run()
        metrics: list[_MetricRow] = []
        params: dict[tuple[str, str], None] = {}  # each once: MLflow refuses a key named twice
        for record in records:
            stamp, step, payload = int(record.time * 1000), record.step or 0, record.payload
            if record.kind == "scalars":
                metrics.extend(
                    (key, value, stamp, step) for key, value in payload["values"].items()
                )
                self._note_metrics(payload["values"])
            elif record.kind == "hyperparams":
                for key, value in flat_params(payload["params"]):
                    params[key, value if isinstance(value, str) else json.dumps(value)] = None
            elif record.kind == "text":
                self.client.log_text(run_id, payload["text"], _media_file("text", record, ".txt"))
            elif record.kind == "image":
                for path in payload["paths"]:
                    self.client.log_artifact(run_id, path, f"images/{file_part(payload['name'])}")
            elif record.kind == "histogram":
                name = payload["name"]
                metrics.extend((f"{name}/{s}", payload[s], stamp, step) for s in _STATS)
                self._note_stats(name)
                self.client.log_dict(run_id, payload, _media_file("histograms", record, ".json"))
            elif record.kind == "artifact":
                path = Path(payload["path"])
                upload = self.client.log_artifacts if path.is_dir() else self.client.log_artifact
                upload(run_id, str(path), artifact_dir(payload.get("artifact_path")))
        rows = [Param(key, value) for key, value in params]  # a key of two values: refused
        for start in range(0, len(rows), _MAX_PARAMS):
            self.client.log_batch(run_id, params=rows[start : start + _MAX_PARAMS])
        if metrics and self._resumed(run_id):
            metrics = self._not_held(run_id, metrics)
        for start in range(0, len(metrics), _MAX_METRICS):
            batch = metrics[start : start + _MAX_METRICS]
            self.client.log_batch(run_id, metrics=[Metric(*row) for row in batch])

    def _note_metrics(self, names: Collection[str]) -> None:
        """Keep the names of logged metrics; warn once of one a histogram's summary shares."""
        self._metric_names.update(names)
        if self._stat_names and not self._warned_stats:
            clash = [name for name in names if name in self._stat_names]
            if clash:
                self._warn_stats(min(clash))

    def _note_stats(self, histogram: str) -> None:
        """Keep the summary metrics of ``histogram``; warn once of one a logged metric shares."""
        stats = [f"{histogram}/{stat}" for stat in _STATS]
        for stat in stats:
            self._stat_names.setdefault(stat, histogram)
        clash = self._metric_names.intersection(stats)
        if clash and not self._warned_stats:
            self._warn_stats(min(clash))

    def _warn_stats(self, metric: str) -> None:
        self._warned_stats = True
        _logger.warning(
            f"MLflow run {self.run_id}: the histogram {self._stat_names[metric]!r} is summarised "
            f"in the metrics <name>/min, /max, /mean and /std, and {metric!r} is also logged as a "
            "metric: its history holds the values of both; rename the metric or the histogram "
            "(this is reported once)"
        )

    def _resumed(self, run_id: str) -> bool:
        """Whether values at steps the run holds are left out: it was resumed (its tag, for a replay)."""
        if not self._tag_read:
            tag = self.client.get_run(run_id).data.tags.get(RESUMED_FROM_TAG)
            self._resumed_from, self._tag_read = (None if tag is None else int(tag)), True
        return self._resumed_from is not None

    def _not_held(self, run_id: str, metrics: list[_MetricRow]) -> list[_MetricRow]:
        """``metrics`` without those at a step the run held for their key when first sent."""
        if self.held is None:
            # read at the first send, after what an earlier attempt left in the spool arrived
            keys = self.client.get_run(run_id).data.metrics
            history = self.client.get_metric_history
            self.held = {key: {m.step for m in history(run_id, key)} for key in keys}
        held = self.held
        kept = [row for row in metrics if row[3] not in held.get(row[0], ())]
        if len(kept) < len(metrics) and not self._warned_held:
            self._warned_held = True
            key, _, _, step = next(row for row in metrics if row[3] in held.get(row[0], ()))
            _logger.warning(
                f"MLflow run {run_id}, resumed from step {self._resumed_from}, held {key!r} at "
                f"step {step} already: that value is not sent again, nor any other at a step the "
                "run held for its metric (this is reported once; the values it holds stay, "
                "MLflow's history is append-only)"
            )
        return kept

    @staticmethod
    def is_permanent(error: BaseException) -> bool:
        """Whether MLflow refused what it was sent, so that no retry can store it.

        Example:
            >>> from substrax.tracking._mlflow_sink import MlflowSink
            >>> MlflowSink.is_permanent(ValueError("Value out of range: 9223372036854775808"))
            True
            >>> MlflowSink.is_permanent(ConnectionRefusedError(111, "Connection refused"))
            False
            >>> MlflowSink.is_permanent(UnicodeEncodeError("utf-8", chr(0xD800), 0, 1, "surrogate"))
            True
            >>> from mlflow.exceptions import MlflowException
            >>> MlflowSink.is_permanent(MlflowException("Invalid artifact path: 'images/.'. ..."))
            True
            >>> MlflowSink.is_permanent(MlflowException("API request to http://h failed with ..."))
            False
        """
        from mlflow.exceptions import RestException  # noqa: PLC0415

        code = getattr(error, "error_code", None)
        if code == "INVALID_PARAMETER_VALUE" or (
            code == "BAD_REQUEST" and isinstance(error, RestException)
        ):  # a name MLflow does not accept, a param changed, a value too long: the server's
            # own answer (a proxy's 400 page is a plain MlflowException, retried)
            return True
        if str(error).startswith("Invalid artifact path"):  # MLflow's own check, before a request
            return True
        if isinstance(error, LookupError | FileNotFoundError | NotADirectoryError):
            return True  # a payload that lacks a key, a local file gone: about the record
        if isinstance(error, ValueError | TypeError) and not isinstance(
            error,
            json.JSONDecodeError | UnicodeDecodeError,  # a server's answer that is not JSON
        ):
            return True
        seen: set[int] = set()
        cause: BaseException | None = error
        while cause is not None and id(cause) not in seen:  # raised, or behind the error
            seen.add(id(cause))
            if isinstance(cause, OverflowError | UnicodeEncodeError):  # a lone surrogate in a text
                return True
            cause = cause.__cause__ or cause.__context__
        return False

    def finish(self) -> None:
        """End the run; a run another logger failed since this one began stays failed.

        A run whose process died (a replay of what it left) that a later attempt took over since
        (its ``ATTEMPT_TAG`` names another attempt: one that may still log, in another directory
        or on another host) or ended is left to that attempt, as it ended it.
        """
        run_id = self._ensure_run()  # set_up made it RUNNING: a FAILED now is a sharer's
        ended = self.found_status not in (None, "RUNNING")  # by another attempt, before
        taken = self.found_attempt not in (None, self.died_attempt) and bool(self.died_attempt)
        if self.died and (ended or taken):  # a later attempt's (live elsewhere, or ended)
            if ended:  # running again only while its records were replayed
                self._end(run_id, self.found_status)
            return
        if not self.failed and self.client.get_run(run_id).info.status == "FAILED":
            return
        self._end(run_id, "FAILED" if self.failed else "FINISHED")

    def _end(self, run_id: str, status: str | None) -> None:
        """End the run as ``status``, even where stdout cannot take what MLflow prints."""
        try:  # it prints the run's link first: a stdout that cannot take it (ASCII, closed,
            self.client.set_terminated(run_id, status=status)  # None) left the run RUNNING
        except (UnicodeError, OSError, ValueError, AttributeError):
            self.client.update_run(run_id, status=status)  # with no end time


register_sink_factory("mlflow", MlflowSink.from_target)
