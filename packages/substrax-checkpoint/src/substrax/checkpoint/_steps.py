"""Which folders of a store are its steps, and the step an overwrite keeps aside till it commits.

A step is a directory named by its step number that holds a metadata record of that same step
(``<step>/metadata/metadata``). Any other integer-named folder (a sweep's ``0/results.csv``, a
step directory renamed or copied under another number) is not a step: it is never listed,
restored, counted by retention or deleted, and a warning says so once.
"""

import contextlib
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orbax.checkpoint as ocp

from ._lock import agree, is_primary
from ._manifest import MANIFEST_FILE
from ._metadata import METADATA_ITEM
from ._write_errors import CheckpointWriteError


_logger = logging.getLogger(__name__)

REPLACED: Final = ".substrax-replaced"
"""An overwritten step waits here, whole, until its replacement is committed."""
_RECORD_FILE: Final = "metadata"  # the file orbax's JsonCheckpointHandler writes
_CACHE_SIZE: Final = 100_000
_NO_STEP: Final = -1  # a record that names no step (unreadable, or format 2 without one)
NOT_A_STEP: Final = "substrax_not_a_step"
"""The attribute marking a log record that warns of a folder that is not a step (its path)."""

# each record's step, by its path and (inode, mtime, size): a record read once per change
_recorded: dict[tuple[str, int, int, int], int] = {}
_warned: set[tuple[Path, str, int | None]] = set()
_guard = threading.Lock()


@dataclass(frozen=True, slots=True)
class StepScan:
    """A store's steps (each with its record's identity, changed by a rewrite) and its other folders."""

    steps: dict[int, tuple[int, int, int]]
    others: frozenset[int]  # integer-named folders that are not steps (left in place)


def _step_named(record: Path, found: os.stat_result) -> int:
    """The step ``record`` names (``_NO_STEP`` when it names none), read once per version."""
    key = (str(record), found.st_ino, found.st_mtime_ns, found.st_size)
    with _guard:
        cached = _recorded.get(key)
    if cached is not None:
        return cached
    step = _NO_STEP
    with contextlib.suppress(OSError, ValueError):
        raw: Any = json.loads(record.read_text())
        named = raw.get("step") if isinstance(raw, dict) else None
        if isinstance(named, int) and not isinstance(named, bool) and named >= 0:
            step = named
    with _guard:
        if len(_recorded) >= _CACHE_SIZE:
            _recorded.clear()
        _recorded[key] = step
    return step


def _warn_once(directory: Path, name: str, named: int | None) -> None:
    """Say once per folder that ``directory / name`` is not a step and stays where it is."""
    with _guard:
        if (directory, name, named) in _warned:
            return
        _warned.add((directory, name, named))
    folder = directory / name
    marked = {NOT_A_STEP: str(folder)}  # a command line summarises them in one line
    if named is None:
        _logger.warning(
            "%s is named like a checkpoint step but holds no substrax-checkpoint metadata record "
            "(%s): it is not a step, so the store never lists, restores or deletes it, and "
            "leaves it in place; keep other files out of the checkpoint directory",
            folder,
            folder / METADATA_ITEM / _RECORD_FILE,
            extra=marked,
        )
    else:
        _logger.warning(
            "%s holds the metadata record of step %s, not of step %s (renamed or copied from "
            "step %s's directory?): it is not a step, so the store never lists, restores or "
            "deletes it, and leaves it in place; rename it back to %s, or move it out of the store",
            folder,
            named,
            name,
            named,
            named,
            extra=marked,
        )


