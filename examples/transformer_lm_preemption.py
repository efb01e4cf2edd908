"""Preemption and resume of the transformer language model, logging into the same runs.

    uv run python examples/transformer_lm_preemption.py

The model, data and training step are those of ``transformer_lm.py`` (imported from it), for
fewer steps. This script is the scheduler: it starts the training in a child process, sends it
SIGTERM mid-run, then starts a second process that resumes it and finishes.

* The first attempt trains inside ``PreemptionHandler``: the signal only sets a flag, and at the
  next step boundary the handler saves that step and exits the process. Every checkpoint (the
  periodic ones too) holds the model, the optimizer, the data position and, under
  ``extensions``, the run ids of the W&B and MLflow runs.
* The second attempt restores the latest step and the run ids, and builds its loggers with
  ``resume_step=`` the restored step, so that each backend ends with every step once:
  the file log drops the records the first attempt logged past the checkpoint; the W&B
  (offline) run is rewound to the checkpoint (``resume_from``; ``wandb sync`` applies it);
  MLflow's history is append-only, so the resumed logger does not send the steps the run
  already holds (they keep the first attempt's values).
* The batches are drawn from a generator seeded by the step, so the resumed run sees the batches
  the uninterrupted run would have seen.

At the end this script reads each backend back (the file log, the MLflow SQLite store, the W&B
offline files) and checks every step is there exactly once. Everything goes under
$AVITAI_OUTPUT_DIR/transformer_lm_preemption (or a per-run temporary directory): checkpoints,
logs, the MLflow store, the W&B offline run and ``summary.json``. The last line it prints is
the same summary as JSON.
"""

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from substrax.artifacts import resolve_output_dir


if TYPE_CHECKING:  # imported for real in the training process only (they start jax)
    from jax.sharding import Mesh

    from substrax.checkpoint import OrbaxCheckpointStore


NAME = "transformer_lm_preemption"
QUICK = os.environ.get("SUBSTRAX_EXAMPLES_QUICK") == "1"  # every code path, in seconds (tests)
STEPS = 24 if QUICK else 120
SAVE_EVERY = STEPS // 3  # periodic checkpoints; the preemption saves its own step
PREEMPT_AFTER = STEPS // 2  # the scheduler sends SIGTERM once the first attempt reports this step
REPORT_EVERY = STEPS // 12  # steps between the progress lines a child prints
LEARNING_RATE = 3e-3
METRIC = "train_loss"
WANDB_PROJECT = "substrax-examples"
CHILD_TIMEOUT = 600.0  # seconds, per attempt


# --- the training process -------------------------------------------------------------------
def load_lm_example() -> ModuleType:
    """``examples/transformer_lm.py`` as a module: the model, the data and their settings."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    return importlib.import_module("transformer_lm")


def restored_state(
    lm: ModuleType, mesh: "Mesh", store: "OrbaxCheckpointStore", attempt: str
) -> dict[str, Any]:
    """The sharded model and optimizer: fresh (``first``), or the latest checkpoint's."""
    import optax  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from substrax.mesh import create_sharded_model  # noqa: PLC0415

    def make() -> tuple[Any, Any]:
        model = lm.TransformerLM(rngs=nnx.Rngs(lm.SEED))
        warmup = min(20, STEPS // 2)
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, LEARNING_RATE, warmup, STEPS, 0.1 * LEARNING_RATE
        )
        return model, nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.01), wrt=nnx.Param)

    model, optimizer = create_sharded_model(make, mesh, lm.RULES)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "start": 0, "restored": None}
    if attempt == "resume":
        restored = store.latest_step()
        checkpoint = store.restore(
            restored, templates={"model": nnx.state(model), "optimizer": nnx.state(optimizer)}
        )
        nnx.update(model, checkpoint.items["model"])
        nnx.update(optimizer, checkpoint.items["optimizer"])
        state.update(
            start=int(checkpoint.items["data_iterator"]["position"]),
            restored=restored,
            run_ids=checkpoint.items["extensions"]["run_ids"],  # strings round-trip
            preempted=bool(checkpoint.metadata.extra.get("preempted", False)),
        )
    return state


