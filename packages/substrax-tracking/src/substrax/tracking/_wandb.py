"""WandbLogger: a Weights & Biases run fed from a background queue."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

import html
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from substrax.support import check_seconds, require

from ._base import safe_name
from ._errors import LoggerClosedError
from ._first_attempt import FirstAttempt
from ._paths import ensure_writable_dir
from ._records import Record
from ._remote import RemoteLogger, check_resume
from ._spool import register_sink_factory


__all__ = ["WandbLogger", "base_url", "bounded_settings", "wandb_root_dir"]

_logger = logging.getLogger(__name__)

_STATS = ("min", "max", "mean", "std")
_GRAPHQL_RETRIES = 2
_REPLAY_TIMEOUT = 10.0


def _import_wandb() -> Any:
    return require("wandb", who="WandbLogger", distribution="substrax-tracking", extra="wandb")


_OFFLINE = ("offline", "dryrun", "disabled")


class _RunNotReadyError(ConnectionError):
    """``wandb.init`` has not returned yet."""


def bounded_settings(settings: Any, mode: str | None, timeout: float) -> Any:
    """``settings`` for ``wandb.init`` with W&B's network waits bounded by ``timeout`` seconds.

    Online, ``wandb.init`` against a server that does not answer waits for minutes (its login
    and GraphQL retries ignore ``init_timeout``), and so does the process at exit. Where neither
    the given settings nor a ``WANDB_*`` variable sets them, this bounds the login, the init and
    each GraphQL request, with few GraphQL retries (substrax retries the init itself).
    Offline, nothing changes.

    Example:
        >>> from substrax.tracking._wandb import bounded_settings
        >>> bounded_settings(None, "offline", 10.0) is None
        True
        >>> bounded_settings({"init_timeout": 60}, None, 10.0)["init_timeout"]
        60
    """
    if mode in _OFFLINE or (mode is None and os.environ.get("WANDB_MODE") in _OFFLINE):
        return settings
    defaults: dict[str, Any] = {
        "login_timeout": timeout,
        "init_timeout": timeout,
        "x_graphql_retry_max": _GRAPHQL_RETRIES,
        "x_graphql_timeout_seconds": timeout,
    }
    defaults = {k: v for k, v in defaults.items() if f"WANDB_{k.upper()}" not in os.environ}
    if settings is None:
        return defaults
    if isinstance(settings, Mapping):
        return {**defaults, **cast("Mapping[str, Any]", settings)}
    for key in ("login_timeout", "x_graphql_retry_max", "x_graphql_timeout_seconds"):
        if key in defaults and getattr(settings, key, 0) is None:
            setattr(settings, key, defaults[key])
    return settings


class _WandbSink:
    def __init__(
        self,
        target: dict[str, Any],
        init_options: dict[str, Any],
        *,
        rewind_from: int | None = None,
    ) -> None:
        self.run: Any = None
        self._target = target
        self._init_options = init_options
        # a replay of a resumed run's spool: rewind the run to just before its first record
        self._rewind_from = rewind_from
        self._first: FirstAttempt | None = None
        self.exit_code: int | None = None  # non-zero: the run failed

    def connect(self, timeout: float) -> bool:
        """Start the run from a thread of its own; wait at most ``timeout`` seconds.

        Returns:
            whether the run started. A refusal that retrying cannot fix (a ``UsageError``) is
            raised; a server that does not answer is not an error.
        """
        self._first = FirstAttempt(
            lambda: self._init(self._init_options), name="substrax-wandb-init"
        )
        if not self._first.wait(timeout):
            return False
        error = self.first_error
        if error is not None and isinstance(error, _import_wandb().errors.UsageError):
            raise error
        return self.run is not None

    @property
    def first_error(self) -> BaseException | None:
        """What ``wandb.init`` raised first (None while it runs, or when it succeeded)."""
        return None if self._first is None else self._first.error

    def _init(self, options: dict[str, Any]) -> None:
        self.run = _import_wandb().init(**options)

    def _ensure_run(self) -> Any:
        if self.run is None:
            if self._first is not None and self._first.running():
                raise _RunNotReadyError("wandb.init has not returned yet")
            if self.run is None:
                # resume the run the first attempt may have started (a rewind stays a rewind)
                again = {} if "resume_from" in self._init_options else {"resume": "allow"}
                self._init({**self._init_options, **again})
        return self.run

    def target(self) -> dict[str, Any]:
        return self._target

    def deliver(self, records: list[Record]) -> None:
        import wandb  # noqa: PLC0415

        if self.run is None and self._rewind_from is not None:
            self._init_options["resume_from"] = _rewind_point(
                self._init_options["id"], self._rewind_from, records
            )
        run = self._ensure_run()
        for record in records:
            payload, step = record.payload, record.step
            # an empty scalars record (its jax values were deleted before they were read) logs no row
            if record.kind == "scalars" and payload["values"]:
                run.log(payload["values"], step=step)
            elif record.kind == "hyperparams":
                run.config.update(payload["params"], allow_val_change=True)
            elif record.kind == "text":
                run.log(
                    {payload["name"]: wandb.Html(f"<pre>{html.escape(payload['text'])}</pre>")},
                    step=step,
                )
            elif record.kind == "image":
                run.log(
                    {payload["name"]: [wandb.Image(path) for path in payload["paths"]]}, step=step
                )
            elif record.kind == "histogram":
                name = payload["name"]
                data: dict[str, Any] = {f"{name}/{s}": payload[s] for s in _STATS}
                if payload["counts"]:
                    data[name] = wandb.Histogram(np_histogram=(payload["counts"], payload["edges"]))
                run.log(data, step=step)
            elif record.kind == "artifact" and payload.get("model_name"):
                artifact = wandb.Artifact(
                    payload["model_name"], type="model", metadata=payload.get("metadata")
                )
                path = payload["path"]
                if os.path.isdir(path):  # noqa: PTH112
                    artifact.add_dir(path)
                else:
                    artifact.add_file(path)
                run.log_artifact(artifact)
            elif record.kind == "artifact":
                path = Path(payload["path"])
                run.save(str(path), base_path=str(path.parent), policy="now")

    def is_permanent(self, error: BaseException) -> bool:
        return isinstance(error, TypeError | ValueError)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish(exit_code=self.exit_code)


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

    In order: ``dir=`` (or ``settings``' ``root_dir``), then ``log_dir``, then W&B's own
    ``WANDB_DIR``, then ``$AVITAI_OUTPUT_DIR/<name>``, then ``$XDG_DATA_HOME/substrax``
    (``~/.local/share/substrax``; a relative ``XDG_DATA_HOME`` is ignored, as the XDG spec says):
    a directory that lasts, never a temporary one that the OS may clear before ``wandb sync``
    uploads the run, and never the working tree.

    Example:
        >>> from substrax.tracking._wandb import wandb_root_dir
        >>> str(wandb_root_dir("demo", None, {}, env={"WANDB_DIR": "/data/wandb"}))
        '/data/wandb'
        >>> str(wandb_root_dir("demo", "/runs/demo", {}, env={"WANDB_DIR": "/data/wandb"}))
        '/runs/demo'
        >>> str(wandb_root_dir("demo", None, {}, env={"XDG_DATA_HOME": "/home/me/.data"}))
        '/home/me/.data/substrax'
    """
    environ = os.environ if env is None else env
    given = init_options.get("dir") or _setting(init_options.get("settings"), "root_dir")
    if given is None and log_dir is not None:
        given = log_dir
    if given is None and environ.get("WANDB_DIR"):
        given = environ["WANDB_DIR"]
    if given is not None:
        return Path(given).expanduser().resolve()
    from substrax.artifacts import resolve_output_dir  # noqa: PLC0415

    if environ.get("AVITAI_OUTPUT_DIR"):
        return resolve_output_dir(name, env=environ).path
    data_home = environ.get("XDG_DATA_HOME", "")
    if not Path(data_home).is_absolute():  # the XDG spec: a relative value is to be ignored
        data_home = str(Path.home() / ".local" / "share")
    return Path(data_home).resolve() / "substrax"


