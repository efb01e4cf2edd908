"""The README's demo command, in full: every example trains to the results the docs promise.

``uv run substrax-compute run demo`` (the repository's pyproject declares the ``demo`` job) goes
through the console script, the local backend and the worker, and trains every script in
examples/ for real: minutes. It is the release tier's (the root conftest.py lists this module).
The job runs once for the whole module; the checks read what it fetched and printed. That each
example takes every code path, writes only under its output directory and resumes after a
preemption with every step once is ``test_examples.py``'s, on the examples' short mode.
"""

from pathlib import Path

import pytest

from substrax.examples import discover_examples


# The module-scoped run is costly: keep these tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("demo")
ROOT = Path(__file__).resolve().parents[1]
TASKS = [
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for p in discover_examples(ROOT / "examples")
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory, demo_job):
    return demo_job(tmp_path_factory.mktemp("demo"), quick=False, timeout=900)


def test_demo_job_runs_every_example_and_prints_one_results_table(demo) -> None:
    demo.check_results(TASKS)


def test_digits_classifier_reaches_97_percent_from_its_best_checkpoint(demo) -> None:
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
    records = demo.metrics("digits_classifier")
    (test_record,) = (r for r in records if r["name"] == "test_accuracy")
    assert test_record["value"] == summary["test_accuracy"]


def test_transformer_lm_beats_the_unigram_baseline_and_logs_its_throughput_and_profile(
    demo,
) -> None:
    summary = demo.summary("transformer_lm")
    assert summary["devices"] == 8
    assert summary["val_loss"] < summary["unigram_baseline"] - 0.5  # nats
    assert summary["tokens_per_second"] > 0
    assert summary["mfu"] is None  # no known dense peak on CPU
    assert summary["embedding_spec"] == [None, "fsdp"]  # FSDP, not replicated
    profile = Path(summary["outputs"]["profile"])
    assert list(profile.glob("plugins/profile/*/*.xplane.pb"))
    records = demo.metrics("transformer_lm")
    speeds = [r["value"] for r in records if r["name"] == "throughput/tokens_per_sec"]
    assert speeds
    assert all(speed > 0 for speed in speeds)
    assert speeds[-1] == summary["tokens_per_second"]
    (last_val,) = (r for r in records if r["name"] == "val_loss" and r["step"] == summary["steps"])
    assert last_val["value"] == summary["val_loss"]
    assert not any(r["name"] == "throughput/mfu" for r in records)


def test_transformer_lm_preemption_resumes_mid_run_and_beats_the_unigram_baseline(
    demo,
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
