"""``substrax-compute run``: submit a job, follow it and fetch its outputs, leaving no run behind.

Everything that can refuse the command is checked before the job is submitted: the arguments,
the configuration, and the directories it writes to (the state directory, the backend's
``state_dir``, ``--into``), which must be directories this user may write to.

A run the backend started is then recorded and announced (``Submitted RUN to BACKEND.``) before
it is followed. Until both are done nothing ends the command without cancelling the run first:
a record that cannot be written (a full disk), a closed output, Ctrl-C, SIGTERM or SIGHUP. A
signal that comes while the backend submits is held until the submission returns, and the run
is then cancelled at once (a second one stops waiting, which may leave a run the backend started
going, unrecorded). While the run is followed, Ctrl-C, SIGTERM and SIGHUP cancel it (exit 130,
143, 129), and so does a reader of its output that went away (``run JOB | head``: a broken pipe,
noticed at the next line written; exit 141, as for SIGPIPE). Any other failure while following
leaves the run going and says how to follow or cancel it.
"""

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import TextIO

from substrax.support import EXIT_FAILED, EXIT_OK, UsageError, emit

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
from ._paths import require_directory, require_text, require_writable
from ._registry import load_backend
from ._report import dry_run, report


PROG = "substrax-compute"
DEFAULT_BACKEND = "local"

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
type _Handler = Callable[[int, FrameType | None], object] | int | None


def state_dir(*, writable: bool = False) -> Path:
    """The state directory's ``compute``, refused when a file stands where it must be.

    With ``writable`` (``run``, before it submits), also when this user may not write there.
    """
    if os.environ.get(STATE_DIR_ENV):
        what = f"the state directory (${STATE_DIR_ENV})"
        fix = f"point ${STATE_DIR_ENV} at a directory"
    else:
        what, fix = "the state directory", f"set ${STATE_DIR_ENV} to a directory"
    state = require_directory(default_state_dir(), what=what, fix=fix)
    compute = require_directory(state / "compute", what=what, fix=fix)
    if writable:
        require_writable(compute, what=what, fix=f"{fix} you can write to")
    return compute


def checked(backend: ComputeBackend, *, writable: bool = False) -> ComputeBackend:
    """``backend``, refused when its ``state_dir`` (if it has one) is a file or under one.

    With ``writable``, also when this user may not write there.
    """
    state: object = getattr(backend, "state_dir", None)
    if isinstance(state, Path):
        what = f"the {backend.name} backend's state_dir"
        fix = f"set [tool.substrax.compute.backends.{backend.name}] state_dir to a directory"
        require_directory(state, what=what, fix=fix)
        if writable:
            require_writable(state, what=what, fix=f"{fix} you can write to")
    return backend


def fetch_root(into: str | None) -> Path:
    """Where outputs are fetched: ``--into``, checked writable now, else the state directory."""
    if into is None:
        return state_dir() / "fetched"
    fix = "pass a directory you can write to"
    path = Path(require_text(into, what="--into", fix=fix)).resolve()
    return require_writable(path, what="--into", fix=fix)


def printable(lines: Iterator[str], stream: TextIO) -> Iterator[str]:
    """``lines`` with what ``stream``'s encoding can't show replaced (a C locale's ASCII)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    for line in lines:
        yield line.encode(encoding, errors="replace").decode(encoding)


def _handle_signals(handlers: dict[signal.Signals, _Handler]) -> dict[signal.Signals, _Handler]:
    """Install ``handlers``; return the ones they replaced. Only the main thread may."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, h) for sig, h in handlers.items()}


class _Interrupts:
    """Ctrl-C, SIGTERM and SIGHUP while ``run`` holds a run it must not leave behind.

    While the backend submits (``submitting``), the first is held and said on stderr; a second
    interrupts at once. Once ``submitted``, the first (or the one held) raises
    ``KeyboardInterrupt``; any later one is ignored, so it never cuts the cancel short.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.submitting = True
        self._previous: dict[signal.Signals, _Handler] = {}

    def __enter__(self) -> "_Interrupts":
        self._previous = _handle_signals(dict.fromkeys(_SIGNALS, self._on_signal))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _handle_signals(self._previous)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            if not self.submitting:
                signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as Ctrl-C's
            _warn(
                f"{signal.Signals(signum).name} while submitting: the run is cancelled once the "
                "backend has started it (again to stop waiting, which may leave it going)"
            )
        elif self.submitting:
            signal.default_int_handler(signum, frame)

    def submitted(self) -> None:
        """The run is recorded: a signal held while submitting interrupts now."""
        self.submitting = False
        if self.signum is not None:
            signal.default_int_handler(self.signum, None)


def _warn(text: str) -> None:
    """One line on stderr, if there is one to write to."""
    if sys.stderr is not None:
        sys.stderr.write(f"{PROG}: {text}\n")
        sys.stderr.flush()


def _note(stream: TextIO, text: str) -> None:
    """``text`` on ``stream``, else on stderr when ``stream``'s reader is gone."""
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        if sys.stderr is not None and stream is not sys.stderr:
            sys.stderr.write(text)