def base_url(settings: Any) -> str | None:
    """The W&B server a run talks to: ``settings``' ``base_url`` if set there, else ``WANDB_BASE_URL``.

    None when neither sets it (W&B then reads its own settings files).

    Example:
        >>> from substrax.tracking._wandb import base_url
        >>> base_url({"base_url": "http://127.0.0.1:8080"})
        'http://127.0.0.1:8080'
    """
    return _setting(settings, "base_url") or os.environ.get("WANDB_BASE_URL") or None


def _rewind_point(run_id: str, resume_step: int, records: Sequence[Record]) -> str:
    """The ``resume_from`` of a replay of a resumed run's spooled ``records`` (the first ones).

    The run is rewound to the step before the first spooled record, and never before
    ``resume_step``: what the resumed logger delivered before it spooled stays, and what the
    interrupted attempt logged past the checkpoint goes, as with the live logger.

    Example:
        >>> from substrax.tracking._records import Record
        >>> from substrax.tracking._wandb import _rewind_point
        >>> spooled = Record(kind="scalars", step=9, time=0.0, payload={"values": {"loss": 0.1}})
        >>> _rewind_point("abc", 5, [spooled]), _rewind_point("abc", 5, [])
        ('abc?_step=8', 'abc?_step=5')
    """
    steps = [record.step for record in records if record.step is not None]
    return f"{run_id}?_step={max(resume_step, min(steps, default=resume_step + 1) - 1)}"


