"""Every script in examples/ runs in a fresh interpreter, its outputs kept out of the repository."""

import json
from pathlib import Path

import pytest

from substrax.examples import discover_examples
from substrax.testing import ExampleRun, run_example


# The module-scoped fixture is costly: keep these tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("examples")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = discover_examples(ROOT / "examples")


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ExampleRun, Path]]:
    runs: dict[str, tuple[ExampleRun, Path]] = {}
    for path in EXAMPLES:
        outputs = tmp_path_factory.mktemp(path.stem) / "outputs"
        run = run_example(path, repo_root=ROOT, output_dir=outputs, timeout=300, call_main=True)
        runs[path.stem] = (run, outputs)
    return runs


def test_the_quick_start_is_an_example() -> None:
    assert ROOT / "examples" / "quick_start.py" in EXAMPLES


@pytest.mark.parametrize("name", [p.stem for p in EXAMPLES])
def test_example_runs_and_writes_only_under_its_output_dir(
    name: str, example_runs: dict[str, tuple[ExampleRun, Path]]
) -> None:
    run, outputs = example_runs[name]
    summary = run.check().summary
    assert isinstance(summary, dict)
    for produced in summary.get("outputs", {}).values():
        assert Path(produced).exists()
        assert Path(produced).is_relative_to(outputs)


def test_quick_start_trains_on_eight_devices_and_checkpoints(
    example_runs: dict[str, tuple[ExampleRun, Path]],
) -> None:
    run, _ = example_runs["quick_start"]
    summary = run.check().summary
    assert summary["devices"] == 8
    assert summary["checkpoint_steps"][-1] >= 2
    assert summary["final_loss"] < 10.0


def test_digits_classifier_reaches_97_percent_from_its_best_checkpoint(
    example_runs: dict[str, tuple[ExampleRun, Path]],
) -> None:
    run, outputs = example_runs["digits_classifier"]
    summary = run.check().summary
    assert summary["devices"] == 8
    assert summary["test_accuracy"] >= 0.97
    assert summary["best_step"] in summary["checkpoint_steps"]
    # best-k by validation accuracy (3) plus the newest step, whatever the epoch count
    assert 1 <= len(summary["checkpoint_steps"]) <= 4
    assert summary["epochs"] > 1
    root = outputs / "digits_classifier"
    assert json.loads((root / "summary.json").read_text()) == summary
    held = sorted(int(p.name) for p in (root / "checkpoints").iterdir() if p.name.isdigit())
    assert held == summary["checkpoint_steps"]
    log = (root / "logs" / "digits_classifier.metrics.jsonl").read_text()
    records = [json.loads(line) for line in log.splitlines()]
    names = {record["name"] for record in records}
    assert {"train_loss", "val_loss", "val_accuracy", "test_accuracy"} <= names
    (test_record,) = (r for r in records if r["name"] == "test_accuracy")
    assert test_record["value"] == summary["test_accuracy"]
    assert (root / "logs" / "plots" / "index.html").exists()


def test_transformer_lm_beats_the_unigram_baseline_and_logs_its_throughput_and_profile(
    example_runs: dict[str, tuple[ExampleRun, Path]],
) -> None:
    run, outputs = example_runs["transformer_lm"]
    summary = run.check().summary
    assert summary["devices"] == 8
    assert summary["val_loss"] < summary["unigram_baseline"] - 0.5  # nats
    assert summary["tokens_per_second"] > 0
    assert summary["mfu"] is None  # no known dense peak on CPU
    assert summary["embedding_spec"] == [None, "fsdp"]  # FSDP, not replicated
    root = outputs / "transformer_lm"
    assert json.loads((root / "summary.json").read_text()) == summary
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
    example_runs: dict[str, tuple[ExampleRun, Path]],
) -> None:
    from mlflow.tracking import MlflowClient

    from substrax.tracking import read_scalars

    run, outputs = example_runs["transformer_lm_preemption"]
    summary = run.check().summary
    steps = summary["steps"]
    # SIGTERMed after it reported step 60: it saved the next step boundary and exited cleanly
    assert summary["first_exit_code"] == 0
    assert 60 <= summary["preempted_at_step"] < steps
    assert summary["restored_step"] == summary["preempted_at_step"]
    assert summary["restored_was_preempted"] is True
    assert summary["steps_after"] == steps - summary["restored_step"]
    assert summary["same_runs"]
    assert summary["every_step_once"] == {"file": True, "mlflow": True, "wandb": True}
    assert summary["val_loss"] < summary["unigram_baseline"]

    root = outputs / "transformer_lm_preemption"
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
