"""Every example, in its short mode, run by the README's demo command; what a short run shows.

``SUBSTRAX_EXAMPLES_QUICK=1 uv run substrax-compute run demo`` goes through the console script,
the local backend and the worker (the repository's pyproject declares the ``demo`` job), whose
tasks inherit the variable; its outputs are fetched outside the working tree. In the short mode
each example takes every code path (training, checkpointing, logging, restoring, the
preemption's kill and resume) in a few steps. The job runs once for the whole module, and each
example's checks read what the run fetched: its ``summary.json``, checkpoints and logs. What
needs the full training (the accuracy and losses it reaches) is checked by ``test_demo.py``, the
release tier's run of the full demo.
"""

import json
import os
from pathlib import Path

import pytest

from substrax.examples import discover_examples


# The module-scoped run is costly: keep these tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("examples")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = discover_examples(ROOT / "examples")
TASKS = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in EXAMPLES]


@pytest.fixture(scope="module")
def demo(tmp_path_factory, demo_job):
    return demo_job(tmp_path_factory.mktemp("demo"), quick=True, timeout=600)


def test_demo_job_runs_every_example_and_prints_one_results_table(demo) -> None:
    demo.check_results(TASKS)


def test_the_quick_start_is_an_example() -> None:
    assert ROOT / "examples" / "quick_start.py" in EXAMPLES


@pytest.mark.parametrize("name", [p.stem for p in EXAMPLES])
def test_example_writes_only_under_its_output_dir(name: str, demo) -> None:
    summary_path = demo.outputs(name) / "summary.json"
    assert summary_path.is_file()
    produced_paths = demo.summary(name)["outputs"].values()
    assert produced_paths
    for produced in produced_paths:
        assert Path(produced).exists()
        assert Path(produced).is_relative_to(demo.task_dir(name))


def test_quick_start_run_again_into_its_outputs_replaces_them(demo, tmp_path) -> None:
    """A second pass: run again into the same $AVITAI_OUTPUT_DIR, it crashed saving step 0
    below the first run's step 4, with step 0 logged twice."""
    import shutil
    import subprocess
    import sys

    outputs = tmp_path / "outputs"
    shutil.copytree(demo.outputs("quick_start"), outputs / "quick_start")  # the first run's
    env = {**os.environ, "AVITAI_OUTPUT_DIR": str(outputs), "SUBSTRAX_EXAMPLES_QUICK": "1"}
    env.pop("JAX_NUM_CPU_DEVICES", None)  # the example emulates its own 8, as from a shell
    again = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quick_start.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "earlier run" not in again.stderr
    log = outputs / "quick_start" / "logs" / "quick_start.metrics.jsonl"
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == sorted(set(steps))  # one run's steps, each once


def test_quick_start_trains_on_eight_devices_and_checkpoints(demo) -> None:
    summary = demo.summary("quick_start")
    assert summary["devices"] == 8
    assert summary["checkpoint_steps"] == [3, 4]  # the short mode's 5 steps, the newest two kept
    assert summary["final_loss"] < 10.0
    root = demo.outputs("quick_start")
    assert (root / "logs" / "plots" / "index.html").exists()
    assert any((root / "checkpoints").iterdir())


def test_digits_classifier_keeps_its_best_checkpoints_and_scores_the_best(demo) -> None:
    summary = demo.summary("digits_classifier")
    assert summary["devices"] == 8
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    assert summary["best_step"] in summary["checkpoint_steps"]
    # best-k by validation accuracy (3) plus the newest step, whatever the epoch count: more
    # epochs than that, so retention has dropped some
    assert 1 <= len(summary["checkpoint_steps"]) <= 4
    assert summary["epochs"] > len(summary["checkpoint_steps"])
    root = demo.outputs("digits_classifier")
    held = sorted(int(p.name) for p in (root / "checkpoints").iterdir() if p.name.isdigit())
    assert held == summary["checkpoint_steps"]
    records = demo.metrics("digits_classifier")
    names = {record["name"] for record in records}
    assert {"train_loss", "val_loss", "val_accuracy", "test_accuracy"} <= names
    (test_record,) = (r for r in records if r["name"] == "test_accuracy")
    assert test_record["value"] == summary["test_accuracy"]
    assert test_record["step"] == summary["best_step"]
    assert (root / "logs" / "plots" / "index.html").exists()


def test_transformer_lm_logs_its_validation_loss_throughput_and_profile(demo) -> None:
    summary = demo.summary("transformer_lm")
    assert summary["devices"] == 8
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
    train_steps = [r["step"] for r in records if r["name"] == "train_loss"]
    assert train_steps == list(range(summary["steps"]))  # each step once
    (last_val,) = (r for r in records if r["name"] == "val_loss" and r["step"] == summary["steps"])
    assert last_val["value"] == summary["val_loss"]
    assert not any(r["name"] == "throughput/mfu" for r in records)


def wandb_segments(log_dir: Path) -> list[tuple[int | None, list[int]]]:
    """Each offline segment of a W&B run: its rewind step (None) and the steps of its rows."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    segments: list[tuple[int | None, list[int]]] = []
    for run_file in sorted((log_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        store = datastore.DataStore()
        store.open_for_scan(str(run_file))
        rewind, steps = None, []
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run" and record.run.HasField("branch_point"):
                rewind = int(record.run.branch_point.value)
            elif kind == "history":
                keys = {item.key or "/".join(item.nested_key) for item in record.history.item}
                if "train_loss" in keys:
                    steps.append(record.history.step.num)
        store._fp.close()
        segments.append((rewind, steps))
    return segments


def test_transformer_lm_preemption_resumes_into_the_same_runs_with_every_step_once(
    demo,
) -> None:
    from mlflow.tracking import MlflowClient

    from substrax.tracking import read_scalars

    summary = demo.summary("transformer_lm_preemption")
    steps = summary["steps"]
    # SIGTERMed once it reported half its steps: it saved the next step boundary and exited cleanly
    assert summary["first_exit_code"] == 0
    assert steps // 2 <= summary["preempted_at_step"] < steps
    assert summary["restored_step"] == summary["preempted_at_step"]
    assert summary["restored_was_preempted"] is True
    assert summary["steps_after"] == steps - summary["restored_step"]
    assert summary["same_runs"]
    assert summary["every_step_once"] == {"file": True, "mlflow": True, "wandb": True}

    root = demo.outputs("transformer_lm_preemption")
    expected = list(range(1, steps + 1))
    log = read_scalars(root / "logs" / "transformer_lm_preemption.metrics.jsonl")
    assert [step for step, _ in log["train_loss"]] == expected
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    mlflow_run = summary["run_ids"]["mlflow"]
    history = client.get_metric_history(mlflow_run, "train_loss")
    assert sorted(m.step for m in history) == expected
    tags = client.get_run(mlflow_run).data.tags
    assert tags["substrax.resumed_from_step"] == str(summary["restored_step"])
    (first, first_steps), (rewind, resumed_steps) = wandb_segments(root / "logs")
    assert first is None
    assert rewind == summary["restored_step"]
    assert first_steps[:rewind] == list(range(1, rewind + 1))
    assert resumed_steps == list(range(rewind + 1, steps + 1))
