"""``python -m substrax.checkpoint ls|show|verify|prune|upgrade``: inspect and maintain a store."""

import argparse
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
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

from ._errors import (
    BestMetricNotRecordedError,
    CheckpointLockedError,
    CheckpointNotFoundError,
    CheckpointNotWrittenError,
    CheckpointStoreNotADirectoryError,
    CheckpointStoreNotFoundError,
    CheckpointStoreReadOnlyError,
    CheckpointWriteError,
    UpgradeDestinationError,
)
from ._paths import check_store_directory
from ._retention import RetentionPolicy, recorded_metrics
from ._store import OrbaxCheckpointStore
from ._upgrade import upgrade_checkpoints
from ._verify import verify_step


PROG: Final = "python -m substrax.checkpoint"
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


def _ls(args: argparse.Namespace) -> int:
    """List every step; a step whose metadata cannot be read is listed as unreadable (exit 1)."""
    data: list[dict[str, Any]] = []
    rows: list[tuple[object, ...]] = []
    unreadable: dict[int, str] = {}
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:
        for step in store.list_steps():
            try:
                r = store.read_metadata(step)
            except CheckpointNotFoundError:  # a live writer deleted it since
                continue
            except (ValueError, OSError) as error:  # a damaged or unreadable metadata file
                unreadable[step] = (
                    f"permission denied on {error.filename}; give this user read access"
                    if isinstance(error, PermissionError)
                    else " ".join(str(error).split())
                )
                data.append({"step": step, "readable": False, "error": unreadable[step]})
                rows.append((step, None, None, f"UNREADABLE: {unreadable[step]}", None))
                continue
            data.append(
                {
                    "step": r.step,
                    "readable": True,
                    "epoch": r.epoch,
                    "created_at": r.created_at,
                    "metrics": dict(r.metrics),
                }
            )
            rows.append(
                (
                    r.step,
                    r.epoch,
                    r.created_at,
                    " ".join(f"{k}={v:.6g}" for k, v in r.metrics.items()),
                    ",".join(r.items),
                )
            )
    emit(
        data,
        format_table(("step", "epoch", "created_at", "metrics", "items"), rows),
        as_json=args.json,
    )
    if unreadable:
        steps = ", ".join(map(str, unreadable))
        raise CommandFailedError(
            f"the metadata of step(s) {steps} in {args.directory} cannot be read (listed as "
            "UNREADABLE); the other steps are listed; restore or delete the damaged step, and run "
            f"`{PROG} verify {args.directory}` to check the rest"
        )
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:
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


