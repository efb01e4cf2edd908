"""The README's demo command, in full: every example trains to the results the docs promise.

``uv run substrax-compute run demo`` (the repository's pyproject declares the ``demo`` job) goes
through the console script, the local backend and the worker, and trains every script in
examples/ for real: minutes. It is the release tier's (the root conftest.py lists this module).
The job runs once for the whole module; the checks read what it fetched and printed. That each
example takes every code path, writes only under its output directory and resumes after a
preemption with every step once is ``test_examples.py``'s, on the examples' short mode.
"""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from substrax.examples import discover_examples


# The module-scoped run is costly: keep these tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("demo")
ROOT = Path(__file__).resolve().parents[1]
TASKS = [
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for p in discover_examples(ROOT / "examples")
]


@dataclass(frozen=True)
class DemoRun:
    """One run of the demo job: its console output and its fetched outputs."""

    result: subprocess.CompletedProcess[str]
    fetched: Path

    def outputs(self, name: str) -> Path:
        """Where example ``name`` wrote, as fetched: ``<run>/examples.<name>/<name>``."""
        return self.fetched / f"examples.{name}" / name

    def summary(self, name: str) -> dict[str, Any]:
        """What example ``name``'s ``main()`` returned, from its ``summary.json``."""
        return json.loads((self.outputs(name) / "summary.json").read_text())


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    base = tmp_path_factory.mktemp("demo")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_", "XLA_")) and k != "SUBSTRAX_EXAMPLES_QUICK"
    }
    env["SUBSTRAX_STATE_DIR"] = str(base / "state")
    script = Path(sys.executable).parent / "substrax-compute"
    result = subprocess.run(
        [str(script), "run", "demo", "--into", str(base / "fetched")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (fetched,) = (base / "fetched").iterdir()
    return DemoRun(result=result, fetched=fetched)


def test_demo_job_runs_every_example_and_prints_one_results_table(demo: DemoRun) -> None:
    stdout = demo.result.stdout
    assert f"{demo.fetched.name} succeeded; outputs in {demo.fetched}" in stdout
    manifest = json.loads((demo.fetched / "manifest.json").read_text())
    assert [task["name"] for task in manifest["tasks"]] == TASKS
    assert {task["status"] for task in manifest["tasks"]} == {"succeeded"}
    assert not (ROOT / "quick_start").exists()
    # The run ends with the results table: one row per example, each from its summary.json.
    results = stdout[stdout.index("Results (from each task's summary.json") :]
    rows = results.splitlines()[3:]
    assert [row.split()[0] for row in rows] == TASKS, results
    assert "Note:" not in results


def test_digits_classifier_reaches_97_percent_from_its_best_checkpoint(demo: DemoRun) -> None:
    summary = demo.summary("digits_classifier")
    assert summary["devices"] == 8
    assert summary["test_accuracy"] >= 0.97
    assert summary["best_step"] in summary["checkpoint_steps"]
    # best-k by validation accuracy (3) plus the newest step, whatever the epoch count
    assert 1 <= len(summary["checkpoint_steps"]) <= 4
    assert summary["epochs"] > 1
    root = demo.outputs("digits_classifier")
    held = sorted(int(p.name) for p in (root / "checkpoints").iterdir() if p.name.isdigit())
    assert held == summary["checkpoint_steps"]
    log = (root / "logs" / "digits_classifier.metrics.jsonl").read_text()
    records = [json.loads(line) for line in log.splitlines()]
    (test_record,) = (r for r in records if r["name"] == "test_accuracy")
    assert test_record["value"] == summary["test_accuracy"]


def test_transformer_lm_beats_the_unigram_baseline_and_logs_its_throughput_and_profile(
    demo: DemoRun,
) -> None:
    summary = demo.summary("transformer_lm")
    assert summary["devices"] == 8
    assert summary["val_loss"] < summary["unigram_baseline"] - 0.5  # nats
    assert summary["tokens_per_second"] > 0
    assert summary["mfu"] is None  # no known dense peak on CPU
    assert summary["embedding_spec"] == [None, "fsdp"]  # FSDP, not replicated
    root = demo.outputs("transformer_lm")
    profile = Path(summary["outputs"]["profile"])
    assert list(profile.glob("plugins/profile/*/*.xplane.pb"))
    log = (root / "logs" / "transformer_lm.metrics.jsonl").read_text()
    records = [json.loads(line) for line in log.splitlines()]
    speeds = [r["value"] for r in records if r["name"] == "throughput/tokens_per_sec"]
    assert speeds
    assert all(speed > 0 for speed in speeds)
    assert speeds[-1] == summary["tokens_per_second"]
    (last_val,) = (r for r in records if r["name"] == "val_loss" and r["step"] == summary["steps"])
    assert last_val["value"] == summary["val_loss"]
    assert not any(r["name"] == "throughput/mfu" for r in records)


def test_transformer_lm_preemption_resumes_mid_run_and_beats_the_unigram_baseline(
    demo: DemoRun,
) -> None:
    summary = demo.summary("transformer_lm_preemption")
    steps = summary["steps"]
    # SIGTERMed after it reported step 60: it saved the next step boundary and exited cleanly
    assert summary["first_exit_code"] == 0
    assert 60 <= summary["preempted_at_step"] < steps
    assert summary["restored_step"] == summary["preempted_at_step"]
    assert summary["restored_was_preempted"] is True
    assert summary["same_runs"]
    assert summary["every_step_once"] == {"file": True, "mlflow": True, "wandb": True}
    assert summary["val_loss"] < summary["unigram_baseline"]
