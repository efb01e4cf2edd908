"""``substrax-compute``: run a project's jobs and look after their runs.

Exit codes (the substrax convention): 0 success; 1 the run did not succeed, or a backend's
operation failed; 2 the command was refused (bad arguments, a bad config, an unknown job, run
or backend, a missing file or SDK, a file where a directory must be), printed as one line
``substrax-compute: error: <reason>``. ``--json`` prints JSON instead of a table.

``status RUN`` exits 0 when the run succeeded, is still pending or running, or was cancelled
(the query worked), and 1 with an error line when the run failed. ``status`` and ``list`` of
every run skip a damaged run record (a truncated file, a directory in its place, a backend that
isn't installed), say so once on stderr (``substrax-compute: warning: skipped run record PATH
...; remove it``) and show the others; ``status RUN``, ``logs``, ``fetch`` and ``cancel`` of that
run exit 2 naming the file. ``logs`` and ``fetch`` of a run whose directory is gone exit 1
naming it. A runs directory that can't be read exits 1 naming it.

Ctrl-C while ``run`` follows a run cancels it (its task gets ``stop_grace_seconds`` to save),
exit 130; SIGTERM and SIGHUP (a CI timeout, a closed terminal) the same way, exit 128 + the
signal (143, 129). ``--detach`` leaves a run going apart. ``status`` and ``list`` start quickly.

Example::

    uv run substrax-compute run demo                 # submit, follow, fetch
    uv run substrax-compute run demo --dry-run       # what would be uploaded; submits nothing
    uv run substrax-compute run demo --detach
    uv run substrax-compute status --json
    uv run substrax-compute fetch demo-20260101T000000Z-abc123 --into ./outputs
"""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TextIO

from substrax.support import (
    EXIT_FAILED,
    EXIT_OK,
    CommandFailedError,
    MissingExtraError,
    UsageError,
    add_json_flag,
    emit,
    print_table,
    run_command,
)

from ._backend import (
    STATE_DIR_ENV,
    ComputeBackend,
    RunHandle,
    RunState,
    RunStore,
    default_state_dir,
    with_settings,
)
from ._display import follow
from ._errors import BackendRequestError
from ._paths import require_directory
from ._registry import load_backend
from ._report import check_fetched, dry_run, report
from ._run_errors import RecordFormatError, RunDirectoryGoneError, RunRecordError


PROG = "substrax-compute"
DEFAULT_BACKEND = "local"

# Refused commands (exit 2): bad input of every kind, each error a subclass of one of these.
_USAGE: tuple[type[BaseException], ...] = (
    LookupError,
    ValueError,
    FileNotFoundError,
    NotADirectoryError,
    MissingExtraError,
)
# A stored run's backend that can't be built: unknown, not installed, or bad stored settings.
_BACKEND_ERRORS: tuple[type[BaseException], ...] = (LookupError, ImportError, ValueError, TypeError)
# Failed operations (exit 1): a backend's command or the file system failed.
_FAILURES: tuple[type[BaseException], ...] = (
    OSError,
    subprocess.SubprocessError,
    BackendRequestError,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Run a project's jobs on local, modal or skypilot."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="submit a job; follow it and fetch its outputs")
    run.add_argument("job")
    run.add_argument("--backend", help="a registered backend (default: the configured one)")
    run.add_argument("--accelerator", help="KIND or KIND:N, e.g. H100:8")
    run.add_argument("--project", type=Path, default=Path(), help="the project root")
    run.add_argument("--detach", action="store_true", help="return once submitted")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="list the files that would be uploaded; submit nothing",
    )
    run.add_argument("--into", type=Path, help="fetch the outputs here")
    add_json_flag(run)
    status = commands.add_parser(
        "status",
        help="the state of one run or of every run",
        description=(
            "The state of one run or of every run. With RUN: exit 0 when the run succeeded, is "
            "pending or running, or was cancelled; 1 when it failed. Damaged run records are "
            "skipped with a warning."
        ),
    )
    status.add_argument("run", nargs="?")
    add_json_flag(status)
    logs = commands.add_parser("logs", help="a run's log")
    logs.add_argument("run")
    logs.add_argument("--follow", action="store_true")
    fetch = commands.add_parser("fetch", help="copy a run's outputs to this machine")
    fetch.add_argument("run")
    fetch.add_argument("--into", type=Path, help="default: the state directory, never the project")
    cancel = commands.add_parser("cancel", help="stop a run")
    cancel.add_argument("run")
    add_json_flag(commands.add_parser("list", help="the runs submitted from this machine"))
    return parser


def _checked(backend: ComputeBackend) -> ComputeBackend:
    """``backend``, refused when its ``state_dir`` (if it has one) is a file or under one."""
    state_dir: object = getattr(backend, "state_dir", None)
    if isinstance(state_dir, Path):
        require_directory(
            state_dir,
            what=f"the {backend.name} backend's state_dir",
            fix=f"set [tool.substrax.compute.backends.{backend.name}] state_dir to a directory",
        )
    return backend