def open_loggers(
    outputs: Path, restored: int | None, run_ids: dict[str, str] | None
) -> tuple[Any, Any, dict[str, str | None]]:
    """The file log, the MLflow run and the W&B offline run, rewound to ``restored``.

    On the first attempt (``restored`` None) the runs are new and nothing is dropped.
    """
    from substrax.tracking import FileLogger, MLFlowLogger, MultiLogger, WandbLogger  # noqa: PLC0415

    logs = outputs / "logs"
    files = FileLogger(NAME, logs, resume_step=restored)
    mlflow = MLFlowLogger(
        NAME,
        tracking_uri=f"sqlite:///{outputs / 'mlflow.db'}",
        log_dir=logs,
        run_id=None if run_ids is None else run_ids["mlflow"],
        resume_step=restored,
    )
    wandb = WandbLogger(
        NAME,
        project=WANDB_PROJECT,
        log_dir=logs,
        mode="offline",
        run_id=None if run_ids is None else run_ids["wandb"],
        resume_step=restored,
    )
    ids = {"mlflow": mlflow.run_id, "wandb": wandb.run_id}
    return files, MultiLogger([files, mlflow, wandb], name=NAME), ids


def train(attempt: str, outputs: Path) -> dict[str, Any]:
    """One attempt: ``first`` starts the run, ``resume`` restores the latest checkpoint."""
    lm = load_lm_example()  # first: it sets the 8 CPU devices before jax starts
    import numpy as np  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from substrax.checkpoint import (  # noqa: PLC0415
        OrbaxCheckpointStore,
        PreemptionHandler,
        quiet_orbax_notices,
    )
    from substrax.devices import detect_devices  # noqa: PLC0415
    from substrax.mesh import DeviceMeshManager  # noqa: PLC0415
    from substrax.spmd import (  # noqa: PLC0415
        EvalStep,
        PrecisionPolicy,
        TrainStep,
        create_data_parallel_sharding,
    )

    quiet_orbax_notices()  # its notice at every save is about a setting the store chose
    mesh = DeviceMeshManager.create_device_mesh({"fsdp": detect_devices().count})
    batch_sharding = create_data_parallel_sharding(mesh, "fsdp")
    train_bytes, val_bytes = lm.load_text()

    def batch_at(step: int) -> dict[str, np.ndarray]:
        """The batch of ``step``: the same in every attempt."""
        rng = np.random.default_rng([lm.SEED, step])
        return lm.windows(
            train_bytes, rng.integers(0, len(train_bytes) - lm.SEQ_LEN - 1, lm.BATCH_SIZE)
        )

    store = OrbaxCheckpointStore(outputs / "checkpoints", max_to_keep=2)
    state = restored_state(lm, mesh, store, attempt)
    start, restored = state["start"], state["restored"]
    files, logger, run_ids = open_loggers(outputs, restored, state.get("run_ids"))
    precision = PrecisionPolicy(param_dtype="float32", compute_dtype="bfloat16")
    step = TrainStep(
        state["model"],
        state["optimizer"],
        lm.next_byte_loss,
        mesh=mesh,
        batch_sharding=batch_sharding,
        accumulate_steps=lm.ACCUMULATE_STEPS,
        precision=precision,
    )

    def items(done: int) -> dict[str, Any]:
        return {
            "model": nnx.state(step.model),
            "optimizer": nnx.state(step.optimizer),
            "data_iterator": {"position": done},
            "extensions": {"run_ids": dict(run_ids)},
        }

    result: dict[str, Any] = {
        "attempt": attempt,
        "pid": os.getpid(),
        "start_step": start,
        "restored_step": restored,
        "restored_was_preempted": state.get("preempted"),
        "run_ids": run_ids,
        "dropped_file_records": files.dropped_records,
    }
    done = start
    try:
        with store, logger, PreemptionHandler(store) as preemption:
            for index in range(start, STEPS):
                loss = step(batch_at(index))
                done = index + 1
                logger.log_scalar(METRIC, loss, step=done)
                if done % REPORT_EVERY == 0:
                    print(json.dumps({"event": "progress", "step": done}), flush=True)
                preemption.check(done, lambda: items(done))  # noqa: B023 - called right here
                if done % SAVE_EVERY == 0:
                    store.save(done, items(done))
            evaluate = EvalStep(
                step, lm.next_byte_loss, batch_sharding=batch_sharding, precision=precision
            )
            starts = np.random.default_rng(lm.SEED + 1).integers(
                0, len(val_bytes) - lm.SEQ_LEN - 1, size=(lm.EVAL_BATCHES, lm.BATCH_SIZE)
            )
            val_loss = float(evaluate.evaluate(lm.windows(val_bytes, s) for s in starts))
            logger.log_scalar("val_loss", val_loss, step=STEPS)
            result.update(val_loss=val_loss, unigram_baseline=lm.unigram_entropy(train_bytes))
    except SystemExit:  # PreemptionHandler saved step `done` and is exiting the process
        result.update(preempted_at=done)
        print(json.dumps({"event": "done", **result}), flush=True)
        raise
    result.update(last_step=done)
    print(json.dumps({"event": "done", **result}), flush=True)
    return result


