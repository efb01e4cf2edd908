"""``python -m substrax.checkpoint ls|show|verify|prune|upgrade``: inspect and maintain a store."""

import argparse
import contextlib
import errno
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Final

from substrax.support import (
    EXIT_FAILED,
    EXIT_OK,
    CommandFailedError,
    Mode,
    UsageError,
    add_json_flag,
    emit,
    format_table,
    int_argument,
    run_command,
)

from ._index import INDEX_FILE
from ._lock import LOCK_FILE
from ._paths import check_store_directory
from ._read_errors import (
    CheckpointNotFoundError,
    CheckpointStoreNotADirectoryError,
    CheckpointStoreNotFoundError,
)
from ._reads import verify_step
from ._retention import RetentionPolicy, prunable
from ._steps import scan_steps
from ._store import OrbaxCheckpointStore
from ._upgrade import upgrade_checkpoints
from ._write_errors import (
    BestMetricNotRecordedError,
    CheckpointLockedError,
    CheckpointNotWrittenError,
    CheckpointStoreReadOnlyError,
    CheckpointWriteError,
    UpgradeDestinationError,
)


PROG: Final = "python -m substrax.checkpoint"
_LISTED: Final = 10  # folders named in a line
_USAGE: Final = (  # bad input: exit 2
    CheckpointStoreNotFoundError,
    CheckpointStoreNotADirectoryError,
    CheckpointNotFoundError,
    UpgradeDestinationError,
)
_FAILURES: Final = (  # the operation failed: exit 1
    CheckpointLockedError,
    CheckpointWriteError,
    CheckpointNotWrittenError,
    ValueError,
    OSError,
)