def _backend_for(store: RunStore, handle: RunHandle) -> ComputeBackend:
    """The backend that runs ``handle``; one that can't be built makes its record unusable."""
    try:
        backend = load_backend(handle.backend, handle.settings)
    except _BACKEND_ERRORS as error:
        raise RunRecordError(
            store.root / f"{handle.run_id}.json",
            f"its backend {handle.backend!r} can't be loaded ({error})",
            fix="fix that, or remove it",
        ) from None
    return _checked(backend)


def _state_dir() -> Path:
    """The state directory, refused when a file stands where it must be."""
    if os.environ.get(STATE_DIR_ENV):
        what, fix = (
            f"the state directory (${STATE_DIR_ENV})",
            f"point ${STATE_DIR_ENV} at a directory",
        )
    else:
        what, fix = "the state directory", f"set ${STATE_DIR_ENV} to a directory"
    state = require_directory(default_state_dir(), what=what, fix=fix)
    return require_directory(state / "compute", what=what, fix=fix)


def _fetch_root(into: Path | None) -> Path:
    if into is None:
        return _state_dir() / "fetched"
    path = require_directory(
        into.resolve(), what="--into", fix="pass a directory (it is created when missing)"
    )
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):  # checked now: the outputs come after the run
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "is on a read-only file system" if read_only else "is not writable by this user"
        what = f"--into {path}" if existing == path else f"--into {path} can't be made: {existing}"
        raise UsageError(f"{what} {why}; pass a directory you can write to")
    return path


def _run(args: argparse.Namespace, store: RunStore) -> int:
    from ._config import read_compute_config, require_locked_substrax, resolve_job  # noqa: PLC0415
    from ._spec import parse_accelerator  # noqa: PLC0415

    project = args.project.resolve()
    fetch_root = _fetch_root(args.into)
    if args.backend is not None and not args.backend.strip():
        raise UsageError(
            f"--backend {args.backend!r} is empty; name a registered backend (local, modal, "
            "skypilot, or one of yours), or leave --backend out for the configured one"
        )
    config = read_compute_config(project)
    name = args.backend or config.backend or DEFAULT_BACKEND
    accelerator = None if args.accelerator is None else parse_accelerator(args.accelerator)
    spec = resolve_job(config, args.job, project=project, accelerator=accelerator)
    settings = dict(config.backends.get(name, {}))
    if isinstance(state_dir := settings.get("state_dir"), str) and state_dir:
        settings["state_dir"] = str(project / Path(state_dir).expanduser())  # not cwd's
    backend = _checked(load_backend(name, settings))
    # remote workers and extras install from uv.lock (a local worker uses one too): it pins substrax
    if name != "local" or spec.extras or (project / "uv.lock").exists():
        require_locked_substrax(project)
    if args.dry_run:
        return dry_run(name, backend, spec, project, as_json=args.json)
    handle = with_settings(backend.submit(spec, project=project), settings)
    store.save(handle)
    # With --json, stdout holds only the JSON; what people read goes to stderr.
    notes: TextIO = sys.stderr if args.json else sys.stdout
    notes.write(f"Submitted {handle.run_id} to {name}.\n")
    if args.detach:
        notes.write(f"Follow it with: substrax-compute logs {handle.run_id} --follow\n")
        if args.json:
            emit({"run": handle.run_id, "backend": name, "job": spec.name}, "", as_json=True)
        return EXIT_OK
    notes.flush()
    stopped_by: list[int] = []  # SIGTERM or SIGHUP, once one came

    def on_stop(signum: int, frame: FrameType | None) -> None:
        if not stopped_by:  # a second one must not cut the cancel short
            stopped_by.append(signum)
            signal.default_int_handler(signum, frame)  # KeyboardInterrupt: as Ctrl-C does

    previous = _handle_signals(dict.fromkeys(_FOLLOW_SIGNALS, on_stop))
    try:
        follow(_printable(backend.logs(handle, follow=True), notes), stream=notes)
        state = backend.status(handle)
        while not state.is_final:
            time.sleep(0.2)
            state = backend.status(handle)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP stop the run it follows
        notes.write(
            f"Interrupted: cancelling {handle.run_id}, its task has {spec.stop_grace_seconds:g} s "
            "to save (--detach runs a job apart).\n"
        )
        notes.flush()
        backend.cancel(handle)
        if not stopped_by:
            raise
        sys.stderr.write(f"{PROG}: interrupted by {signal.Signals(stopped_by[0]).name}\n")
        return 128 + stopped_by[0]
    finally:
        _handle_signals(previous)
    fetched = backend.fetch(handle, fetch_root)
    report(handle, state, fetched, as_json=args.json)
    return EXIT_OK if state is RunState.SUCCEEDED else EXIT_FAILED


_FOLLOW_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
type _Handler = Callable[[int, FrameType | None], object] | int | None


