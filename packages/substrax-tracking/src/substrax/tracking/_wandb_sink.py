"""The W&B sink: one run started through wandb.init, and each batch sent with Run.log."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import html
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from substrax.support import require

from ._first_attempt import FirstAttempt
from ._records import Record
from ._sink import register_sink_factory


_logger = logging.getLogger(__name__)

OFFLINE = ("offline", "dryrun", "disabled")
_REPLAY_TIMEOUT = 10.0


def import_wandb() -> Any:
    return require("wandb", who="WandbLogger", distribution="substrax-tracking", extra="wandb")


def bounded_settings(settings: Any, mode: str | None, timeout: float) -> Any:
    """``settings`` for ``wandb.init`` with W&B's network waits (unless set) bounded by ``timeout``.

    Example:
        >>> from substrax.tracking._wandb_sink import bounded_settings
        >>> bounded_settings(None, "offline", 10.0) is None
        True
        >>> bounded_settings({"init_timeout": 60}, None, 10.0)["init_timeout"]
        60
    """
    if mode in OFFLINE or (mode is None and os.environ.get("WANDB_MODE") in OFFLINE):
        return settings
    waits = ("login_timeout", "init_timeout", "x_graphql_timeout_seconds")
    bounds: dict[str, Any] = {**dict.fromkeys(waits, timeout), "x_graphql_retry_max": 2}
    defaults = {key: bounds[key] for key in bounds if f"WANDB_{key.upper()}" not in os.environ}
    if settings is None:
        return defaults
    if isinstance(settings, Mapping):
        return {**defaults, **cast("Mapping[str, Any]", settings)}
    for key, value in defaults.items():  # a wandb.Settings: fill in what it leaves unset
        if getattr(settings, key, 0) is None:
            setattr(settings, key, value)
    return settings


class WandbSink:
    """The delivery sink of one W&B run: starts the run, then logs records to it."""

    def __init__(
        self,
        target: dict[str, Any],
        init_options: dict[str, Any],
        *,
        rewind_from: int | None = None,
        rewound_to: int | None = None,
    ) -> None:
        self._target = target
        self._init_options = init_options
        self._rewind_from = rewind_from  # replaying a resumed run: rewind to before its records
        self._rewound_to = rewound_to  # a resumed run's step: W&B's history takes later ones
        self._first: FirstAttempt | None = None
        self.run: Any = None
        self.exit_code: int | None = None  # non-zero: the run failed
        self._last_step = -1  # the highest step sent to the run's history
        self._step_keys: set[str] = set()  # the keys sent at it
        self._warned_back = self._warned_again = self._warned_rewound = False
        # records W&B took from a batch that then failed: the retry of the batch skips them
        self._taken_before: list[Record] = []

    def connect(self, timeout: float) -> str | None:
        """Start the run in a thread of its own: why it has not within ``timeout`` s (None: it has).

        A ``UsageError`` (a refusal that retrying cannot fix) is raised.
        """
        self._first = FirstAttempt(self._init, name="substrax-wandb-init")
        refused = import_wandb().errors.UsageError
        return self._first.why_not_ready(
            timeout, refused=refused, late="did not return", failed="failed"
        )

    def _init(self, **again: Any) -> None:
        self.run = import_wandb().init(**{**self._init_options, **again})

    def _ensure_run(self) -> Any:
        if self.run is None and self._first is not None:
            self._first.check_returned("wandb.init")
        if self.run is None:
            # resume the run a failed first attempt may have started (a rewind stays a rewind)
            again = {} if "resume_from" in self._init_options else {"resume": "allow"}
            self._init(**again)
        return self.run

    def target(self) -> dict[str, Any]:
        return self._target

    def deliver(self, records: list[Record]) -> None:
        if self.run is None and self._rewind_from is not None:
            self._init_options["resume_from"] = rewind_point(
                self._init_options["id"], self._rewind_from, records
            )
        run = self._ensure_run()
        taken: list[Record] = []
        try:
            for record in records:
                if record in self._taken_before:  # sent again, one at a time, after a refusal
                    self._taken_before.remove(record)
                    continue
                self._send(run, record)
                taken.append(record)
        except Exception:
            # W&B's Run.log takes one row at a time: what it took stays taken
            self._taken_before.extend(taken)
            raise

    def _send(self, run: Any, record: Record) -> None:
        if record.kind == "hyperparams":
            run.config.update(record.payload["params"], allow_val_change=True)
        elif record.kind == "artifact":
            _upload(run, record.payload)
        elif row := _history_row(record.kind, record.payload):
            self._check_order(row, record.step)
            run.log(row, step=record.step)
            if record.step is not None and record.step >= self._last_step:  # once W&B took it
                if record.step > self._last_step:
                    self._last_step, self._step_keys = record.step, set()
                self._step_keys.update(row)

    def _check_order(self, row: Mapping[str, Any], step: int | None) -> None:
        """Warn (once each) of a row W&B drops (below a step sent) and of a value it replaces."""
        if step is None:
            return
        if self._rewound_to is not None and step <= self._rewound_to and not self._warned_rewound:
            self._warned_rewound = True
            _logger.warning(
                f"W&B run {self._target.get('run_id')}: {sorted(row)} at step {step}, logged "
                f"after resume_step={self._rewound_to} rewound the run; W&B's rewound history "
                "takes only steps after it and drops this row (this is reported once; the other "
                "loggers keep it); log a resumed epoch's end at the next step"
            )
        if step == self._last_step and not self._warned_again and self._step_keys & row.keys():
            self._warned_again = True
            _logger.warning(
                f"W&B run {self._target.get('run_id')}: {sorted(self._step_keys & row.keys())} "
                f"logged again at step {step}; W&B keeps the last value of a key at a step (this "
                "is reported once); log each value at its own step, or under its own name"
            )
        if step < self._last_step and not self._warned_back:
            self._warned_back = True
            _logger.warning(
                f"W&B run {self._target.get('run_id')}: {sorted(row)} at step {step} came after "
                f"step {self._last_step}; W&B keeps a run's steps increasing and drops this row "
                "(and any later one below the highest step; this is reported once); log steps "
                "in order, or log the value with its own x-axis (wandb's define_metric)"
            )

    @property
    def failed(self) -> bool:
        """Whether the run ends failed (a non-zero exit code); set True: exit code 1."""
        return bool(self.exit_code)

    @failed.setter
    def failed(self, failed: bool) -> None:
        if failed != self.failed:
            self.exit_code = 1 if failed else None

    def is_permanent(self, error: BaseException) -> bool:
        return isinstance(error, TypeError | ValueError | LookupError | FileNotFoundError)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish(exit_code=self.exit_code)


def _history_row(kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The history row of a scalars, text, image or histogram record (empty: log nothing)."""
    import wandb  # noqa: PLC0415

    if kind == "scalars":  # empty when its jax values were deleted before they were read
        return payload["values"]
    name = payload["name"]
    if kind == "text":
        return {name: wandb.Html(f"<pre>{html.escape(payload['text'])}</pre>")}
    if kind == "image":
        return {name: [wandb.Image(path) for path in payload["paths"]]}
    row: dict[str, Any] = {
        f"{name}/{stat}": payload[stat] for stat in ("min", "max", "mean", "std")
    }
    if payload["counts"]:
        row[name] = wandb.Histogram(np_histogram=(payload["counts"], payload["edges"]))
    return row


