"""``substrax-compute``: run a project's jobs and look after their runs.

Exit codes: 0 success, 1 the run did not succeed, 2 the command was refused (a bad config, an
unknown job, run or backend, a missing file, a file where a directory must be), printed as
``substrax-compute: <reason>``.

Example::

    uv run substrax-compute run demo                 # submit, follow, fetch
    uv run substrax-compute run demo --dry-run       # what would be uploaded; submits nothing
    uv run substrax-compute run demo --detach
    uv run substrax-compute status
    uv run substrax-compute fetch demo-20260101T000000Z-abc123 --into ./outputs
"""

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import _display
from ._environment import node_outputs
from ._paths import DirectoryPathError, require_directory
from ._supervisor import describe_status
from ._upload import UPLOAD_IGNORE_FILE, UploadSet, UploadsProject, human_size
from .backend import (
    STATE_DIR_ENV,
    ComputeBackend,
    RunHandle,
    RunState,
    RunStore,
    default_state_dir,
)
from .config import read_compute_config, require_locked_substrax, resolve_job
from .manifest import MANIFEST_NAME, read_manifest
from .registry import load_backend
from .spec import JobSpec, parse_accelerator


DEFAULT_BACKEND = "local"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="substrax-compute", description="Run a project's jobs on local, modal or skypilot."
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
    status = commands.add_parser("status", help="the state of one run or of every run")
    status.add_argument("run", nargs="?")
    logs = commands.add_parser("logs", help="a run's log")
    logs.add_argument("run")
    logs.add_argument("--follow", action="store_true")
    fetch = commands.add_parser("fetch", help="copy a run's outputs to this machine")
    fetch.add_argument("run")
    fetch.add_argument("--into", type=Path, help="default: the state directory, never the project")
    cancel = commands.add_parser("cancel", help="stop a run")
    cancel.add_argument("run")
    commands.add_parser("list", help="the runs submitted from this machine")
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


def _backend_for(handle: RunHandle) -> ComputeBackend:
    return _checked(load_backend(handle.backend, handle.settings))


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
    return require_directory(
        into.resolve(), what="--into", fix="pass a directory (it is created when missing)"
    )


def _dry_run(name: str, backend: ComputeBackend, spec: JobSpec, project: Path) -> int:
    tasks = ", ".join(task.name for task in spec.tasks)
    sys.stdout.write(f"Job {spec.name} on {name}: {len(spec.tasks)} task(s): {tasks}\n")
    if not isinstance(backend, UploadsProject):
        sys.stdout.write(f"The {name} backend uploads nothing; it runs the job in {project}.\n")
        sys.stdout.write("Dry run: nothing was submitted.\n")
        return 0
    upload: UploadSet = backend.upload_set(spec, project=project)
    rows = [[human_size(size), file] for file, size in zip(upload.files, upload.sizes, strict=True)]
    _display.table(["size", "file"], rows)
    rules = (
        "what git would track"
        if upload.source == "git"
        else "git listed no file: a walk honouring the project's .gitignore files"
    )
    sys.stdout.write(
        f"Would upload {len(upload.files)} file(s), {human_size(upload.total_bytes)} "
        f"({upload.total_bytes} bytes) from {upload.root} ({rules}, less {UPLOAD_IGNORE_FILE})\n"
    )
    if upload.held_back:
        sys.stdout.write(
            f"Held back as secrets: {', '.join(upload.held_back)} "
            "(name one in the job's include_files to upload it)\n"
        )
    sys.stdout.write("Dry run: nothing was submitted.\n")
    return 0


def _summary(outputs: Sequence[str]) -> str:
    """Top-level files by name and directories with their file counts.

    Example:
        >>> _summary(["plot.png", "ckpt/1/a", "ckpt/1/b"])
        'plot.png, ckpt/ (2 files)'
    """
    counts: dict[str, int] = {}
    for path in outputs:
        head, sep, _ = path.partition("/")
        key = f"{head}/" if sep else head
        counts[key] = counts.get(key, 0) + 1
    shown = [
        k if not k.endswith("/") else f"{k} ({n} file{'s' * (n != 1)})" for k, n in counts.items()
    ]
    return ", ".join(shown) or "-"


