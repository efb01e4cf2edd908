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

An empty or blank argument (``status ""``, ``--into ""``, ``--project ""``: an unset shell
variable) is refused, exit 2. A command started with stdout closed (``>&-``) exits 2 with its
error line; one whose stdout's reader goes away (``| head``) stops quietly, exit 141.

``run`` cancels a run it started but could not record or announce, whatever stopped it (see
``_cli_run``). Ctrl-C while ``run`` follows a run cancels it (its task gets
``stop_grace_seconds`` to save), exit 130; SIGTERM and SIGHUP (a CI timeout, a closed terminal)
the same way, exit 128 + the signal (143, 129), and so does a closed stdout, exit 141.
``--detach`` leaves a run going apart. ``status`` and ``list`` start quickly.

Example::

    uv run substrax-compute run demo                 # submit, follow, fetch
    uv run substrax-compute run demo --dry-run       # what would be uploaded; submits nothing
    uv run substrax-compute run demo --detach
    uv run substrax-compute status --json
    uv run substrax-compute fetch demo-20260101T000000Z-abc123 --into ./outputs
"""

import argparse
import subprocess
import sys
from collections.abc import Sequence

from substrax.support import (
    EXIT_OK,
    EXIT_USAGE,
    CommandFailedError,
    MissingExtraError,
    add_json_flag,
    emit,
    print_table,
    run_command,
)

from ._backend import ComputeBackend, RunHandle, RunState, RunStore
from ._cli_run import PROG, checked, fetch_root, printable, run, state_dir
from ._display import follow
from ._errors import BackendRequestError
from ._paths import require_text
from ._registry import load_backend
from ._report import check_fetched
from ._run_errors import RecordFormatError, RunDirectoryGoneError, RunRecordError


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
    run.add_argument("--project", default=".", help="the project root")
    run.add_argument("--detach", action="store_true", help="return once submitted")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="list the files that would be uploaded; submit nothing",
    )
    run.add_argument("--into", help="fetch the outputs here")
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
    fetch.add_argument("--into", help="default: the state directory, never the project")
    cancel = commands.add_parser("cancel", help="stop a run")
    cancel.add_argument("run")
    add_json_flag(commands.add_parser("list", help="the runs submitted from this machine"))
    return parser


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
    return checked(backend)


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
    if getattr(args, "run", None) is not None:  # `status ""` listed every run, and exited 0
        require_text(args.run, what="RUN", fix=f"name a run (`{PROG} list` shows them)")
    store = RunStore(state_dir() / "runs")
    if args.command == "run":
        return run(args, store)
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
        lines = printable(backend.logs(handle, follow=args.follow), sys.stdout)
        if args.follow:
            follow(lines)
        else:
            sys.stdout.writelines(f"{line}\n" for line in lines)
        return EXIT_OK
    if args.command == "fetch":
        fetched = backend.fetch(handle, fetch_root(args.into))
        sys.stdout.write(f"{fetched}\n")
        return check_fetched(fetched)  # a damaged manifest: as `status` refuses it
    backend.cancel(handle)
    state = backend.status(handle)
    sys.stdout.write(f"{handle.run_id} {state}\n")
    if state is not RunState.CANCELLED and not state.is_final:
        raise CommandFailedError(f"{handle.run_id} is still {state} after cancel; retry cancel")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0, 1, 2; 130, 143, 129 or 141 when stopped).

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
    if sys.stdout is None:  # started with stdout closed (`>&-`): what it prints has nowhere to go
        if sys.stderr is not None:
            sys.stderr.write(
                f"{PROG}: error: stdout is closed; run it with stdout open (redirect it to a "
                "file, or to /dev/null to discard what it prints)\n"
            )
        return EXIT_USAGE
    return run_command(PROG, lambda: _dispatch(args), usage=_USAGE, failures=_FAILURES)