def _sink_from_target(target: Mapping[str, Any]) -> _WandbSink:
    mode = target.get("mode")
    url = target.get("base_url")
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
    resume_step = target.get("resume_step")
    if resume_step is None:
        options["resume"] = "allow"
    return _WandbSink(
        dict(target), options, rewind_from=None if resume_step is None else int(resume_step)
    )


register_sink_factory("wandb", _sink_from_target)


class WandbLogger(RemoteLogger):
    """Log to a Weights & Biases run; calls return at once and reach W&B from a worker thread.

    The run is started at construction on process 0 only (one run per job). A call without a
    step uses the last step given, so W&B's step never advances on its own. Text is logged as
    ``<pre>`` HTML, histograms as ``wandb.Histogram`` plus ``<name>/min|max|mean|std``.
    Set ``WANDB_MODE=offline`` (or pass ``mode="offline"``) to write the run locally.

    Where runs go: W&B writes each run under ``<root_dir>/wandb/`` (offline:
    ``<root_dir>/wandb/offline-run-<time>-<id>/``; upload it later with
    ``wandb sync <root_dir>/wandb/offline-run-*``). :attr:`root_dir` is ``dir=`` if given,
    else ``log_dir``, else ``$WANDB_DIR``, else ``$AVITAI_OUTPUT_DIR/<name>``, else
    ``$XDG_DATA_HOME/substrax`` (``~/.local/share/substrax``): never a temporary directory
    and never the working tree. W&B's other variables
    (``WANDB_MODE``, ``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_RUN_ID``, ``WANDB_TAGS``,
    ``WANDB_NOTES``...) apply where the matching argument is not given; an argument wins.

    Resuming a run from a checkpoint of step ``S``: pass the first attempt's ``run_id`` and
    ``resume_step=S``. The run is started with W&B's rewind, ``resume_from="<run_id>?_step=S"``:
    W&B truncates the run's history after step ``S`` and the resumed run logs from ``S + 1``,
    so every step appears once. Offline, the resumed segment is a new ``offline-run-*``
    directory whose run record carries that rewind point (``branch_point``); ``wandb sync``
    applies it on the server. Records a resumed logger spooled carry ``S``: a replay rewinds
    the run to the step before the first of them (never before ``S``). Rewinding is a W&B
    server feature (in preview; not on self-managed servers); where the server refuses it,
    resume with ``run_id`` alone. W&B's
    service writes an offline run file in blocks: when the logging process is killed with
    SIGKILL, the rows it had not written yet are lost, those before the checkpoint included
    (a SIGTERM handled by ``PreemptionHandler`` closes the logger and loses nothing).

    Construction waits at most ``connect_timeout`` seconds for ``wandb.init`` (run in a thread
    of its own; online, its login, init and GraphQL waits are bounded too, see
    :func:`bounded_settings`). If W&B has not answered by then, a warning says so and the run
    goes on: records are spooled and sent once the run starts (the run id is chosen up front,
    so :attr:`run_id` is known at once). The spool records the server (``settings``'
    ``base_url`` or ``WANDB_BASE_URL``, see :func:`base_url`), so a replay sends the records
    there whatever ``WANDB_BASE_URL`` the replaying shell has.

    Args:
        name: the run name.
        project: the W&B project; default ``WANDB_PROJECT`` (or W&B's default).
        entity: the W&B entity (team or user); default ``WANDB_ENTITY``.
        config: the run's initial config (hyperparameters).
        tags: the run's tags.
        notes: the run's notes.
        run_id: resume this run id (``resume="allow"``); default ``WANDB_RUN_ID`` or a new id.
        resume_step: with ``run_id``, rewind the run to this step (the checkpoint's) instead:
            its history after it is dropped (``resume_from``).
        log_dir: the W&B ``dir`` (:attr:`root_dir`), image staging and the spool file;
            default: :attr:`root_dir` as above, and ``resolve_output_dir(name)`` for the rest.
        spool_path: the spool file; default ``<log_dir>/<name>.spool.jsonl`` (with
            ``all_processes``, ``<name>.p<index>.spool.jsonl`` on a process other than 0).
        close_timeout: seconds :meth:`close` keeps trying before spooling what is left.
        connect_timeout: the most seconds construction waits for ``wandb.init``.
        max_queue: the queue bound.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: log from every process.
        **init_options: passed to ``wandb.init`` (``mode``, ``group``, ``settings``...).

    Raises:
        ImportError: wandb is not installed (the ``wandb`` extra).
        ValueError: ``connect_timeout`` is not a finite number > 0, or ``close_timeout`` not
            a finite number >= 0 (NaN and infinity are refused: pick a bound).
        ResumeWithoutRunIdError: ``resume_step`` without ``run_id`` (a ``ValueError``).

    Example:
        >>> import tempfile
        >>> from substrax.tracking import WandbLogger
        >>> with tempfile.TemporaryDirectory() as directory:  # doctest: +SKIP
        ...     with WandbLogger("demo", project="p", log_dir=directory, mode="offline") as logger:
        ...         logger.log_scalar("loss", 0.5, step=1)
    """

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
        wandb = _import_wandb()
        connect_timeout = check_seconds("connect_timeout", connect_timeout, positive=True)
        check_resume("WandbLogger", resume_step, run_id)
        self.resume_step = resume_step
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
        self._sink: _WandbSink | None = None
        self._run_id = run_id
        if not self.active:
            return
        # W&B falls back to /tmp/wandb, silently, when its dir is not writable: refuse up front.
        ensure_writable_dir(self.log_dir, "WandbLogger")
        ensure_writable_dir(self.root_dir / "wandb", "WandbLogger")
        if "WANDB_REINIT" not in os.environ:
            init_options.setdefault("reinit", "create_new")
        if resume_step is not None:
            init_options["resume_from"] = f"{run_id}?_step={resume_step}"
        elif run_id is not None:
            init_options.setdefault("resume", "allow")
        self._run_id = run_id or os.environ.get("WANDB_RUN_ID") or wandb.util.generate_id()
        mode = init_options.get("mode") or os.environ.get("WANDB_MODE")
        init_options["settings"] = bounded_settings(
            init_options.get("settings"), init_options.get("mode"), connect_timeout
        )
        target = {
            "backend": "wandb",
            "project": self.project,
            "entity": entity if entity is not None else os.environ.get("WANDB_ENTITY"),
            "run_id": self._run_id,
            "dir": str(self.root_dir),
            "mode": mode,
            "base_url": base_url(init_options.get("settings")),
        }
        if resume_step is not None:  # a replay rewinds the run the same way
            target["resume_step"] = resume_step
        sink = _WandbSink(
            target,
            {
                "project": self.project,
                "entity": entity,
                "name": name,
                "config": dict(config or {}),
                "tags": None if tags is None else list(tags),
                "notes": notes,
                "id": self._run_id,
                **init_options,
                "dir": str(self.root_dir),
            },
        )
        if not sink.connect(connect_timeout):
            failure = sink.first_error
            _logger.warning(
                "WandbLogger(%r): wandb.init %s; logging goes on, records are kept in %s and "
                "sent once the run %s starts",
                name,
                f"did not return within {connect_timeout:g} s"
                if failure is None
                else f"failed ({type(failure).__name__}: {failure})",
                self.spool_path,
                self._run_id,
            )
        self._sink = sink
        self._start(sink, f"WandbLogger({name!r})")
        _logger.info(
            "WandbLogger(%r): run %s is written under %s (offline, upload it with `wandb sync %s`)",
            name,
            self._run_id,
            self.root_dir / "wandb",
            self.root_dir / "wandb" / f"offline-run-*-{self._run_id}",
        )

    @property
    def run(self) -> Any:
        """The ``wandb`` run (None on processes that do not log, and until ``wandb.init`` returned)."""
        return None if self._sink is None else self._sink.run

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
        if self.active and self.run is not None:
            self.run.log_code(str(root))

    @property
    def run_id(self) -> str | None:
        """The W&B run id (None on processes that do not log)."""
        return None if self._sink is None else self._run_id

    def mark_failed(self, exit_code: int = 1) -> None:
        """End the run with ``exit_code`` (non-zero: W&B shows it failed) when it closes."""
        super().mark_failed()
        sink = getattr(self, "_sink", None)  # None also while __init__ runs
        if sink is not None and not self.closed:
            sink.exit_code = exit_code

    def finish(self, exit_code: int | None = None) -> None:
        """End the run (the same as :meth:`close`; calling it again does nothing).

        Args:
            exit_code: the run's exit code; non-zero marks it failed (see :meth:`mark_failed`).
        """
        if exit_code:
            self.mark_failed(exit_code)
        self.close()