def _store_path(text: str) -> Path:
    """A path argument; an empty one is refused (``Path("")`` would be the working directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty; pass a checkpoint store's directory")
    return Path(text)


def _check_holds_a_store(directory: Path, steps: Sequence[int], *, writes: bool = False) -> None:
    """Refuse a directory of other files and no store (no step, no writer lock): a mistyped path.

    An empty one lists as an empty store (a writer may be about to open it); a command that
    ``writes`` refuses it too, rather than make it a store.
    """
    if steps or any((directory / name).exists() for name in (LOCK_FILE, INDEX_FILE)):
        return
    if not any(directory.iterdir()):
        if writes:
            raise UsageError(f"{directory} is empty: it holds no checkpoint store; check the path")
        return
    others = _named_like_steps(directory)
    if others:
        others = f"; its folders named like steps ({others}) hold no step's metadata record"
    raise UsageError(
        f"{directory} holds no checkpoint store (no step, and no {LOCK_FILE}, which a store "
        f"writes when it is opened){others}; check the path"
    )


def _named_like_steps(directory: Path) -> str:
    """The folders of ``directory`` named like steps that are none, listed ("" if none)."""
    others = sorted(scan_steps(directory).others)
    more = f" and {len(others) - _LISTED} more" if len(others) > _LISTED else ""
    return ", ".join(map(str, others[:_LISTED])) + more


def _ls(args: argparse.Namespace) -> int:
    """List every step; a step whose metadata cannot be read is listed as unreadable (exit 1)."""
    data: list[dict[str, Any]] = []
    rows: list[tuple[object, ...]] = []
    unreadable: list[int] = []
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:
        _check_holds_a_store(args.directory, steps := store.list_steps())
        for step in steps:
            try:
                r = store.read_metadata(step)
            except CheckpointNotFoundError:  # a live writer deleted it since
                continue
            except (ValueError, OSError) as error:  # a damaged or unreadable metadata file
                text = (
                    f"permission denied on {error.filename}; give this user read access"
                    if isinstance(error, PermissionError)
                    else " ".join(str(error).split())
                )
                unreadable.append(step)
                data.append({"step": step, "readable": False, "error": text})
                rows.append((step, None, None, f"UNREADABLE: {text}", None))
                continue
            metrics = dict(r.metrics)
            data.append(
                {
                    "step": r.step,
                    "readable": True,
                    "epoch": r.epoch,
                    "created_at": r.created_at,
                    "metrics": metrics,
                }
            )
            shown = " ".join(f"{k}={v:.6g}" for k, v in metrics.items())
            rows.append((r.step, r.epoch, r.created_at, shown, ",".join(r.items)))
    table = format_table(("step", "epoch", "created_at", "metrics", "items"), rows)
    emit(data, table, as_json=args.json)
    if unreadable:
        raise CommandFailedError(
            f"the metadata of step(s) {', '.join(map(str, unreadable))} in {args.directory} cannot "
            "be read (listed as UNREADABLE); the other steps are listed; restore or delete the "
            f"damaged step, and run `{PROG} verify {args.directory}` to check the rest"
        )
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:
        _check_holds_a_store(args.directory, store.list_steps())
        try:
            record = store.read_metadata(args.step)
            tree = store.describe(args.step)
        except CheckpointNotFoundError as error:
            held = ", ".join(map(str, error.available[-10:])) or "none"
            raise UsageError(
                f"no checkpoint step {args.step} in {args.directory} (steps held: {held}); "
                f"run `{PROG} ls {args.directory}` to see the steps"
            ) from None
    data = {
        "metadata": record.to_dict(),
        "items": {name: [asdict(leaf) for leaf in leaves] for name, leaves in tree.items()},
    }
    meta = "\n".join(f"{k}: {v}" for k, v in record.to_dict().items())
    rows = [
        (name, leaf.path or "<root>", leaf.shape, leaf.dtype, leaf.nbytes)
        for name, leaves in tree.items()
        for leaf in leaves
    ]
    total = sum(leaf.nbytes or 0 for leaves in tree.values() for leaf in leaves)
    text = f"{meta}\n\n{format_table(('item', 'leaf', 'shape', 'dtype', 'bytes'), rows)}\ntotal bytes: {total}"
    emit(data, text, as_json=args.json)
    return EXIT_OK


_NOTES: Final = {
    "deleted": "deleted while it was verified (a writer's retention)",
    "unverified": "no manifest (read back without checksums)",
}


def _verify(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:
        _check_holds_a_store(args.directory, steps := store.list_steps())
        for step in steps:
            failures, verified = verify_step(store, step)
            status = "FAILED" if failures else "ok" if verified else "unverified"
            if failures is None:
                status = "deleted"
            note = {"item": None, "leaf": None, "error": _NOTES.get(status)}
            entry = {"step": step, "ok": status != "FAILED", "status": status}
            results.append(
                entry | (failures[0] if failures else note) | {"failures": failures or []}
            )
    rows = [
        (r["step"], "FAILED", f["item"], f["leaf"], f["error"])
        for r in results
        for f in r["failures"]
    ] + [(r["step"], r["status"], None, None, r["error"]) for r in results if r["ok"]]
    rows.sort(key=lambda row: row[0])
    table = format_table(("step", "status", "item", "leaf", "error"), rows)
    emit(results, table, as_json=args.json)
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_FAILED


def _prune(args: argparse.Namespace) -> int:
    try:  # each rule's flag is named after its field
        policy = RetentionPolicy(
            **{rule.name: getattr(args, rule.name) for rule in fields(RetentionPolicy)}
        )
    except ValueError as error:  # --max-to-keep 0, --keep-best without --best-metric...
        raise UsageError(str(error)) from error
    check_store_directory(args.directory)  # a writer would create it
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:  # nor lock a stray one
        _check_holds_a_store(args.directory, store.list_steps(), writes=True)
    try:
        deleted, kept = _apply(args, policy)
    except CheckpointLockedError as error:
        pid = error.pid if error.pid is not None else "?"
        raise CommandFailedError(
            f"the checkpoint store at {args.directory} is being written by another process "
            f"(pid {pid} on host {error.host or '?'}); wait for the writer to finish, or add "
            "--dry-run to see what prune would delete"
        ) from None
    except BestMetricNotRecordedError as error:
        shown = ", ".join(error.recorded) or "no metrics"
        raise UsageError(
            f"--best-metric {error.metric!r}: no step in {args.directory} records it (the steps "
            f"record: {shown}); pass one of those, or drop --keep-best"
        ) from None
    data = {"deleted": deleted, "kept": kept, "dry_run": bool(args.dry_run)}
    verb = "would delete" if args.dry_run else "deleted"
    emit(data, f"{verb} {len(deleted)} step(s): {deleted}\nkept: {kept}", as_json=args.json)
    return EXIT_OK


def _apply(args: argparse.Namespace, policy: RetentionPolicy) -> tuple[list[int], list[int]]:
    """Prune (or, with ``--dry-run``, work out) the steps ``policy`` drops: (deleted, kept)."""
    # a dry run writes, deletes and locks nothing
    with OrbaxCheckpointStore(args.directory, read_only=args.dry_run, **asdict(policy)) as store:
        before = store.list_steps()
        if not args.dry_run:
            deleted = store.prune()
        else:
            metrics: dict[int, Mapping[str, float]] = {}
            for step in before if args.keep_best else ():
                with contextlib.suppress(CheckpointNotFoundError):  # a live writer deleted it
                    metrics[step] = store.read_metadata(step).metrics
            if args.keep_best:
                before = [step for step in before if step in metrics]
            deleted = prunable(policy, before, metrics, args.directory)
        return deleted, [s for s in before if s not in deleted]


def _upgrade(args: argparse.Namespace) -> int:
    check_store_directory(args.source)
    with OrbaxCheckpointStore(args.source, read_only=True) as store:  # nor copy a stray folder
        _check_holds_a_store(args.source, store.list_steps(), writes=True)
    steps = upgrade_checkpoints(args.source, args.destination)
    data = {"source": str(args.source), "destination": str(args.destination), "steps": steps}
    listed = ", ".join(map(str, steps)) or "none"
    text = f"upgraded {len(steps)} step(s) from {args.source} to {args.destination}: {listed}"
    emit(data, text, as_json=args.json)
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect and maintain a checkpoint store. Checkpoints are read on the CPU, "
        "whatever JAX_PLATFORMS says: no accelerator is started (nor its memory taken).",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(
        name: str, run: Callable[[argparse.Namespace], int], help_text: str, *paths: str
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.set_defaults(run=run)
        add_json_flag(sub)
        for path in paths:
            sub.add_argument(path, type=_store_path)
        return sub

    command("ls", _ls, "list steps with their metrics", "directory")
    show = command(
        "show", _show, "one step's metadata and tree (shapes, dtypes, bytes)", "directory"
    )
    show.add_argument("step", type=int_argument("step"))
    verify = "check every step's files against its manifest (size and CRC-32C)"
    command("verify", _verify, verify, "directory")
    prune = command(
        "prune", _prune, "delete the steps the retention rules do not keep", "directory"
    )
    prune.add_argument("--max-to-keep", type=int, default=None)
    prune.add_argument("--keep-best", type=int, default=0)
    prune.add_argument("--best-metric", default=None)
    prune.add_argument("--best-mode", choices=[mode.value for mode in Mode], default=Mode.MIN.value)
    prune.add_argument("--keep-every", type=int, default=None)
    prune.add_argument("--dry-run", action="store_true")
    upgrade = "copy a store (any readable format) into the current format"
    command("upgrade", _upgrade, upgrade, "source", "destination")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    0 on success; 1 for a failed operation (a broken step, a store another process writes, a
    step ``ls`` lists as UNREADABLE); 2 for bad usage or input (a missing store, a directory
    holding none, or an empty one for ``prune`` and ``upgrade``, a step it does not hold, bad
    retention rules, a destination that is not empty, a file this user may not read, a path
    on a read-only file system that would be written), with one error line on stderr. Only
    ``prune`` without ``--dry-run`` and ``upgrade`` write. Called in-process, ``main`` leaves
    the process's loggers and its jax platform alone (``python -m`` sets both, see
    ``__main__``).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    return run_command(parser.prog, lambda: _permitted(args), usage=_USAGE, failures=_FAILURES)


def _permitted(args: argparse.Namespace) -> int:
    """Run the command; a file this user may not read or write is bad input (exit 2), named.

    So is a path on a read-only file system that ``prune`` or ``upgrade`` would write. Folders
    named like steps that are none are summed up in one warning line once the command is done.
    """
    try:
        done = args.run(args)
    except CheckpointStoreReadOnlyError:
        raise
    except PermissionError as error:
        path = error.filename if error.filename is not None else "a file of the store"
        raise UsageError(
            f"permission denied on {path}; give this user access to it (chmod/chown), or run "
            "the command as the store's owner"
        ) from None
    except OSError as error:
        if error.errno != errno.EROFS:
            raise
        path = error.filename if error.filename is not None else "the store"
        advice = _READ_ONLY_ADVICE.get(args.command, "")
        raise UsageError(
            f"{path} is on a read-only file system, and {args.command} writes there; {advice}"
        ) from None
    directory = args.source if args.command == "upgrade" else args.directory
    others = _named_like_steps(directory)
    if others:
        sys.stderr.write(
            f"{PROG}: warning: the folders named like steps in {directory} ({others}) hold no "
            "step's metadata record: they are no checkpoints, and are left in place; move them "
            "out of the store\n"
        )
    return done


_READ_ONLY_ADVICE: Final = {
    "prune": "run it where the store is mounted read-write, or add --dry-run to see what it "
    "would delete",
    "upgrade": "upgrade into a destination on a writable file system",
}
