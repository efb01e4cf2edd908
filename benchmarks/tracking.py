"""µs per log_scalar call: substrax.tracking loggers against the plain SDK calls, measured side by side.

    uv run python benchmarks/tracking.py [--quick]

Goals: a call on a remote backend (MLflow, W&B) costs < 50 µs and >= 20x less than the direct SDK
call; the file logger sustains >= 100,000 scalars/s. The remote loggers' calls return once the
record is queued; the time their worker then needs to drain the queue is shown as "drain".
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from substrax.support import format_table


# Benchmarks talk to no address but 127.0.0.1: MLflow would fetch its telemetry config at the
# first tracked call.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"


def per_call(n: int, call: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for i in range(n):
        call(i)
    return (time.perf_counter() - start) / n * 1e6


def bench_file(root: Path, n: int) -> dict[str, float]:
    from substrax.tracking import FileLogger

    logger = FileLogger("bench", root / "file")
    us = per_call(n, lambda i: logger.log_scalar("loss", 1.0 / (i + 1), step=i))
    logger.close()
    return {"us": us, "per_s": 1e6 / us}


def bench_mlflow(root: Path, n_logger: int, n_direct: int) -> dict[str, float]:
    import mlflow

    from substrax.tracking import MLFlowLogger

    uri = f"sqlite:///{root / 'mlflow.db'}"
    logger = MLFlowLogger("bench", tracking_uri=uri, log_dir=root / "mlflow")
    logger.log_scalar("warmup", 0.0, step=0)
    logger.wait_delivered(120)
    us = per_call(n_logger, lambda i: logger.log_scalar("loss", 1.0 / (i + 1), step=i))
    start = time.perf_counter()
    logger.close()
    drain = time.perf_counter() - start

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("bench")  # the same store
    with mlflow.start_run():
        mlflow.log_metric("warmup", 0.0, step=0)
        direct = per_call(n_direct, lambda i: mlflow.log_metric("loss", 1.0 / (i + 1), step=i))
    return {"us": us, "direct_us": direct, "drain_s": drain}


def bench_wandb(root: Path, n_logger: int, n_direct: int) -> dict[str, float]:
    import wandb

    from substrax.tracking import WandbLogger

    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    logger = WandbLogger("bench", project="bench", log_dir=root / "wandb-logger")
    logger.log_scalar("warmup", 0.0, step=0)
    logger.wait_delivered(120)
    us = per_call(n_logger, lambda i: logger.log_scalar("loss", 1.0 / (i + 1), step=i + 1))
    start = time.perf_counter()
    logger.close()
    drain = time.perf_counter() - start

    (root / "wandb-direct").mkdir()
    run = wandb.init(project="bench", dir=str(root / "wandb-direct"), reinit="create_new")
    run.log({"warmup": 0.0}, step=0)
    direct = per_call(n_direct, lambda i: run.log({"loss": 1.0 / (i + 1)}, step=i + 1))
    run.finish()
    return {"us": us, "direct_us": direct, "drain_s": drain}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    rows: list[tuple[str, str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        file = bench_file(root, 200_000 // scale)
        rows.append(
            (
                "FileLogger.log_scalar",
                f"{file['us']:.2f}",
                "-",
                "-",
                f"{file['per_s']:,.0f} scalars/s (goal >= 100,000)",
            )
        )
        ml = bench_mlflow(root, 20_000 // scale, 500 // scale)
        rows.append(
            (
                "MLFlowLogger.log_scalar",
                f"{ml['us']:.2f}",
                f"{ml['direct_us']:.0f}",
                f"{ml['direct_us'] / ml['us']:.0f}x",
                f"vs mlflow.log_metric, same sqlite store; drain {ml['drain_s']:.1f} s",
            )
        )
        wb = bench_wandb(root, 20_000 // scale, 5_000 // scale)
        rows.append(
            (
                "WandbLogger.log_scalar",
                f"{wb['us']:.2f}",
                f"{wb['direct_us']:.0f}",
                f"{wb['direct_us'] / wb['us']:.0f}x",
                f"vs wandb run.log, offline; drain {wb['drain_s']:.1f} s",
            )
        )
    print(format_table(("call", "µs/call", "direct µs", "ratio", "notes"), rows))
    ok = file["per_s"] >= 100_000 and all(
        r["us"] < 50 and r["direct_us"] / r["us"] >= 20 for r in (ml, wb)
    )
    print(f"\ngoals met: {ok}")


if __name__ == "__main__":
    main()