# --- the scheduler --------------------------------------------------------------------------
def child_env(outputs: Path) -> dict[str, str]:
    """The children's environment: W&B offline, its own files under the outputs."""
    home = outputs / "wandb-home"
    return {
        **{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},  # a service of its own
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
    }


def run_attempt(attempt: str, outputs: Path, *, preempt_after: int | None) -> dict[str, Any]:
    """Run one attempt in a child; SIGTERM it once it reports ``preempt_after`` steps."""
    command = [sys.executable, str(Path(__file__).resolve()), attempt, str(outputs)]
    events: list[dict[str, Any]] = []
    signalled_at = None
    deadline = time.monotonic() + CHILD_TIMEOUT
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env=child_env(outputs)
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if time.monotonic() > deadline:
                child.kill()
                raise TimeoutError(f"the {attempt} attempt ran past {CHILD_TIMEOUT:g} s")
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            events.append(event)
            if event["event"] == "progress":
                print(f"  {attempt}: step {event['step']}", flush=True)
                if (
                    preempt_after is not None
                    and signalled_at is None
                    and event["step"] >= preempt_after
                ):
                    signalled_at = event["step"]
                    print(f"  scheduler: SIGTERM to {attempt} (pid {child.pid})", flush=True)
                    child.send_signal(signal.SIGTERM)
        code = child.wait(timeout=CHILD_TIMEOUT)
    done = [e for e in events if e["event"] == "done"]
    if code != 0 or not done:
        raise RuntimeError(f"the {attempt} attempt exited with status {code} and reported {done}")
    return {**done[-1], "exit_code": code, "signalled_at_step": signalled_at}


