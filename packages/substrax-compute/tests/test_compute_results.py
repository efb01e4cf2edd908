"""The results table that ends ``substrax-compute run``, read from each task's ``summary.json``."""

import json
import re
from pathlib import Path

import pytest

from substrax.compute._results import read_result, results_table
from substrax.compute.cli import main


JOBS = """\
[tool.substrax.compute.jobs.results]
commands = { lm = ["python", "lm.py"], digits = ["python", "digits.py"], broken = ["python", "broken.py"], plain = ["python", "-c", "print('no summary')"] }
timeout_seconds = 60
probe_devices = false
"""

# Absolute paths as the task saw them, nested one level down like the examples' own.
LM = """\
import json, os, pathlib
out = pathlib.Path(os.environ["AVITAI_OUTPUT_DIR"]) / "lm"
(out / "profile" / "plugins").mkdir(parents=True)
(out / "profile" / "plugins" / "trace.json.gz").write_bytes(b"x")
(out / "ckpt" / "10").mkdir(parents=True)
(out / "ckpt" / "10" / "state").write_text("s")
(out / "summary.json").write_text(json.dumps({
    "val_loss": 2.34567, "unigram_baseline": 4.5, "tokens_per_second": 12345.6, "mfu": None,
    "outputs": {"profile": str(out / "profile"), "checkpoints": "ckpt", "gone": "/nowhere/x",
                "summary": str(out / "summary.json")},
}))
"""

DIGITS = """\
import json, os, pathlib
out = pathlib.Path(os.environ["AVITAI_OUTPUT_DIR"]) / "digits"
out.mkdir()
(out / "summary.json").write_text(json.dumps({"test_accuracy": 0.98333, "accuracy": 0.5, "val_loss": 0.061}))
"""

BROKEN = """\
import os, pathlib
(pathlib.Path(os.environ["AVITAI_OUTPUT_DIR"]) / "summary.json").write_text("{not json")
"""


@pytest.fixture
def project(local_project):
    return local_project(JOBS, {"lm.py": LM, "digits.py": DIGITS, "broken.py": BROKEN})


def test_a_run_ends_with_the_results_table_and_json_carries_the_same(project, capsys):
    assert main(["run", "results", "--into", str(project.parent / "text")]) == 0
    out = capsys.readouterr().out
    (run,) = (project.parent / "text").iterdir()
    results = out[out.index(f"{run.name} succeeded; outputs in {run}") :].splitlines()[1:]
    assert results[0] == f"Results (from each task's summary.json; paths under {run}):"
    header = results[1].split()
    assert header == [
        *("task", "accuracy", "val", "loss", "baseline", "tokens/s", "MFU", "outputs", "under")
    ]
    rows = {line.split()[0]: line for line in results[3:7]}
    # The summary itself is not listed; its directory is, relative to the fetched run.
    assert re.fullmatch(
        r"lm\s+-\s+2\.3457\s+4\.5000\s+12,346\s+-\s+profile, checkpoints: ckpt, "
        r"gone: /nowhere/x\s+lm/lm",
        rows["lm"],
    )
    # test_accuracy wins over accuracy.
    assert re.fullmatch(r"digits\s+0\.9833\s+0\.0610\s+-\s+-\s+-\s+-\s+-", rows["digits"])
    assert re.fullmatch(r"broken(\s+-){7}", rows["broken"])
    assert re.fullmatch(r"plain(\s+-){7}", rows["plain"])
    notes = results[7:]
    assert len(notes) == 2
    assert notes[0].startswith(f"Note: {run / 'broken' / 'summary.json'} could not be read: ")
    assert notes[1] == "Note: plain wrote no summary.json"

    assert main(["run", "results", "--json", "--into", str(project.parent / "json")]) == 0
    report = json.loads(capsys.readouterr().out)
    by_task = {r["task"]: r for r in report["results"]}
    assert list(by_task) == ["lm", "digits", "broken", "plain"]
    lm_dir = Path(report["outputs"]) / "lm" / "lm"
    assert by_task["lm"]["metrics"] == {
        "val_loss": 2.34567,
        "baseline": 4.5,
        "tokens_per_second": 12345.6,
        "mfu": None,
    }
    assert by_task["lm"]["outputs"] == {
        "profile": str(lm_dir / "profile"),
        "checkpoints": str(lm_dir / "ckpt"),
        "gone": "/nowhere/x",
        "summary": str(lm_dir / "summary.json"),
    }
    assert (lm_dir / "profile" / "plugins" / "trace.json.gz").is_file()
    assert by_task["lm"]["summary_path"] == str(lm_dir / "summary.json")
    assert by_task["lm"]["summary"]["unigram_baseline"] == 4.5
    assert by_task["lm"]["note"] is None
    assert by_task["digits"]["metrics"] == {"accuracy": 0.98333, "val_loss": 0.061}
    assert by_task["broken"]["summary"] is None
    assert "could not be read" in by_task["broken"]["note"]
    assert by_task["plain"] == {
        "task": "plain",
        "summary_path": None,
        "metrics": {},
        "outputs": {},
        "summary": None,
        "note": "plain wrote no summary.json",
    }


def test_a_job_without_summaries_prints_no_results_table(tmp_path):
    task = tmp_path / "task"
    task.mkdir()
    (task / "value.txt").write_text("42")
    result = read_result("task", task, ["value.txt"])
    assert result.note == "task wrote no summary.json"
    assert results_table([result]) == ""


@pytest.mark.parametrize(
    ("content", "note"),
    [
        ("[1, 2]", "holds a JSON list, not an object"),
        ('"text"', "holds a JSON str, not an object"),
        (b"\xff\xfe", "could not be read"),
        ('{"loss": ' + "9" * 5001 + "}", "could not be read"),  # past Python's digit limit
        ('{"loss": ', "could not be read"),
    ],
)
def test_a_summary_that_is_not_an_object_is_a_note(tmp_path, content, note):
    path = tmp_path / "summary.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    result = read_result("t", tmp_path, ["summary.json"])
    assert result.summary is None
    assert result.metrics == {}
    assert result.note is not None
    assert note in result.note
    assert str(path) in result.note


def test_a_listed_summary_the_fetch_lost_is_a_note(tmp_path):
    result = read_result("t", tmp_path, ["summary.json"])
    assert result.note is not None
    assert result.note.startswith(f"{tmp_path / 'summary.json'} could not be read")


def test_the_shallowest_summary_counts_and_odd_values_show_as_absent(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "summary.json").write_text(
        json.dumps(
            {
                "accuracy": True,
                "val_accuracy": 0.75,
                "val_loss": "low",
                "outputs": {"plot": 3, "log": "missing.txt"},
            }
        )
    )
    (tmp_path / "a" / "b" / "summary.json").write_text(json.dumps({"val_loss": 1.0}))
    result = read_result("t", tmp_path, ["a/b/summary.json", "a/summary.json"])
    assert result.summary_path == tmp_path / "a" / "summary.json"
    # A bool is not a number; the next key of the same metric is used.
    assert result.metrics == {"accuracy": 0.75, "val_loss": None}
    assert result.outputs == {"log": "missing.txt"}
    table = results_table([result])
    assert table.splitlines()[0].split() == ["task", "accuracy", "val", "loss", "outputs", "under"]
    assert re.fullmatch(
        rf"t\s+0\.7500\s+-\s+log: missing\.txt\s+{re.escape(str(tmp_path / 'a'))}",
        table.splitlines()[2],
    )