def run(args: argparse.Namespace, store: RunStore) -> int:
    """``substrax-compute run``: refuse, submit, record, follow, fetch (the module says how)."""
    from ._config import read_compute_config, require_locked_substrax, resolve_job  # noqa: PLC0415
    from ._spec import parse_accelerator  # noqa: PLC0415

    fix = "pass the project root, or leave --project out for the working directory"
    project = Path(require_text(args.project, what="--project", fix=fix)).resolve()
    into = fetch_root(args.into)
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
    if isinstance(state := settings.get("state_dir"), str) and state:
        settings["state_dir"] = str(project / Path(state).expanduser())  # not cwd's
    backend = checked(load_backend(name, settings), writable=not args.dry_run)
    # remote workers and extras install from uv.lock (a local worker uses one too): it pins substrax
    if name != "local" or spec.extras or (project / "uv.lock").exists():
        require_locked_substrax(project)
    if args.dry_run:
        return dry_run(name, backend, spec, project, as_json=args.json)
    state_dir(writable=True)  # the run's record: checked before anything is started
    # With --json, stdout holds only the JSON; what people read goes to stderr.
    notes: TextIO = sys.stderr if args.json else sys.stdout
    with _Interrupts() as interrupts:
        handle = with_settings(backend.submit(spec, project=project), settings)
        try:
            store.save(handle)
            interrupts.submitted()
            notes.write(f"Submitted {handle.run_id} to {name}.\n")
            if args.detach:
                notes.write(f"Follow it with: {PROG} logs {handle.run_id} --follow\n")
                if args.json:
                    emit(
                        {"run": handle.run_id, "backend": name, "job": spec.name}, "", as_json=True
                    )
                return EXIT_OK
            notes.flush()
        except BaseException as error:
            return _stop(backend, handle, error, notes, interrupts, grace=spec.stop_grace_seconds)
        try:
            follow(printable(backend.logs(handle, follow=True), notes), stream=notes)
            final = backend.status(handle)
            while not final.is_final:
                time.sleep(0.2)
                final = backend.status(handle)
        except (KeyboardInterrupt, BrokenPipeError) as error:
            return _stop(backend, handle, error, notes, interrupts, grace=spec.stop_grace_seconds)
        except BaseException:
            _warn(
                f"{handle.run_id} may still be going: `{PROG} logs {handle.run_id} --follow` "
                f"follows it, `{PROG} cancel {handle.run_id}` stops it"
            )
            raise
    fetched = backend.fetch(handle, into)
    report(handle, final, fetched, as_json=args.json)
    return EXIT_OK if final is RunState.SUCCEEDED else EXIT_FAILED


def _stop(
    backend: ComputeBackend,
    handle: RunHandle,
    error: BaseException,
    notes: TextIO,
    interrupts: _Interrupts,
    *,
    grace: float,
) -> int:
    """Cancel the run that ``error`` kept ``run`` from recording, announcing or following.

    Returns a signal's exit status (SIGTERM's 143, SIGHUP's 129); re-raises ``error``
    otherwise (``run_command`` gives Ctrl-C's 130 and a broken pipe's 141).
    """
    interrupts.submitting = False  # from here every signal is ignored: the cancel must finish
    interrupts.signum = interrupts.signum or signal.SIGINT
    saving = f"its task has {grace:g} s to save (--detach runs a job apart)"
    if isinstance(error, KeyboardInterrupt):
        _note(notes, f"Interrupted: cancelling {handle.run_id}, {saving}.\n")
    elif isinstance(error, BrokenPipeError):
        _warn(f"stdout was closed (a broken pipe): cancelling {handle.run_id}, {saving}")
    else:
        _warn(f"{handle.run_id} was started but not recorded or announced: cancelling it")
    backend.cancel(handle)
    if isinstance(error, KeyboardInterrupt) and interrupts.signum != signal.SIGINT:
        _warn(f"interrupted by {signal.Signals(interrupts.signum).name}")
        return 128 + interrupts.signum
    raise error
