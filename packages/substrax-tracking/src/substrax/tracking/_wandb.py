"""WandbLogger: a Weights & Biases run fed from a background queue."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._base import LoggerClosedError, safe_name
from ._extras import require
from ._records import Record
from ._remote import RemoteLogger
from ._spool import register_sink_factory


__all__ = ["WandbLogger"]

_STATS = ("min", "max", "mean", "std")


def _import_wandb() -> Any:
    return require("wandb", who="WandbLogger", extra="wandb")


class _WandbSink:
    def __init__(self, run: Any, target: dict[str, Any]) -> None:
        self.run = run
        self._target = target

    def target(self) -> dict[str, Any]:
        return self._target

    def deliver(self, records: list[Record]) -> None:
        import wandb  # noqa: PLC0415

        for record in records:
            payload, step = record.payload, record.step
            if record.kind == "scalars":
                self.run.log(payload["values"], step=step)
            elif record.kind == "hyperparams":
                self.run.config.update(payload["params"], allow_val_change=True)
            elif record.kind == "text":
                self.run.log(
                    {payload["name"]: wandb.Html(f"<pre>{html.escape(payload['text'])}</pre>")},
                    step=step,
                )
            elif record.kind == "image":
                self.run.log(
                    {payload["name"]: [wandb.Image(path) for path in payload["paths"]]}, step=step
                )
            elif record.kind == "histogram":
                name = payload["name"]
                data: dict[str, Any] = {f"{name}/{s}": payload[s] for s in _STATS}
                if payload["counts"]:
                    data[name] = wandb.Histogram(np_histogram=(payload["counts"], payload["edges"]))
                self.run.log(data, step=step)
            elif record.kind == "artifact" and payload.get("model_name"):
                artifact = wandb.Artifact(
                    payload["model_name"], type="model", metadata=payload.get("metadata")
                )
                path = payload["path"]
                if os.path.isdir(path):  # noqa: PTH112
                    artifact.add_dir(path)
                else:
                    artifact.add_file(path)
                self.run.log_artifact(artifact)
            elif record.kind == "artifact":
                path = Path(payload["path"])
                self.run.save(str(path), base_path=str(path.parent), policy="now")

    def is_permanent(self, error: BaseException) -> bool:
        return isinstance(error, TypeError | ValueError)

    def finish(self) -> None:
        self.run.finish()


def _sink_from_target(target: Mapping[str, Any]) -> _WandbSink:
    wandb = _import_wandb()
    run = wandb.init(
        project=target["project"],
        entity=target.get("entity"),
        id=target["run_id"],
        dir=target.get("dir"),
        mode=target.get("mode"),
        resume="allow",
        reinit="create_new",
    )
    return _WandbSink(run, dict(target))


register_sink_factory("wandb", _sink_from_target)


class WandbLogger(RemoteLogger):
    """Log to a Weights & Biases run; calls return at once and reach W&B from a worker thread.

    The run is started at construction on process 0 only (one run per job). A call without a
    step uses the last step given, so W&B's step never advances on its own. Text is logged as
    ``<pre>`` HTML, histograms as ``wandb.Histogram`` plus ``<name>/min|max|mean|std``.
    Set ``WANDB_MODE=offline`` (or pass ``mode="offline"``) to write the run locally.

    Args:
        name: the run name.
        project: the W&B project.
        entity: the W&B entity (team or user).
        config: the run's initial config (hyperparameters).
        tags: the run's tags.
        notes: the run's notes.
        run_id: resume this run id (``resume="allow"``).
        log_dir: the W&B ``dir``, image staging and the spool file; default
            ``resolve_output_dir(name)``.
        spool_path: the spool file; default ``<log_dir>/<name>.spool.jsonl``.
        close_timeout: seconds :meth:`close` keeps trying before spooling what is left.
        max_queue: the queue bound.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: log from every process.
        **init_options: passed to ``wandb.init`` (``mode``, ``group``, ``settings``...).

    Raises:
        ImportError: wandb is not installed (the ``wandb`` extra).

    Example:
        >>> import tempfile
        >>> with WandbLogger("demo", project="p", log_dir=tempfile.mkdtemp(), mode="offline") as logger:  # doctest: +SKIP
        ...     logger.log_scalar("loss", 0.5, step=1)
    """

    def __init__(
        self,
        name: str,
        project: str,
        *,
        entity: str | None = None,
        config: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        notes: str | None = None,
        run_id: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        spool_path: str | os.PathLike[str] | None = None,
        close_timeout: float = 30.0,
        max_queue: int = 100_000,
        process_index: int | None = None,
        all_processes: bool = False,
        **init_options: Any,
    ) -> None:
        wandb = _import_wandb()
        super().__init__(
            name,
            log_dir=log_dir,
            spool_path=spool_path,
            close_timeout=close_timeout,
            max_queue=max_queue,
            process_index=process_index,
            all_processes=all_processes,
        )
        self.project = project
        self.run: Any = None
        if not self.active:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        init_options.setdefault("reinit", "create_new")
        if run_id is not None:
            init_options.setdefault("resume", "allow")
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=name,
            config=dict(config or {}),
            tags=list(tags or ()),
            notes=notes,
            id=run_id,
            dir=str(self.log_dir),
            **init_options,
        )
        target = {
            "backend": "wandb",
            "project": project,
            "entity": entity,
            "run_id": self.run.id,
            "dir": str(self.log_dir),
            "mode": init_options.get("mode") or os.environ.get("WANDB_MODE"),
        }
        self._start(_WandbSink(self.run, target), f"WandbLogger({name!r})")

    def log_model(
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Log a file or directory as a W&B Artifact of type ``"model"`` (named ``name`` or ``<run>-model``)."""
        self._submit_file(
            "model",
            path,
            artifact_path=None,
            model_name=name or f"{safe_name(self.name)}-model",
            metadata=dict(metadata or {}),
        )

    def log_code(self, root: str | os.PathLike[str] = ".") -> None:
        """Save the source files under ``root`` with the run (``wandb.Run.log_code``), now."""
        if self.closed:
            raise LoggerClosedError(self.name)
        if self.active:
            self.run.log_code(str(root))

    @property
    def run_id(self) -> str | None:
        """The W&B run id (None on processes that do not log)."""
        return None if self.run is None else str(self.run.id)

    def finish(self) -> None:
        """End the run (the same as :meth:`close`; calling it again does nothing)."""
        self.close()