def scan_steps(directory: Path) -> StepScan:
    """The steps under ``directory`` and its integer-named folders that are not steps (warned of)."""
    try:
        with os.scandir(directory) as entries:
            named = [e for e in entries if e.name.isascii() and e.name.isdigit() and e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return StepScan({}, frozenset())
    steps: dict[int, tuple[int, int, int]] = {}
    others: set[int] = set()
    for entry in named:
        step = int(entry.name)
        record = Path(entry.path) / METADATA_ITEM / _RECORD_FILE
        try:
            found = record.stat()
        except (FileNotFoundError, NotADirectoryError):
            if (Path(entry.path) / MANIFEST_FILE).is_file():  # a sealed step that lost its record
                steps[step] = (0, 0, 0)  # its reads say what is missing
            elif Path(entry.path).is_dir():  # not removed meanwhile (retention's rename)
                others.add(step)
                _warn_once(directory, entry.name, None)
            continue
        except OSError:  # unreadable, not absent: a step whose reads will say what is wrong
            steps[step] = (0, 0, 0)
            continue
        recorded = _step_named(record, found)
        if entry.name != str(step) or recorded not in (step, _NO_STEP):
            others.add(step)
            _warn_once(directory, entry.name, recorded if recorded != _NO_STEP else None)
            continue
        steps[step] = (found.st_ino, found.st_mtime_ns, found.st_size)
    return StepScan(dict(sorted(steps.items())), frozenset(others))


def is_step(directory: Path, step: int) -> bool:
    """Whether ``directory / str(step)`` is a committed step holding its own record."""
    record = directory / str(step) / METADATA_ITEM / _RECORD_FILE
    try:
        found = record.stat()
    except OSError:
        return False
    return _step_named(record, found) in (step, _NO_STEP)


def move_aside(directory: Path, step: int, orbax: ocp.CheckpointManager) -> Path:
    """Move committed ``step`` under ``REPLACED`` (process 0, one rename); return where it went.

    Every process's manager then forgets the step; ``CheckpointWriteError`` if it could not be
    moved (it is then unchanged).
    """
    aside = directory / REPLACED / str(step)
    failure = ""
    if is_primary():
        try:
            if aside.exists():  # an earlier overwrite's copy, already replaced
                shutil.rmtree(aside)
            aside.parent.mkdir(exist_ok=True)
            (directory / str(step)).rename(aside)
        except OSError as error:
            failure = f"{type(error).__name__}: {error}"
    failure = agree(failure, topic="overwrite")
    if failure:
        cause = f"the step it replaces could not be moved aside ({failure}) and is unchanged"
        raise CheckpointWriteError(step=step, directory=directory, cause=cause)
    orbax.reload()  # its directory is gone: orbax must not count it
    return aside


def move_back(directory: Path, aside: Path | None, orbax: ocp.CheckpointManager) -> None:
    """The write replacing the step kept at ``aside`` (if any) failed: put that step back."""
    if aside is None:
        return
    if is_primary():
        try:
            put_back(directory, aside)
        except OSError:
            _logger.warning(
                "checkpoint step %s in %s could not be put back from %s after its overwrite "
                "failed; the next writer to open the store puts it back",
                aside.name,
                directory,
                aside,
                exc_info=True,
            )
    agree("", topic="overwrite")  # moved back before any process reloads
    orbax.reload()


def put_back(directory: Path, aside: Path) -> bool:
    """Return the step kept at ``aside`` to its place, unless a step stands there (then drop it).

    Returns whether it was put back.
    """
    step = int(aside.name)
    target = directory / aside.name
    if is_step(directory, step):  # its replacement was committed
        shutil.rmtree(aside, ignore_errors=True)
        return False
    if target.exists():  # something else took its place: both stay, for a person to decide
        _logger.warning(
            "checkpoint step %s was kept at %s during an overwrite, but %s is now something "
            "else; both are left in place: move one of them",
            step,
            aside,
            target,
        )
        return False
    aside.rename(target)
    return True


def restore_replaced(directory: Path) -> None:
    """At a writer's open: put back each step whose overwrite a crash interrupted, drop the rest."""
    try:
        kept = list((directory / REPLACED).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return
    for aside in kept:
        if not (aside.name.isascii() and aside.name.isdigit()) or not aside.is_dir():
            continue
        if put_back(directory, aside):
            _logger.warning(
                "the overwrite of checkpoint step %s in %s was interrupted before the new step "
                "was committed: the step it was replacing is back in place",
                aside.name,
                directory,
            )
