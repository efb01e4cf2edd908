"""The results table that ends ``substrax-compute run``: each task's ``summary.json``, read after the fetch.

A task opts in by writing ``summary.json``, a JSON object, under its output directory
(``$AVITAI_OUTPUT_DIR``, at any depth; the shallowest one counts). Known keys become columns:
``accuracy`` (``test_accuracy``, else ``accuracy``, else ``val_accuracy``), ``val loss``
(``val_loss``), ``baseline`` (``baseline``, else ``unigram_baseline``), ``tokens/s``
(``tokens_per_second``) and ``MFU`` (``mfu``, a fraction). A column shows when any summary
holds one of its keys; a value that is not a number (None: unknown, such as MFU on CPU) shows
as ``-``. ``outputs`` maps names to paths: absolute ones as the task saw them (they
are found again in the fetched copy) or relative to the summary's directory. Other keys are
kept in ``--json`` only. A missing or malformed ``summary.json`` is no error: its row shows
``-`` and a note says why.

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from substrax.compute._results import read_result
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     task = Path(directory) / "train"
    ...     (task / "run" / "ckpt").mkdir(parents=True)
    ...     summary = {"test_accuracy": 0.98, "outputs": {"checkpoints": "/worker/run/ckpt"}}
    ...     _ = (task / "run" / "summary.json").write_text(json.dumps(summary))
    ...     result = read_result("train", task, ["run/summary.json", "run/ckpt/1"])
    ...     result.metrics, result.outputs["checkpoints"] == str(task / "run" / "ckpt")
    ({'accuracy': 0.98}, True)
"""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import Any, cast

from substrax.support import format_table


SUMMARY_NAME = "summary.json"
"""The file a task writes under its output directory to appear in the results table."""


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One column of the results table: the first of ``keys`` a summary holds, as ``spec``."""

    name: str
    column: str
    keys: tuple[str, ...]
    spec: str


METRICS = (
    Metric(
        name="accuracy",
        column="accuracy",
        keys=("test_accuracy", "accuracy", "val_accuracy"),
        spec=".4f",
    ),
    Metric(name="val_loss", column="val loss", keys=("val_loss",), spec=".4f"),
    Metric(name="baseline", column="baseline", keys=("baseline", "unigram_baseline"), spec=".4f"),
    Metric(name="tokens_per_second", column="tokens/s", keys=("tokens_per_second",), spec=",.0f"),
    Metric(name="mfu", column="MFU", keys=("mfu",), spec=".1%"),
)
"""The known metrics, in column order."""


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """What one task's ``summary.json`` said, with its outputs' paths in the fetched copy."""

    task: str
    summary_path: Path | None = None
    summary: dict[str, Any] | None = None
    metrics: dict[str, float | None] = field(default_factory=dict[str, float | None])
    outputs: dict[str, str] = field(default_factory=dict[str, str])
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """This result as JSON-ready data."""
        return {
            "task": self.task,
            "summary_path": None if self.summary_path is None else str(self.summary_path),
            "metrics": dict(self.metrics),
            "outputs": dict(self.outputs),
            "summary": self.summary,
            "note": self.note,
        }


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _fetched_path(path: str, task_dir: Path, summary_dir: Path) -> str:
    """``path`` in the fetched copy when it is there, else as the task wrote it."""
    written = PurePath(path)
    if not written.is_absolute():
        local = summary_dir / written
        return str(local) if local.exists() else path
    parts = written.parts[1:]
    for start in range(len(parts)):
        local = task_dir.joinpath(*parts[start:])
        if local.exists():
            return str(local)
    return path


def read_result(task: str, task_dir: Path, outputs: Sequence[str]) -> TaskResult:
    """The result of ``task`` from its fetched directory and its outputs (relative paths)."""
    found = sorted(
        (PurePosixPath(p) for p in outputs if PurePosixPath(p).name == SUMMARY_NAME),
        key=lambda p: (len(p.parts), str(p)),
    )
    if not found:
        return TaskResult(task=task, note=f"{task} wrote no {SUMMARY_NAME}")
    path = task_dir.joinpath(*found[0].parts)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # not JSON, not UTF-8, an integer of 5,000 digits
        return TaskResult(task=task, summary_path=path, note=f"{path} could not be read: {error}")
    if not isinstance(data, dict):
        return TaskResult(
            task=task,
            summary_path=path,
            note=f"{path} holds a JSON {type(data).__name__}, not an object",
        )
    summary = cast("dict[str, Any]", data)
    metrics: dict[str, float | None] = {}
    for metric in METRICS:
        values = [_number(summary[key]) for key in metric.keys if key in summary]
        if values:
            metrics[metric.name] = next((v for v in values if v is not None), None)
    named = summary.get("outputs")
    fetched: dict[str, str] = {}
    if isinstance(named, dict):
        for name, where in cast("dict[object, object]", named).items():
            if isinstance(where, str):
                fetched[str(name)] = _fetched_path(where, task_dir, path.parent)
    return TaskResult(
        task=task, summary_path=path, summary=summary, metrics=metrics, outputs=fetched
    )


def _cell(metric: Metric, value: float | None) -> str | None:
    if value is None:
        return None
    return format(value, metric.spec) if math.isfinite(value) else str(value)


def _relative(path: Path, base: Path | None) -> str:
    if base is not None and path.is_relative_to(base):
        return path.relative_to(base).as_posix()
    return str(path)


def _outputs_cells(result: TaskResult, root: Path | None) -> tuple[str | None, str | None]:
    """The outputs but the summary itself, relative to the summary's directory; that directory."""
    summary = result.summary_path
    if summary is None:
        return None, None
    shown: list[str] = []
    for name, where in result.outputs.items():
        if Path(where) != summary:
            relative = _relative(Path(where), summary.parent)
            shown.append(name if relative == name else f"{name}: {relative}")
    if not shown:
        return None, None
    return ", ".join(shown), _relative(summary.parent, root)


def results_table(results: Sequence[TaskResult], *, root: Path | None = None) -> str:
    """The results table and its notes; empty when no task wrote a ``summary.json``.

    The ``under`` column is relative to ``root`` (the fetched run) where it lies under it.

    Example:
        >>> from substrax.compute._results import TaskResult, results_table
        >>> print(results_table([
        ...     TaskResult(task="lm", metrics={"val_loss": 2.5, "baseline": 4.75}),
        ...     TaskResult(task="other", note="other wrote no summary.json"),
        ... ]))
        task   val loss  baseline  outputs  under
        -----  --------  --------  -------  -----
        lm     2.5000    4.7500    -        -
        other  -         -         -        -
        Note: other wrote no summary.json
    """
    if all(result.summary is None and not result.metrics for result in results):
        return ""
    shown = [m for m in METRICS if any(m.name in result.metrics for result in results)]
    headers = ["task", *(m.column for m in shown), "outputs", "under"]
    rows = [
        [
            result.task,
            *(_cell(m, result.metrics.get(m.name)) for m in shown),
            *_outputs_cells(result, root),
        ]
        for result in results
    ]
    notes = [f"Note: {result.note}" for result in results if result.note is not None]
    return "\n".join([format_table(headers, rows), *notes])