def read_wandb_history(log_dir: Path) -> list[dict[str, Any]]:
    """The offline run's history rows as W&B keeps them once synced.

    Each ``offline-run-*`` directory is one segment of the run; a segment started with a rewind
    (its run record's ``branch_point``) first drops the rows after that step.
    """
    from wandb.proto import wandb_internal_pb2  # noqa: PLC0415
    from wandb.sdk.internal import datastore  # noqa: PLC0415

    rows: list[dict[str, Any]] = []
    for run_file in sorted((log_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        store = datastore.DataStore()
        store.open_for_scan(str(run_file))
        try:
            while (data := store.scan_data()) is not None:
                record = wandb_internal_pb2.Record()
                record.ParseFromString(data)
                kind = record.WhichOneof("record_type")
                if kind == "run" and record.run.HasField("branch_point"):
                    point = int(record.run.branch_point.value)
                    rows = [row for row in rows if row["_step"] <= point]
                elif kind == "history":
                    rows.append(
                        {
                            item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item
                        }
                    )
        finally:
            store._fp.close()  # the reader has no close of its own
    return rows


def wait_for_wandb_rows(log_dir: Path, steps: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The history, once wandb's service has written the last step (it writes a moment after)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = read_wandb_history(log_dir)
        if any(row.get("_step") == steps for row in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def steps_logged(outputs: Path, run_ids: dict[str, str]) -> dict[str, list[int]]:
    """The steps of ``METRIC`` each backend holds, sorted, duplicates included."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    from substrax.tracking import read_scalars  # noqa: PLC0415

    logs = outputs / "logs"
    history = MlflowClient(tracking_uri=f"sqlite:///{outputs / 'mlflow.db'}").get_metric_history(
        run_ids["mlflow"], METRIC
    )
    rows = wait_for_wandb_rows(logs, STEPS)
    return {
        "file": sorted(s for s, _ in read_scalars(logs / f"{NAME}.metrics.jsonl")[METRIC]),
        "mlflow": sorted(m.step for m in history),
        "wandb": sorted(row["_step"] for row in rows if METRIC in row),
    }


def main() -> dict[str, Any]:
    start = time.perf_counter()
    outputs = resolve_output_dir(NAME).path
    for leftover in ("checkpoints", "logs", "wandb-home", "mlflow.db"):  # a fresh run each time
        path = outputs / leftover
        if path.is_dir():
            shutil.rmtree(path)
        path.unlink(missing_ok=True)

    print("first attempt (SIGTERMed mid-run):", flush=True)
    first = run_attempt("first", outputs, preempt_after=PREEMPT_AFTER)
    print(f"  saved step {first['preempted_at']} on the way out", flush=True)
    print("resumed attempt:", flush=True)
    second = run_attempt("resume", outputs, preempt_after=None)
    steps = steps_logged(outputs, second["run_ids"])
    expected = list(range(1, STEPS + 1))
    exactly_once = {backend: found == expected for backend, found in steps.items()}

    summary_path = outputs / "summary.json"
    summary: dict[str, Any] = {
        "steps": STEPS,
        "preempted_at_step": first["preempted_at"],
        "first_exit_code": first["exit_code"],
        "restored_step": second["restored_step"],
        "restored_was_preempted": second["restored_was_preempted"],
        "steps_before": first["preempted_at"],
        "steps_after": STEPS - second["restored_step"],
        "same_runs": first["run_ids"] == second["run_ids"],
        "run_ids": second["run_ids"],
        "dropped_file_records": second["dropped_file_records"],
        "every_step_once": exactly_once,
        "val_loss": second["val_loss"],
        "unigram_baseline": second["unigram_baseline"],
        "seconds": round(time.perf_counter() - start, 1),
        "outputs": {
            "metrics": str(outputs / "logs"),
            "checkpoints": str(outputs / "checkpoints"),
            "mlflow": str(outputs / "mlflow.db"),
            "wandb": str(outputs / "logs" / "wandb"),
            "summary": str(summary_path),
        },
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"preempted at step {summary['preempted_at_step']}, resumed from step "
        f"{summary['restored_step']} in a new process; every step once in "
        + ", ".join(f"{b}: {ok}" for b, ok in exactly_once.items())
        + f"; validation loss {summary['val_loss']:.3f} (unigram baseline "
        f"{summary['unigram_baseline']:.3f}); {summary['seconds']} s; outputs in {outputs}"
    )
    return summary


if __name__ == "__main__":
    if len(sys.argv) == 3:  # a child: `<script> first|resume <outputs>`
        train(sys.argv[1], Path(sys.argv[2]))
    else:
        print(json.dumps(main()))
