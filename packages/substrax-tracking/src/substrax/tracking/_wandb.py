"""WandbLogger: a Weights & Biases run fed from a background queue."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from substrax.support import check_seconds

from ._errors import ReservedMetricNameError
from ._hparams import check_hyperparams, merge_params
from ._log_files import json_ready
from ._paths import ensure_writable_dir, safe_name
from ._remote import RemoteLogger, check_resume
from ._replay import replay_spool
from ._wandb_sink import WandbSink, bounded_settings, import_wandb


_logger = logging.getLogger(__name__)

# the keys W&B writes in each history row itself: a metric of that name is replaced silently
_RESERVED: frozenset[str] = frozenset({"_step", "_runtime", "_timestamp", "_wandb"})


def _nan_as_text(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with each NaN as the file log's ``"NaN"`` (W&B writes a NaN as null)."""
    return json.loads(json.dumps(config), parse_constant=lambda c: c if c == "NaN" else float(c))


def _setting(settings: Any, key: str) -> str | None:
    """What ``settings`` (a mapping or a ``wandb.Settings``) sets ``key`` to, as text, if anything."""
    if isinstance(settings, Mapping):
        given = cast("Mapping[str, Any]", settings).get(key)
    elif key in getattr(settings, "model_fields_set", ()):
        given = getattr(settings, key, None)
    else:
        given = None
    return str(given) if given else None