def _upload(run: Any, payload: Mapping[str, Any]) -> None:
    """Save an artifact record's file with the run, or log it as a model artifact."""
    import wandb  # noqa: PLC0415

    path = Path(payload["path"])
    if not payload.get("model_name"):
        # W&B names a file by its path under base_path, and an offline run only links to it:
        # each is copied into the run's files, under artifact_path, as it is at the upload
        under = payload.get("artifact_path")
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        top = path if path.is_dir() and under is not None else path.parent
        for file in files:
            staged = Path(run.dir) / (under or "") / file.relative_to(top)
            staged.parent.mkdir(parents=True, exist_ok=True)
            staged.unlink(missing_ok=True)
            shutil.copyfile(file, staged)
            run.save(str(staged), base_path=str(run.dir), policy="now")
        return
    artifact = wandb.Artifact(payload["model_name"], type="model", metadata=payload.get("metadata"))
    if path.is_dir():
        artifact.add_dir(str(path))
    else:
        artifact.add_file(str(path))
    run.log_artifact(artifact)


def rewind_point(run_id: str, resume_step: int, records: Sequence[Record]) -> str:
    """The ``resume_from`` of a replay of a resumed run's first ``records``: never before ``resume_step``."""
    steps = [record.step for record in records if record.step is not None]
    return f"{run_id}?_step={max(resume_step, min(steps, default=resume_step + 1) - 1)}"


def sink_from_target(target: Mapping[str, Any]) -> WandbSink:
    """The sink a replay of spooled records sends them through."""
    mode, url, resume_step = target.get("mode"), target.get("base_url"), target.get("resume_step")
    options: dict[str, Any] = {
        "project": target["project"],
        "entity": target.get("entity"),
        "id": target["run_id"],
        "dir": target.get("dir"),
        "mode": mode,
        "reinit": "create_new",
        # the server the records were logged for, whatever WANDB_BASE_URL the replay has
        "settings": bounded_settings({"base_url": url} if url else None, mode, _REPLAY_TIMEOUT),
    }
    if resume_step is None:
        options["resume"] = "allow"
    return WandbSink(
        dict(target), options, rewind_from=None if resume_step is None else int(resume_step)
    )


register_sink_factory("wandb", sink_from_target)
