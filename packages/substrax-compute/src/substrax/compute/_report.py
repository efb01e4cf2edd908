"""What ``substrax-compute run`` prints: a dry run's upload listing, a finished run's tasks.

A finished run ends with the results table of :mod:`substrax.compute._results`, read from the
``summary.json`` each task wrote.

Each as text for people (tables through ``substrax.support``) or, with ``--json``, as JSON.
"""

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from substrax.support import EXIT_OK, emit, format_table, print_table


if TYPE_CHECKING:
    from ._backend import ComputeBackend, RunHandle, RunState
    from ._manifest import JobManifest
    from ._results import TaskResult
    from ._spec import JobSpec
    from ._upload import UploadSet


def _upload_data(upload: "UploadSet") -> dict[str, Any]:
    return {
        "root": str(upload.root),
        "source": upload.source,
        "files": [
            {"file": file, "bytes": size}
            for file, size in zip(upload.files, upload.sizes, strict=True)
        ],
        "total_bytes": upload.total_bytes,
        "held_back": list(upload.held_back),
    }


def dry_run(
    name: str, backend: "ComputeBackend", spec: "JobSpec", project: Path, *, as_json: bool
) -> int:
    from ._upload import UPLOAD_IGNORE_FILE, UploadsProject, human_size  # noqa: PLC0415

    tasks = [task.name for task in spec.tasks]
    data: dict[str, Any] = {"job": spec.name, "backend": name, "tasks": tasks, "submitted": False}
    out = sys.stdout
    if not isinstance(backend, UploadsProject):
        data["upload"] = None
        text = (
            f"Job {spec.name} on {name}: {len(tasks)} task(s): {', '.join(tasks)}\n"
            f"The {name} backend uploads nothing; it runs the job in {project}.\n"
            "Dry run: nothing was submitted."
        )
        emit(data, text, as_json=as_json)
        return EXIT_OK
    upload = backend.upload_set(spec, project=project)
    data["upload"] = _upload_data(upload)
    if as_json:
        emit(data, "", as_json=True)
        return EXIT_OK
    out.write(f"Job {spec.name} on {name}: {len(tasks)} task(s): {', '.join(tasks)}\n")
    rows = [[human_size(size), file] for file, size in zip(upload.files, upload.sizes, strict=True)]
    print_table(["size", "file"], rows)
    rules = (
        "what git would track"
        if upload.source == "git"
        else "git listed no file: a walk honouring the project's .gitignore files"
    )
    out.write(
        f"Would upload {len(upload.files)} file(s), {human_size(upload.total_bytes)} "
        f"({upload.total_bytes} bytes) from {upload.root} ({rules}, less {UPLOAD_IGNORE_FILE})\n"
    )
    if upload.held_back:
        out.write(
            f"Held back as secrets: {', '.join(upload.held_back)} "
            "(name one in the job's include_files to upload it)\n"
        )
    out.write("Dry run: nothing was submitted.\n")
    return EXIT_OK


def summary(outputs: Sequence[str]) -> str:
    """Top-level files by name and directories with their file counts.

    Example:
        >>> from substrax.compute._report import summary
        >>> summary(["plot.png", "ckpt/1/a", "ckpt/1/b"])
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


def _failure_lines(manifest: "JobManifest", fetched: Path, state: "RunState") -> list[str]:
    """Why the run failed beyond its tasks: the node that failed first, a worker that died."""
    from ._environment import node_outputs  # noqa: PLC0415
    from ._manifest import MANIFEST_NAME, read_manifest  # noqa: PLC0415
    from ._supervisor import describe_status  # noqa: PLC0415

    node, code = manifest.failed_node, manifest.failed_node_status
    if node is None:
        if state == "failed" and not manifest.finished:
            return [
                f"The job did not finish and no node's failure was recorded (a supervisor that "
                f"died, a full disk); see {fetched / 'worker.log'}"
            ]
        return []
    how = "" if code is None else f" ({describe_status(code)})"
    logs = node_outputs(fetched, node)
    if manifest.nodes == 1:
        return [
            f"The worker of node 0 ended before the job finished{how}; its log: {fetched / 'worker.log'}"
        ]
    try:
        died = not read_manifest(logs / MANIFEST_NAME).finished
    except (OSError, ValueError, TypeError):
        died = True
    ended = ": its worker ended before the job finished" if died else ""
    return [
        f"Node {node} of {manifest.nodes} failed first{how}{ended}; the other nodes were "
        f"stopped. Its logs: {logs}"
    ]


def check_fetched(fetched: Path) -> int:
    """``EXIT_OK`` when the manifest fetched into ``fetched`` reads, as ``status`` reads it.

    A run not begun yet has none, which is fine.

    Raises:
        RecordFormatError: It is damaged (cut short, not JSON, no manifest at all).
        RecordVersionError: Another release wrote it.
    """
    from ._manifest import MANIFEST_NAME, read_manifest  # noqa: PLC0415

    if (fetched / MANIFEST_NAME).is_file():
        read_manifest(fetched / MANIFEST_NAME)
    return EXIT_OK


def report(handle: "RunHandle", state: "RunState", fetched: Path, *, as_json: bool) -> None:
    from ._manifest import MANIFEST_NAME, read_manifest  # noqa: PLC0415
    from ._results import SUMMARY_NAME, read_result, results_table  # noqa: PLC0415

    data: dict[str, Any] = {
        "run": handle.run_id,
        "backend": handle.backend,
        "job": handle.job,
        "state": str(state),
        "outputs": str(fetched),
        "tasks": [],
        "failed_node": None,
    }
    lines: list[str] = []
    results: list[TaskResult] = []
    path = fetched / MANIFEST_NAME
    if path.is_file():
        manifest = read_manifest(path)
        results = [read_result(t.name, fetched / t.name, t.outputs) for t in manifest.tasks]
        data["tasks"] = [
            {
                "task": t.name,
                "status": str(t.status),
                "returncode": t.returncode,
                "seconds": t.seconds,
                "outputs": list(t.outputs),
                "where": str(fetched / t.name),
                "lost_log_bytes": t.lost_log_bytes,
                "lost_log_reason": t.lost_log_reason,
            }
            for t in manifest.tasks
        ]
        rows = [
            [t.name, str(t.status), f"{t.seconds:.1f}s", summary(t.outputs), str(fetched / t.name)]
            for t in manifest.tasks
        ]
        lines.append(format_table(["task", "status", "time", "outputs", "where"], rows))
        lines += [
            f"Task {t.name} lost {t.lost_log_bytes} bytes of its output, not in its logs: "
            f"{t.lost_log_reason}"
            for t in manifest.tasks
            if t.lost_log_bytes
        ]
        if manifest.failed_node is not None:
            data["failed_node"] = {
                "node": manifest.failed_node,
                "status": manifest.failed_node_status,
            }
        lines += _failure_lines(manifest, fetched, state)
    lines.append(f"{handle.run_id} {state}; outputs in {fetched}")
    table = results_table(results, root=fetched)
    if table:
        lines.append(f"Results (from each task's {SUMMARY_NAME}; paths under {fetched}):\n{table}")
    data["results"] = [result.to_dict() for result in results]
    emit(data, "\n".join(lines), as_json=as_json)