def wandb_root_dir(
    name: str,
    log_dir: str | os.PathLike[str] | None,
    init_options: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> Path:
    """The directory W&B writes a run under (its ``dir``): runs go to ``<it>/wandb/``.

    Example:
        >>> from substrax.tracking._wandb import wandb_root_dir
        >>> str(wandb_root_dir("demo", None, {}, env={"WANDB_DIR": "/data/wandb"}))
        '/data/wandb'
        >>> str(wandb_root_dir("demo", "/runs/demo", {}, env={"WANDB_DIR": "/data/wandb"}))
        '/runs/demo'
    """
    environ = os.environ if env is None else env
    given = (
        init_options.get("dir")
        or _setting(init_options.get("settings"), "root_dir")
        or log_dir
        or environ.get("WANDB_DIR")
    )
    if given:
        return Path(given).expanduser().resolve()
    if environ.get("AVITAI_OUTPUT_DIR"):
        from substrax.artifacts import resolve_output_dir  # noqa: PLC0415

        return resolve_output_dir(name, env=environ).path
    data_home = environ.get("XDG_DATA_HOME", "")
    if not Path(data_home).is_absolute():  # the XDG spec: a relative value is to be ignored
        data_home = str(Path.home() / ".local" / "share")
    return Path(data_home).resolve() / "substrax"


def _check_init_options(init: Any, options: Mapping[str, Any]) -> None:
    """Refuse, as Python refuses a call, an option ``wandb.init`` does not take.

    Passed on, it failed every ``wandb.init`` of the run in the background, and each record
    was set aside as refused.
    """
    accepted = inspect.signature(init).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return
    if unknown := sorted(set(options) - set(accepted)):
        raise TypeError(
            f"WandbLogger got an unexpected keyword argument {unknown[0]!r}: neither it nor "
            f"wandb.init takes it (its other options go to wandb.init: {', '.join(accepted)})"
        )


class WandbLogger(RemoteLogger):
    """Log to a Weights & Biases run; calls return at once and reach W&B from a worker thread.

    The run is started on process 0 only. A call without a step uses the last step given. Text
    is logged as ``<pre>`` HTML, histograms as ``wandb.Histogram`` plus
    ``<name>/min|max|mean|std``. W&B's variables (``WANDB_MODE``, ``WANDB_PROJECT``,
    ``WANDB_RUN_ID``...) apply where no argument is given. If ``wandb.init`` has not returned
    within ``connect_timeout``, a warning says so and records are spooled until the run starts.
    The tracking guide says where runs are written and how ``resume_step`` rewinds a run.

    Args:
        name: the run name.
        project: the W&B project; default ``WANDB_PROJECT`` (or W&B's default).
        entity: the W&B entity (team or user); default ``WANDB_ENTITY``.
        config: the run's initial config (hyperparameters), which later calls of
            :meth:`log_hyperparams` merge into (mappings key by key, later values winning).
        tags: the run's tags.
        notes: the run's notes.
        run_id: resume this run id (``resume="allow"``); default ``WANDB_RUN_ID`` or a new id.
        resume_step: with ``run_id``, rewind the run to this step (the checkpoint's).
        log_dir: the W&B ``dir`` (:attr:`root_dir`, see the tracking guide), media and the spool file.
        spool_path: the spool file; default ``<log_dir>/<name>.spool.jsonl``.
        close_timeout: seconds :meth:`close` keeps trying before spooling what is left.
        connect_timeout: the most seconds construction waits for ``wandb.init``.
        max_queue: records waiting past which the worker writes them to the spool at once.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: log from every process.
        **init_options: passed to ``wandb.init`` (``mode``, ``group``, ``settings``...).

    Raises:
        ImportError: wandb is not installed (the ``wandb`` extra).
        ValueError: ``connect_timeout`` is not a finite number > 0, or ``close_timeout`` one >= 0.
        ResumeWithoutRunIdError: ``resume_step`` without ``run_id`` or ``WANDB_RUN_ID``.
        LogDirNotWritableError: a directory W&B writes to is not writable.
        TypeError: an option in ``init_options`` that ``wandb.init`` does not take.
        LoggedTypeError: a key or string of ``config`` holds a lone surrogate (a ``TypeError``).

    Example:
        >>> import tempfile
        >>> from substrax.tracking import WandbLogger
        >>> with tempfile.TemporaryDirectory() as directory:  # doctest: +SKIP
        ...     with WandbLogger("demo", project="p", log_dir=directory, mode="offline") as logger:
        ...         logger.log_scalar("loss", 0.5, step=1)
    """

    _sink: WandbSink | None = None

    def __init__(
        self,
        name: str,
        project: str | None = None,
        *,
        entity: str | None = None,
        config: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        notes: str | None = None,
        run_id: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        spool_path: str | os.PathLike[str] | None = None,
        close_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        max_queue: int = 100_000,
        process_index: int | None = None,
        all_processes: bool = False,
        resume_step: int | None = None,
        **init_options: Any,
    ) -> None:
        wandb = import_wandb()
        _check_init_options(wandb.init, init_options)
        connect_timeout = check_seconds("connect_timeout", connect_timeout, positive=True)
        if run_id is None and resume_step is not None:  # W&B's default id, as wandb.init reads it
            run_id = os.environ.get("WANDB_RUN_ID") or None
        check_resume("WandbLogger", resume_step, run_id)
        self.resume_step = resume_step
        # the run's config so far: each log_hyperparams call sends the subtrees it changed, merged
        self._hparams: dict[str, Any] = _nan_as_text(json_ready(dict(config or {})))
        check_hyperparams(self._hparams)
        super().__init__(
            name,
            log_dir=log_dir,
            spool_path=spool_path,
            close_timeout=close_timeout,
            max_queue=max_queue,
            process_index=process_index,
            all_processes=all_processes,
        )
        self.project = project if project is not None else os.environ.get("WANDB_PROJECT")
        self.root_dir = wandb_root_dir(name, log_dir, init_options)
        if not self.active:
            return
        ensure_writable_dir(self.log_dir, "WandbLogger")
        ensure_writable_dir(self.root_dir / "wandb", "WandbLogger")
        if "WANDB_REINIT" not in os.environ:
            init_options.setdefault("reinit", "create_new")
        if resume_step is not None:
            init_options["resume_from"] = f"{run_id}?_step={resume_step}"
        elif run_id is not None:
            init_options.setdefault("resume", "allow")
        self._run_id = run_id or os.environ.get("WANDB_RUN_ID") or wandb.util.generate_id()
        settings = init_options["settings"] = bounded_settings(
            init_options.get("settings"), init_options.get("mode"), connect_timeout
        )
        target = {
            "backend": "wandb",
            "project": self.project,
            "entity": entity if entity is not None else os.environ.get("WANDB_ENTITY"),
            "run_id": self._run_id,
            "dir": str(self.root_dir),
            "mode": init_options.get("mode") or os.environ.get("WANDB_MODE"),
            "base_url": _setting(settings, "base_url") or os.environ.get("WANDB_BASE_URL") or None,
        }
        if resume_step is not None:  # a replay rewinds the run the same way
            target["resume_step"] = resume_step
        init = {
            "project": self.project,
            "entity": entity,
            "name": name,
            "config": copy.deepcopy(self._hparams),
            "tags": None if tags is None else list(tags),
            "notes": notes,
            "id": self._run_id,
            **init_options,
            "dir": str(self.root_dir),
        }
        if resume_step is not None:
            _send_earlier_attempt(self.spool_path, self._run_id, connect_timeout)
        sink = WandbSink(target, init, rewound_to=resume_step)
        if (not_started := sink.connect(connect_timeout)) is not None:
            _logger.warning(
                f"WandbLogger({name!r}): wandb.init {not_started}; logging goes on, records are "
                f"kept in {self.spool_path} and sent once the run {self._run_id} starts"
            )
        self._sink = sink
        self._start(sink, f"WandbLogger({name!r})", reached=not_started is None)
        runs = self.root_dir / "wandb"
        _logger.info(
            f"WandbLogger({name!r}): run {self._run_id} is written under {runs} (offline, upload "
            f"it with `wandb sync {runs / f'offline-run-*-{self._run_id}'}`)"
        )

    @property
    def run(self) -> Any:
        """The ``wandb`` run (None on processes that do not log, and until ``wandb.init`` returned)."""
        return None if self._sink is None else self._sink.run

    @property
    def run_id(self) -> str | None:
        """The W&B run id (None on processes that do not log)."""
        return None if self._sink is None else self._run_id

    def _check_names(self, names: Iterable[object], step: int | None) -> None:
        """Refuse a name W&B writes itself (:data:`_RESERVED`), before anything is queued."""
        if not _RESERVED.isdisjoint(names):
            name = min(_RESERVED.intersection(names))
            raise ReservedMetricNameError(name, self._last_step if step is None else step)

    def _write_scalar(self, name: str, value: Any, step: int | None) -> None:
        self._check_names((name,), step)
        super()._write_scalar(name, value, step)

    def _submit(
        self, kind: Any, step: int | None, payload: dict[str, Any], *, materialized: bool = False
    ) -> None:
        # every other record of a name (scalars, text, image, histogram) passes here
        self._check_names(payload["values"] if kind == "scalars" else (payload.get("name"),), step)
        super()._submit(kind, step, payload, materialized=materialized)

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        # W&B's config.update replaces a key's whole value: send each key's merged subtree
        given = _nan_as_text(json_ready(dict(params)))
        merge_params(self._hparams, given)
        merged = copy.deepcopy({key: self._hparams[key] for key in given})
        self._submit("hyperparams", None, {"params": merged}, materialized=True)

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
        self._check_open()
        if self.active and self.run is not None:
            self.run.log_code(str(root))

    def mark_failed(self, exit_code: int = 1) -> None:
        """End the run with ``exit_code`` (non-zero: W&B shows it failed) when it closes."""
        super().mark_failed()
        if self._sink is not None and not self.closed:
            self._sink.exit_code = exit_code

    def finish(self, exit_code: int | None = None) -> None:
        """End the run as :meth:`close` does; a non-zero ``exit_code`` marks it failed."""
        if exit_code:
            self.mark_failed(exit_code)
        self.close()


def _send_earlier_attempt(spool: Path, run_id: str, timeout: float) -> None:
    """Replay what a killed attempt of ``run_id`` left in ``spool``, within ``timeout`` s, first.

    W&B holds one live run per id: once the resumed (rewound) run starts, the earlier attempt's
    run cannot, so its records never arrived ("run ID ... is in use"). A replay that fails
    warns, and what it could not send stays in the spool for the logger's own sends.
    """
    try:
        if f'"run_id": {json.dumps(run_id)}' not in spool.read_text(errors="replace"):
            return
    except OSError:  # no spool: nothing was left
        return
    with contextlib.suppress(Exception):  # another replay holds it, or it is damaged: warned
        replay_spool(spool, timeout=timeout)
