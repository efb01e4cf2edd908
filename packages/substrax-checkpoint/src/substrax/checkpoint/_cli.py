"""``python -m substrax.checkpoint ls|show|verify|prune|upgrade``: inspect and maintain a store."""

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ._errors import (
    CheckpointCorruptError,
    CheckpointLockedError,
    CheckpointStoreNotADirectoryError,
    CheckpointStoreNotFoundError,
)
from ._metadata import CheckpointMetadata
from ._paths import check_store_directory
from ._store import OrbaxCheckpointStore
from ._upgrade import upgrade_checkpoints


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [
        [str(c) for c in headers],
        *[[("-" if c is None else str(c)) for c in r] for r in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _emit(args: argparse.Namespace, data: object, text: str) -> None:
    sys.stdout.write((json.dumps(data, indent=2) if args.json else text) + "\n")


def _ls(args: argparse.Namespace) -> int:
    records: list[CheckpointMetadata] = []
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:
        for step in store.list_steps():
            try:
                records.append(store.read_metadata(step))
            except OSError:
                if step in store.list_steps():
                    raise
                # a live writer's retention deleted it since the listing
    data = [
        {"step": r.step, "epoch": r.epoch, "created_at": r.created_at, "metrics": dict(r.metrics)}
        for r in records
    ]
    rows = [
        (
            r.step,
            r.epoch,
            r.created_at,
            " ".join(f"{k}={v:.6g}" for k, v in r.metrics.items()),
            ",".join(r.items),
        )
        for r in records
    ]
    _emit(args, data, _table(("step", "epoch", "created_at", "metrics", "items"), rows))
    return 0


def _show(args: argparse.Namespace) -> int:
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:
        record = store.read_metadata(args.step)
        tree = store.describe(args.step)
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
    text = f"{meta}\n\n{_table(('item', 'leaf', 'shape', 'dtype', 'bytes'), rows)}\ntotal bytes: {total}"
    _emit(args, data, text)
    return 0


def _verify_step(store: OrbaxCheckpointStore, step: int) -> list[dict[str, Any]]:
    """Read every item of ``step`` back (checksums checked); one entry per item that failed."""
    failures: list[dict[str, Any]] = []
    try:
        items = store.read_metadata(step).items
    except Exception as error:
        return [{"item": None, "leaf": None, "error": f"{type(error).__name__}: {error}"}]
    for item in items:
        try:
            store.restore(step, items=(item,), cast_dtypes=True)
        except CheckpointCorruptError as error:
            failures.append({"item": item, "leaf": error.leaf, "error": f"{error}"})
        except Exception as error:
            failures.append(
                {"item": item, "leaf": None, "error": f"{type(error).__name__}: {error}"}
            )
    return failures


def _verify(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    with OrbaxCheckpointStore(args.directory, read_only=True) as store:
        for step in store.list_steps():
            failures = _verify_step(store, step)
            first = failures[0] if failures else {"item": None, "leaf": None, "error": None}
            results.append({"step": step, "ok": not failures, **first, "failures": failures})
    rows = [
        (r["step"], "FAILED", f["item"], f["leaf"], f["error"])
        for r in results
        for f in r["failures"]
    ] + [(r["step"], "ok", None, None, None) for r in results if r["ok"]]
    rows.sort(key=lambda row: row[0])
    _emit(args, results, _table(("step", "status", "item", "leaf", "error"), rows))
    return 0 if all(r["ok"] for r in results) else 1


def _prune(args: argparse.Namespace) -> int:
    check_store_directory(args.directory)  # a writer would create it
    with OrbaxCheckpointStore(
        args.directory,
        read_only=args.dry_run,  # a dry run writes, deletes and locks nothing
        max_to_keep=args.max_to_keep,
        keep_best=args.keep_best,
        best_metric=args.best_metric,
        best_mode=args.best_mode,
        keep_every=args.keep_every,
    ) as store:
        before = store.list_steps()
        if args.dry_run:
            keep = store.retention.steps_to_keep(before, {})
            if args.keep_best:
                keep = store.retention.steps_to_keep(
                    before, {s: store.read_metadata(s).metrics for s in before}
                )
            deleted = [s for s in before if s not in keep]
        else:
            deleted = store.prune()
        kept = [s for s in before if s not in deleted]
    data = {"deleted": deleted, "kept": kept, "dry_run": bool(args.dry_run)}
    verb = "would delete" if args.dry_run else "deleted"
    _emit(args, data, f"{verb} {len(deleted)} step(s): {deleted}\nkept: {kept}")
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    steps = upgrade_checkpoints(args.source, args.destination)
    data = {"source": str(args.source), "destination": str(args.destination), "steps": steps}
    listed = ", ".join(map(str, steps))
    text = f"upgraded {len(steps)} step(s) from {args.source} to {args.destination}: {listed}"
    _emit(args, data, text)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m substrax.checkpoint", description="Inspect and maintain a checkpoint store."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--json", action="store_true", help="print JSON for scripts")
        return sub

    command("ls", "list steps with their metrics").add_argument("directory", type=Path)
    show = command("show", "one step's metadata and tree (shapes, dtypes, bytes)")
    show.add_argument("directory", type=Path)
    show.add_argument("step", type=int)
    command("verify", "read every array of every step back, checking its checksums").add_argument(
        "directory", type=Path
    )
    prune = command("prune", "delete the steps the retention rules do not keep")
    prune.add_argument("directory", type=Path)
    prune.add_argument("--max-to-keep", type=int, default=None)
    prune.add_argument("--keep-best", type=int, default=0)
    prune.add_argument("--best-metric", default=None)
    prune.add_argument("--best-mode", choices=("min", "max"), default="min")
    prune.add_argument("--keep-every", type=int, default=None)
    prune.add_argument("--dry-run", action="store_true")
    upgrade = command("upgrade", "copy a store (any readable format) into the current format")
    upgrade.add_argument("source", type=Path)
    upgrade.add_argument("destination", type=Path)
    return parser


_COMMANDS = {"ls": _ls, "show": _show, "verify": _verify, "prune": _prune, "upgrade": _upgrade}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    0 on success, 1 for a failed command (a broken step, a store another process writes), 2 for
    a store path that is missing or not a directory. Only ``prune`` without ``--dry-run`` and
    ``upgrade``'s destination write; every other command opens the store ``read_only``.

    Example:
        >>> import tempfile
        >>> main(["ls", "--json", tempfile.mkdtemp()])
        []
        0
    """
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except (CheckpointStoreNotFoundError, CheckpointStoreNotADirectoryError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    except (ValueError, OSError, CheckpointLockedError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 1