def _report(handle: RunHandle, state: RunState, fetched: Path) -> None:
    path = fetched / MANIFEST_NAME
    if path.is_file():
        manifest = read_manifest(path)
        rows = [
            [t.name, str(t.status), f"{t.seconds:.1f}s", _summary(t.outputs), str(fetched / t.name)]
            for t in manifest.tasks
        ]
        _display.table(["task", "status", "time", "outputs", "where"], rows)
        if manifest.failed_node is not None:
            node, code = manifest.failed_node, manifest.failed_node_status
            how = "" if code is None else f" ({describe_status(code)})"
            sys.stdout.write(
                f"Node {node} of {manifest.nodes} failed first{how}; the other nodes were "
                f"stopped. Its logs: {node_outputs(fetched, node)}\n"
            )
    sys.stdout.write(f"{handle.run_id} {state}; outputs in {fetched}\n")


def _run(args: argparse.Namespace, store: RunStore) -> int:
    project = args.project.resolve()
    fetch_root = _fetch_root(args.into)
    config = read_compute_config(project)
    name = args.backend or config.backend or DEFAULT_BACKEND
    accelerator = parse_accelerator(args.accelerator) if args.accelerator else None
    spec = resolve_job(config, args.job, project=project, accelerator=accelerator)
    backend = _checked(load_backend(name, config.backends.get(name, {})))
    if name != "local" or spec.extras:
        require_locked_substrax(project)
    if args.dry_run:
        return _dry_run(name, backend, spec, project)
    handle = backend.submit(spec, project=project)
    store.save(handle)
    sys.stdout.write(f"Submitted {handle.run_id} to {name}.\n")
    if args.detach:
        sys.stdout.write(f"Follow it with: substrax-compute logs {handle.run_id} --follow\n")
        return 0
    sys.stdout.flush()
    _display.follow(backend.logs(handle, follow=True))
    state = backend.status(handle)
    while not state.is_final:
        time.sleep(0.2)
        state = backend.status(handle)
    fetched = backend.fetch(handle, fetch_root)
    _report(handle, state, fetched)
    return 0 if state is RunState.SUCCEEDED else 1


def _status(run: str | None, store: RunStore) -> int:
    handles = [store.load(run)] if run else store.handles()
    rows: list[list[str]] = []
    states: list[RunState] = []
    for handle in handles:
        state = _backend_for(handle).status(handle)
        states.append(state)
        rows.append([handle.run_id, handle.backend, handle.job, str(state)])
    _display.table(["run", "backend", "job", "state"], rows)
    return 1 if run and states[0] in {RunState.FAILED, RunState.CANCELLED} else 0


def _dispatch(args: argparse.Namespace) -> int:
    store = RunStore(_state_dir() / "runs")
    if args.command == "run":
        return _run(args, store)
    if args.command == "status":
        return _status(args.run, store)
    if args.command == "list":
        rows = [
            [h.run_id, h.backend, h.job, h.submitted_at.strftime("%Y-%m-%d %H:%M:%S")]
            for h in store.handles()
        ]
        _display.table(["run", "backend", "job", "submitted (UTC)"], rows)
        return 0
    handle = store.load(args.run)
    backend = _backend_for(handle)
    if args.command == "logs":
        lines = backend.logs(handle, follow=args.follow)
        if args.follow:
            _display.follow(lines)
        else:
            sys.stdout.writelines(f"{line}\n" for line in lines)
        return 0
    if args.command == "fetch":
        sys.stdout.write(f"{backend.fetch(handle, _fetch_root(args.into))}\n")
        return 0
    backend.cancel(handle)
    sys.stdout.write(f"{handle.run_id} {backend.status(handle)}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0, 1 or 2)."""
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (LookupError, FileNotFoundError, DirectoryPathError, ValueError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        sys.stderr.write(f"substrax-compute: {message}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