def _handle_signals(handlers: dict[signal.Signals, _Handler]) -> dict[signal.Signals, _Handler]:
    """Install ``handlers`` (None: leave that one); return the ones they replaced.

    Only the main thread may: elsewhere nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, h) for sig, h in handlers.items() if h is not None}


def _printable(lines: Iterator[str], stream: TextIO) -> Iterator[str]:
    """``lines`` with what ``stream``'s encoding can't show replaced (a C locale's ASCII)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    for line in lines:
        yield line.encode(encoding, errors="replace").decode(encoding)


def _usable_runs(store: RunStore) -> list[tuple[RunHandle, ComputeBackend]]:
    """Every stored run with its backend; each damaged record is skipped with one warning."""
    handles, damaged = store.scan()
    runs: list[tuple[RunHandle, ComputeBackend]] = []
    for handle in handles:
        try:
            runs.append((handle, _backend_for(store, handle)))
        except RunRecordError as error:
            damaged.append(error)
    for error in damaged:
        sys.stderr.write(f"{PROG}: warning: skipped {error}\n")
    return runs


def _status(run: str | None, store: RunStore, *, as_json: bool) -> int:
    if run:
        handle = store.load(run)
        runs = [(handle, _backend_for(store, handle))]
    else:
        runs = _usable_runs(store)
    rows: list[list[str]] = []
    for handle, backend in runs:
        try:
            state = backend.status(handle)
        except RecordFormatError as error:  # a damaged file of the run: its state is unknown
            if run:
                raise
            sys.stderr.write(f"{PROG}: warning: skipped run {handle.run_id}: {error}\n")
            continue
        except BackendRequestError as error:  # the backend did not answer: listed as unknown
            if run:
                raise
            sys.stderr.write(f"{PROG}: warning: {error}\n")
            rows.append([handle.run_id, handle.backend, handle.job, "unknown"])
            continue
        except MissingExtraError as error:  # the backend's SDK is not installed here
            problem = RunRecordError(
                store.root / f"{handle.run_id}.json",
                f"its backend {handle.backend!r} can't be used ({error})",
                fix="install that, or remove it",
            )
            if run:
                raise problem from None
            sys.stderr.write(f"{PROG}: warning: skipped {problem}\n")
            continue
        rows.append([handle.run_id, handle.backend, handle.job, str(state)])
    headers = ["run", "backend", "job", "state"]
    if as_json:
        emit([dict(zip(headers, row, strict=True)) for row in rows], "", as_json=True)
    else:
        print_table(headers, rows)
    if run and rows[0][3] == str(RunState.FAILED):
        raise CommandFailedError(f"run {run} failed; `{PROG} logs {run}` shows why")
    return EXIT_OK


def _list(store: RunStore, *, as_json: bool) -> int:
    handles = [handle for handle, _ in _usable_runs(store)]
    if as_json:
        data = [
            {
                "run": h.run_id,
                "backend": h.backend,
                "job": h.job,
                "submitted_at": h.submitted_at.isoformat(),
            }
            for h in handles
        ]
        emit(data, "", as_json=True)
        return EXIT_OK
    rows = [
        [h.run_id, h.backend, h.job, h.submitted_at.strftime("%Y-%m-%d %H:%M:%S")] for h in handles
    ]
    print_table(["run", "backend", "job", "submitted (UTC)"], rows)
    return EXIT_OK


def _dispatch(args: argparse.Namespace) -> int:
    store = RunStore(_state_dir() / "runs")
    if args.command == "run":
        return _run(args, store)
    if args.command == "status":
        return _status(args.run, store, as_json=args.json)
    if args.command == "list":
        return _list(store, as_json=args.json)
    handle = store.load(args.run)
    backend = _backend_for(store, handle)
    try:
        return _on_run(args, handle, backend)
    except RunDirectoryGoneError as error:  # the run exists, its files don't: the operation failed
        raise CommandFailedError(str(error)) from error


def _on_run(args: argparse.Namespace, handle: RunHandle, backend: ComputeBackend) -> int:
    if args.command == "logs":
        lines = _printable(backend.logs(handle, follow=args.follow), sys.stdout)
        if args.follow:
            follow(lines)
        else:
            sys.stdout.writelines(f"{line}\n" for line in lines)
        return EXIT_OK
    if args.command == "fetch":
        fetched = backend.fetch(handle, _fetch_root(args.into))
        sys.stdout.write(f"{fetched}\n")
        return check_fetched(fetched)  # a damaged manifest: as `status` refuses it
    backend.cancel(handle)
    state = backend.status(handle)
    sys.stdout.write(f"{handle.run_id} {state}\n")
    if state is not RunState.CANCELLED and not state.is_final:
        raise CommandFailedError(f"{handle.run_id} is still {state} after cancel; retry cancel")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0, 1 or 2).

    Example:
        >>> import contextlib, io
        >>> from substrax.compute._cli import main
        >>> with contextlib.redirect_stderr(io.StringIO()) as err:
        ...     main(["logs", "../nowhere"])
        2
        >>> err.getvalue().startswith("substrax-compute: error: no run '../nowhere'")
        True
    """
    args = _parser().parse_args(argv)
    return run_command(PROG, lambda: _dispatch(args), usage=_USAGE, failures=_FAILURES)
