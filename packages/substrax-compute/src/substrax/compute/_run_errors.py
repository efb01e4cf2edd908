"""The errors of substrax.compute's stored runs and records: the run store, a run, a record.

Exported from ``substrax.compute`` (and ``substrax.compute._errors``), whose name they show in
tracebacks.
"""

import dataclasses
from pathlib import Path

from substrax.support import StructuredError


class _RunError(StructuredError, public_module="substrax.compute"):
    """The base of the errors below: each shows as ``substrax.compute``'s, where users import it."""


class RunNotFoundError(_RunError, KeyError):
    """No run of that id was saved in the run store.

    Attributes:
        run_id: The id asked for.
        root: The store's directory.
    """

    template = "no run {run_id!r} in {root}; `substrax-compute list` shows them"

    run_id: str
    root: Path


class RunStoreError(_RunError, OSError):
    """The run store's directory exists but can't be read (a file in its place, no permission).

    Attributes:
        root: The run store's directory.
        reason: Why it can't be read.
    """

    template = (
        "cannot read the runs directory {root}: {reason}; "
        "make it a directory this user can read, or move it away"
    )

    root: Path
    reason: str


class RunDirectoryGoneError(_RunError, FileNotFoundError):
    """A stored run's directory (its logs and outputs) is no longer on this machine.

    Attributes:
        run_id: The run.
        run_dir: The directory that is gone.
    """

    template = (
        "run {run_id}'s directory {run_dir} is gone, so its logs and outputs can't be read; "
        "the run's record stays in `substrax-compute list` until you remove it"
    )

    run_id: str
    run_dir: Path


class RecordVersionError(_RunError, ValueError):
    """A job spec or manifest was written by another release (its ``schema_version`` differs).

    Attributes:
        record: ``"job spec"`` or ``"manifest"``.
        found: The version read.
        expected: The version this release reads.
        fix: What to do about it.
    """

    template = "{record} version {found!r} is not {expected}: {fix}"

    record: str
    found: object
    expected: int
    fix: str


class RecordFormatError(_RunError, ValueError, TypeError):
    """A stored record (a run handle, a manifest) is not the shape this release writes.

    Attributes:
        source: Where it was read from (a path, or ``"data"``).
        problem: What is wrong with it.
        cause: Why, as far as can be told (keyword-only; by default another release wrote it).
    """

    template = "{source}: {problem}; {cause}"

    source: object
    problem: str
    cause: str = dataclasses.field(
        default="it was not written by this substrax-compute release", kw_only=True
    )


class RunRecordError(RecordFormatError):
    """A stored run record (a handle in the run store) can't be used.

    It is unreadable or truncated, a directory stands in its place, or it names a backend that
    isn't installed or can't be built.

    Attributes:
        path: The record's file (also ``source``).
        reason: What is wrong with it (also ``problem``).
        fix: What to do, ending in "remove it".
    """

    template = "run record {path} can't be used: {reason}; {fix}"

    path: Path
    reason: str
    fix: str

    def __init__(self, path: Path, reason: str, *, fix: str = "remove it") -> None:
        # by hand: its fields follow the inherited ``source`` and ``problem``, which take the
        # same values; RecordFormatError's constructor sets those and formats this template
        self.path, self.reason, self.fix = path, reason, fix
        super().__init__(path, reason)