def _verify(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:
        for step in store.list_steps():
            failures, verified = verify_step(store, step)
            status = (
                "deleted"
                if failures is None
                else "FAILED"
                if failures
                else "ok"
                if verified
                else "unverified"
            )
            failures = failures or []
            first = failures[0] if failures else {"item": None, "leaf": None, "error": None}
            if status == "deleted":
                first = {**first, "error": "deleted while it was verified (a writer's retention)"}
            elif status == "unverified":
                first = {**first, "error": "no manifest (read back without checksums)"}
            results.append(
                {
                    "step": step,
                    "ok": status != "FAILED",
                    "status": status,
                    **first,
                    "failures": failures,
                }
            )
    rows = [
        (r["step"], "FAILED", f["item"], f["leaf"], f["error"])
        for r in results
        for f in r["failures"]
    ] + [(r["step"], r["status"], None, None, r["error"]) for r in results if r["ok"]]
    rows.sort(key=lambda row: row[0])
    emit(
        results, format_table(("step", "status", "item", "leaf", "error"), rows), as_json=args.json
    )
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_FAILED


def _prune(args: argparse.Namespace) -> int:
    try:
        policy = RetentionPolicy(
            max_to_keep=args.max_to_keep,
            keep_best=args.keep_best,
            best_metric=args.best_metric,
            best_mode=args.best_mode,
            keep_every=args.keep_every,
        )
    except ValueError as error:  # --max-to-keep 0, --keep-best without --best-metric...
        raise UsageError(str(error)) from error
    check_store_directory(args.directory)  # a writer would create it
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
    with OrbaxCheckpointStore(
        args.directory,
        read_only=args.dry_run,  # a dry run writes, deletes and locks nothing
        max_to_keep=policy.max_to_keep,
        keep_best=policy.keep_best,
        best_metric=policy.best_metric,
        best_mode=policy.best_mode,
        keep_every=policy.keep_every,
    ) as store:
        before = store.list_steps()
        if args.dry_run:
            metrics: dict[int, Mapping[str, float]] = {}
            for step in before if args.keep_best else ():
                with contextlib.suppress(CheckpointNotFoundError):  # a live writer deleted it
                    metrics[step] = store.read_metadata(step).metrics
            if args.keep_best:
                before = [step for step in before if step in metrics]
            missing = store.retention.unrecorded_metric(before, metrics)
            if missing is not None:
                raise BestMetricNotRecordedError(
                    metric=missing,
                    directory=args.directory,
                    recorded=tuple(recorded_metrics(metrics)),
                )
            keep = store.retention.steps_to_keep(before, metrics)
            deleted = [s for s in before if s not in keep]
        else:
            deleted = store.prune()
        return deleted, [s for s in before if s not in deleted]


def _upgrade(args: argparse.Namespace) -> int:
    check_store_directory(args.source)
    steps = upgrade_checkpoints(args.source, args.destination)
    data = {"source": str(args.source), "destination": str(args.destination), "steps": steps}
    listed = ", ".join(map(str, steps))
    text = f"upgraded {len(steps)} step(s) from {args.source} to {args.destination}: {listed}"
    emit(data, text, as_json=args.json)
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Inspect and maintain a checkpoint store."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        add_json_flag(sub)
        return sub

    command("ls", "list steps with their metrics").add_argument("directory", type=_store_path)
    show = command("show", "one step's metadata and tree (shapes, dtypes, bytes)")
    show.add_argument("directory", type=_store_path)
    show.add_argument("step", type=int_argument("step"))
    command(
        "verify", "check every step's files against its manifest (size and CRC-32C)"
    ).add_argument("directory", type=_store_path)
    prune = command("prune", "delete the steps the retention rules do not keep")
    prune.add_argument("directory", type=_store_path)
    prune.add_argument("--max-to-keep", type=int, default=None)
    prune.add_argument("--keep-best", type=int, default=0)
    prune.add_argument("--best-metric", default=None)
    prune.add_argument("--best-mode", choices=[mode.value for mode in Mode], default=Mode.MIN.value)
    prune.add_argument("--keep-every", type=int, default=None)
    prune.add_argument("--dry-run", action="store_true")
    upgrade = command("upgrade", "copy a store (any readable format) into the current format")
    upgrade.add_argument("source", type=_store_path)
    upgrade.add_argument("destination", type=_store_path)
    return parser


_COMMANDS: Final[dict[str, Callable[[argparse.Namespace], int]]] = {
    "ls": _ls,
    "show": _show,
    "verify": _verify,
    "prune": _prune,
    "upgrade": _upgrade,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    0 on success; 1 for a failed operation (a broken step, a store another process writes);
    2 for bad usage or input (a store path that is missing or not a directory, a step the store
    does not hold, retention rules that make no sense or rank by a metric no step records, a
    destination that is not empty or is a file, a file this user may not read). ``ls`` lists a
    step whose metadata cannot be read as UNREADABLE (``"readable": false`` with its ``error``
    in ``--json``), lists the others, and exits 1: the listing is incomplete. Errors
    are one line on stderr, ``python -m substrax.checkpoint: error: ...``. Only ``prune``
    without ``--dry-run`` and ``upgrade``'s destination write; every other command opens the
    store ``read_only``. ``python -m substrax.checkpoint`` also hides orbax's notices about
    those settings (:func:`quiet_orbax_notices`); called in-process, ``main`` leaves the
    process's loggers alone.

    Example:
        >>> import tempfile
        >>> from substrax.checkpoint._cli import main
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     main(["ls", "--json", directory])
        []
        0
    """
    parser = _parser()
    args = parser.parse_args(argv)
    command = _COMMANDS[args.command]
    return run_command(
        parser.prog, lambda: _permitted(command, args), usage=_USAGE, failures=_FAILURES
    )


def _permitted(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run ``command``; a file this user may not read or write is bad input (exit 2), named."""
    try:
        return command(args)
    except CheckpointStoreReadOnlyError:
        raise
    except PermissionError as error:
        path = error.filename if error.filename is not None else "a file of the store"
        raise UsageError(
            f"permission denied on {path}; give this user access to it (chmod/chown), or run "
            "the command as the store's owner"
        ) from None
