"""What the plumbing costs inside a training loop: logging, checkpointing and callbacks per step.

Run: ``uv run python benchmarks/loop_overhead.py [--steps 100] [--log-steps 1000] [--repeats 7]
[--quick]``. One
process on 1 CPU device (``JAX_PLATFORMS=cpu``) trains an MLP 256-1024-1024-10 (batch 256,
adam through ``optax.inject_hyperparams``, a 16 MB state with the optimizer's) with one
``substrax.spmd.TrainStep``, and times the same loop

* bare: the step, and its loss read to the host (every variant reads it, as any loop that
  watches its loss does, so the ratios are the plumbing's own cost);
* with logging every step: a ``FileLogger`` alone, then with an ``MLFlowLogger`` on SQLite (a
  local file, no server). The loggers are made once, before any timed run, as a training
  script makes them before its loop; that setup (with MLflow: the database, its tables, the
  experiment and the run) is timed apart and printed under the table, not counted per step.
  Each timed run is 1000 steps (``--log-steps``), about 6 s, and ends with the loggers'
  ``flush``: everything logged is in MLflow's database before the run counts as done; they are
  compared with a bare run of the same length in the same round. A logger past its first 1000
  metric values writes MLflow's database from a child process
  (``substrax.tracking._mlflow_child``); the benchmark logs that many before any timed run, as
  setup, so the timed runs see a long run's steady state. The flush's own time, the time of the
  logging calls on the training thread, the CPU of MLflow's delivery thread and of the writer
  process per step are printed too. A run of 100 steps would add a flush every 100 steps, which
  a training run does not do: the records a flush waits for are those of the last
  ``batch_interval`` (1 s), whatever the run's length. Whole runs differ by several percent on
  a shared 2-core machine, more than the 1% goal, so each logger also gets a paired run
  (``--paired-steps``, 3000): it logs at every other step, and a logged step is compared with
  the unlogged step right after it (median difference, with a distribution-free 95% interval).
  The logging goals are judged on that difference, plus what the logging calls at a few steps
  only (the file log writing its lines) take past the median call, plus the CPU per step of the
  logger's delivery thread and MLflow's writer process, counted in full;
* with the store saving every 10 steps: ``OrbaxCheckpointStore`` (async, its defaults);
* with plain orbax saving every 10 steps: a ``CheckpointManager`` (async, its defaults);
* with every callback on: early stopping, plateau learning-rate reduction (both checked at
  each "epoch" of 50 steps), loss-spike detection, a progress bar (drawn into a buffer) and a
  ``CheckpointCallback`` saving to the store every 10 steps.

Each time is the run's whole wall time, the wait for pending saves (and the loggers' flush) at
its end included, divided by its steps: what a user pays per step. The variants run in rounds,
each round in another order, so load drifts hit all alike; a variant's overhead is the median
over rounds of its time over the bare loop's in the same round. Under the table, the store's
and plain orbax's save split: the time the loop waits inside ``save`` and the process CPU a
save burns beyond the bare loop (the background write, competing with XLA for the cores).

What it measured (2026-12-01, this 2-core machine, quiet; 7 rounds, bare step 5.9 ms):

* logging: the file log alone -1.2%, +1.3%, -1.1%, +0.2%, +0.7%, -0.8% in six runs (noise of
  about +-1.3% sets the resolution); file + MLflow/SQLite +1.35% in the run before the writer
  process, then +1.15%, +2.29%, +1.16%, +2.46%, +0.68% in five runs (the first two against a
  100-step bare run, the last two with the writer at nice 19, no better than 10). On the
  training thread the logging calls cost 0.022 ms per
  step (0.37%; the file log alone 0.015 ms); the flush at a run's end 5-11 ms per 1000 steps
  (0.1-0.2%); MLflow's delivery thread now burns 0.006 ms of CPU per step (0.093 ms when it
  wrote the database itself, holding the GIL) and the writer process 0.060 ms, niced. MLflow's
  SQL store costs about 0.07 ms of CPU per value whichever process runs it; on two cores that
  XLA keeps busy, that CPU is what is left of the overhead.
* saves: the store burns 65-69 ms of process CPU per save beyond the bare loop, plain orbax
  66-73 ms; the loop waits 1.6 ms in the store's ``save`` against orbax's 8.3-8.6 ms. Overheads
  +70.2% vs +81.4% (0.86x), +73.1% vs +81.4% (0.90x), +75.1% vs +84.0% (0.89x), +73.0% vs
  +82.3% (0.89x): the goal (at most half) is missed. Before today's changes: +112.5% vs
  +108.5% (1.04x), 99 ms of CPU per save each.

On a slower host (2026-12-02: AMD EPYC without AVX-512, 2 cores, bare step 22.6 ms), same
code: the file log alone -3.1% and a bare run as long as a logging run +1.6% (noise about +-3%);
file + MLflow/SQLite +5.5%, the logging calls 0.164 ms per step on the training thread and the
writer process 0.46 ms of CPU per step; saves +64.7% (store) vs +67.8% (orbax), 0.96x, 246 vs
243 ms of CPU per save, the loop waiting 4.4 ms in the store's ``save`` against 22.6 ms in
orbax's.

The same host after the store's writes were batched (every array's TensorStore open and write
started at once and awaited in one place, a module ``_array_writes`` since removed; 7 rounds, bare
step 23.1 ms): saves **+45.4% (store) vs +63.3% (orbax), 0.72x**, 173 vs 223 ms of CPU per save,
the loop waiting 4.3 ms in the store's ``save`` against 23.2 ms in orbax's. Logging in the same
run: the file log alone +5.7% and file + MLflow/SQLite +3.4%, with the long bare run -2.7%
against the short one (noise of several percent on this host; the file log's calls cost 0.112 ms
per step, 0.5%); the logging calls 0.163 ms per step on the training thread, the writer process
0.47 ms of CPU per step.
A second run after LossSpikeDetector's fixes (bare step 21.1 ms): saves +50.0% vs +67.8%
(0.74x), 181 vs 231 ms of CPU per save; every callback +50.7% (was +58.7%: the detector had
warned at every step once the memorised batch's loss read 0.0, then 2.4e-7), about what the
store's saves cost alone; logging +2.1% (file) and +7.9% (file + MLflow/SQLite) with the long
bare run +3.6% against the short one: the two logging figures moved by 3-4 points between runs
of the same code.

Where a save's CPU went before the batched writes (save + wait in a loop, medians of 40 saves,
the 2-core VM's ext4): ~30
ms in orbax's per-save threads (about 26 short-lived threads and 14 new event loops per save,
18 of the threads from ``asyncio.to_thread``: commit futures, JSON items, finalization), ~25 ms
in TensorStore's workers (mostly ext4's per-inode cost: 62 files in 31 directories per step),
~5 ms on the store's writer thread, ~3 ms removing the dropped step on the chores thread, ~3 ms
on the training thread. What came off today: one directory per array instead of one per axis
(chunk keys ``c.0.1``: 93 inodes per step instead of 122; ext4 checks each new inode against
recent deletions), one commit future per save instead of two in the store's array handler, and
no ``fsync`` of the array files (about 190 syncs per save; orbax never syncs a step's JSON
files, so the syncs never made a step survive a power cut whole; a ``kill -9`` leaves whole
steps either way, tested). Tried without effect: a synchronous ``CheckpointManager`` on the
writer thread (about 2 ms less, at the price of a second manager sharing the steps), orbax's
``create_directories_asynchronously=False``, TensorStore's I/O and copy concurrency capped at 1
or 2; a lower OS priority for the writer made the loop slower (a niced writer is starved while
the next save waits for it). Half of plain orbax's overhead (~35 ms of CPU per save) is about
what orbax's own per-save machinery costs, which the store runs through: the spec puts the
store over ``CheckpointManager`` with ``PyTreeSave`` items, and only a write path of its own
could go below that.
Profiled after the batched writes (py-spy, GIL samples of a 20-array save loop): what is left is
orbax's per-save machinery (commit-future threads, each with a new event loop; the finalize
thread; ``process_index`` and ``epath`` path handling), orbax's deleter finding the dropped step
(~9% of the samples) and TensorStore's own work (~12% of the CPU, most of it copying the bytes).
Tried again on 2026-12-02 in a loop like this one (9 rounds of 100 steps, bare step 14-17 ms, the
bare loop using 1.94 cores): the store +52.1% and +52.3% against a writer whose threads (and
TensorStore's) run at nice 19, +56.0% and +54.7%: no gain, since XLA keeps both cores busy. A
save burned 190 ms of process CPU in the loop (117 ms alone), plain orbax's 219 ms (162 ms alone).
The OCDBT layout (``use_ocdbt=True``) against the default layout and plain orbax, four runs:
+47.4/+58.0/+62.5%, +46.8/+51.4/+49.9%, +41.3/+51.1/+61.2%, +50.6/+61.4/+65.4%. OCDBT came out 5-11
points below the default layout every time; the store-to-orbax ratio itself read 0.61x to 1.03x
across runs (the default layout), 0.67x to 0.94x (OCDBT).
The benchmark itself at b1ea088 (7 rounds, bare step 14.5 ms): saves +50.0% (store) vs +56.3%
(orbax), 0.89x, 132 vs 133 ms of CPU per save, the loop waiting 2.5 ms in the store's ``save``
against 11.4 ms in orbax's; logging read -1.8% (file) and -0.8% (file + MLflow/SQLite), the
verdicts "met", but the long bare run read +4.4% against the short one, so the noise still hides
1%; the logging calls 0.070 ms (file) and 0.095 ms (file + MLflow) per step on the training
thread, the writer process 0.180 ms of CPU per step; every callback +46.7%.

With the store writing a tree's later steps itself (a module ``_step_templates``, since removed: the
files orbax wrote for the tree's first step, each array through TensorStore, no orbax machinery
per save), two full runs on 2026-12-02 (7 rounds, bare step 15.0 ms each): saves **+23.5%
(store) vs +55.5% (orbax), 0.42x**, then **+29.6% vs +71.1%, 0.42x: the goal is met**; 57 and 69
ms of CPU per save beyond the bare loop against orbax's 126 and 166 ms; the loop waiting 2.7-2.8
ms in the store's ``save`` against 11.5-12.3 ms in orbax's; every callback +30.5% and +35.2%.
Alone (save + wait, 40 saves): 41-44 ms of CPU per save against 70 before and orbax's 104.
Logging, second run, with the paired runs: the file log adds +0.086 ms to a logged step (95%
interval +0.054 to +0.124 ms), **0.57% of the step (0.36-0.82%): met**, where whole runs read
+5.4% (and +4.9% in the first run: the noise the paired run removes). File + MLflow/SQLite:
+0.114 ms on the training thread (0.76%, interval 0.42-1.03%) plus 0.215 ms of CPU per step off
it (MLflow's delivery thread 0.015 ms, its writer process 0.200 ms: MLflow's SQL store), 2.19%
counted in full: missed, by the CPU of MLflow's own store.
A third full run, after ``FileLogger`` began formatting its lines at the flush, on a busier host
(bare step 19.7 ms, ranging 16.0-22.0 ms over the rounds; the long bare run +12.2% against the
short one): saves +34.9% vs +62.9%, **0.55x: missed in this run**, though a save's CPU beyond
the bare loop was 94 ms against orbax's 212 (0.44x, as in the runs above); the file log +0.34%
paired (0.11-0.56%), file + MLflow 0.75% + 1.84% off the training thread = 2.58%.

With MLflow's writer process inserting known keys' values into the SQLite tables itself
(``substrax.tracking._mlflow_sqlite``, one transaction per batch instead of MLflow's ORM), two
full runs on 2026-12-02 on a slower host (bare step 24.3 and 23.5 ms). Through MLflow's ORM
the writer process took 0.180-0.200 ms of CPU per step (the runs above). Opening a connection
per batch (a first version: SQLite reads MLflow's schema anew, about 2 ms) it took 0.150 ms,
file + MLflow +0.56% paired + 0.75% off the training thread = 1.31%. Keeping the connection:
the writer process **0.070 ms** per step, file + MLflow +0.81% paired
(0.52-1.16%) + 0.44% off the thread (the delivery thread 0.032 ms, the writer 0.070 ms) =
**1.25%: still missed**; the file log alone +0.51% paired (0.16-0.79%, met). MLflow's share
is now mostly the on-thread call (0.119 ms per step with it against 0.072 ms for the file log
alone, flushes included). Saves in the same runs: +20.0% vs +70.4% (0.28x) and +23.9% vs
+61.5% (0.39x), met. A third run after the review's fixes (latest values read per key; bare
step 21.7 ms): the writer process 0.070 ms per step, file + MLflow +0.57% paired (0.26-0.97%)
+ 0.46% off the thread = **1.03%: missed by a hair** (whole runs +1.98%, the file log alone
+1.22%, the long bare run +2.2%); the file log +0.52% paired; saves +32.9% vs +68.5% (0.48x).

With the per-step call trimmed (one ``_write_scalar`` hook: no mapping per call, a remote logger
queueing a plain tuple, ``MultiLogger`` calling each logger's ``log_scalar`` directly) and the
writer building row tuples, two full runs on 2026-12-02 (bare step 22.0 and 22.9 ms). The goal
now also counts the logging calls' rare slow ones (the file log writing its lines, about one
step in fifty) past their median, 0.017-0.019 ms per step (0.07-0.08%). The logging calls on the
training thread: 0.075 ms per step with MLflow (was 0.121), 0.052 ms for the file log alone (was
0.069). File + MLflow: +0.38% paired (0.12-0.76%) + 0.08% rare + 0.46% off the thread (the
delivery thread 0.031 ms, the writer 0.069 ms) = **0.93%: met**; then +0.38% (0.07-0.73%) +
0.07% + 0.43% = **0.88%: met** (whole runs +1.96% and +0.56%). The file log alone 0.33% and
0.43%. Saves +23.2% vs +68.0% (0.34x) and +17.7% vs +64.3% (0.28x).
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Benchmarks talk to no address but 127.0.0.1: MLflow would fetch its telemetry config at the
# first tracked call.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

import absl.logging
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from substrax.spmd import TrainStep


absl.logging.set_verbosity(absl.logging.ERROR)  # orbax's per-save notes would bury the table

EVERY = 10  # steps between saves
EPOCH = 50  # steps between the callbacks' epoch-end checks
BARE = "bare loop"
BARE_LONG = "bare loop, as long as a logging run"
FILE_LOG = "file log every step"
LOGGING = "logging every step (file + MLflow/SQLite)"
STORE = f"store saving every {EVERY} steps"
ORBAX = f"plain orbax saving every {EVERY} steps"
CALLBACKS = "every callback (checkpoint included)"


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.l1 = nnx.Linear(256, 1024, rngs=rngs)
        self.l2 = nnx.Linear(1024, 1024, rngs=rngs)
        self.l3 = nnx.Linear(1024, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.l3(jax.nn.relu(self.l2(jax.nn.relu(self.l1(x)))))


def loss_fn(model: MLP, batch: dict[str, jax.Array]) -> jax.Array:
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


@dataclass
class Variant:
    """One way to run the loop: what happens after each step, and at the end of a run."""

    after: Callable[[int, float], None] = lambda _step, _loss: None
    end: Callable[[], None] = lambda: None
    close: Callable[[], None] = lambda: None
    times: list[float] = field(default_factory=list)  # seconds per step, one per round
    ends: list[float] = field(default_factory=list)  # seconds end() took, one per round
    setup: float = 0.0  # seconds to make the variant's objects, once, before any timed run
    worker: int | None = None  # the CPU clock of a background thread to account, if any
    worker_cpu: list[float] = field(default_factory=list)  # its CPU seconds per step, per round
    child: int | None = None  # the process id of a helper process to account, if any
    child_cpu: list[float] = field(default_factory=list)  # its CPU seconds per step, per round
    cpu: list[float] = field(default_factory=list)  # the process's CPU seconds per step, per round
    in_save: list[float] = field(default_factory=list)  # seconds the loop spent in save calls
    in_after: list[float] = field(
        default_factory=list
    )  # seconds per step spent in after(), per round
    paired: tuple[float, float, float] | None = None  # a logged step's extra seconds, 95% CI
    rare: float = 0.0  # seconds per logged step its slow calls (the flushes) take past the median


def _logging(base: Path, *, mlflow: bool) -> Variant:
    """The loggers, made before any timed run as a training script makes them before its loop.

    Their making (with MLflow: the SQLite database, its tables, the experiment and the run) is
    timed on its own, as the variant's one-time setup.
    """
    from substrax.tracking import FileLogger, Logger, MLFlowLogger, MultiLogger

    if mlflow:
        importlib.import_module("mlflow")  # the import is not the logger's setup
    directory = base / ("logs" if mlflow else "file-log")
    started = time.perf_counter()
    loggers: list[Logger] = [FileLogger("bench", directory)]
    child = None
    if mlflow:
        uri = f"sqlite:///{directory / 'mlflow.db'}"
        mlflow_logger = MLFlowLogger("bench", tracking_uri=uri, log_dir=directory)
        loggers.append(mlflow_logger)
    logger = MultiLogger(loggers)
    if mlflow:
        # A run past its first SPAWN_AFTER metric values writes MLflow's database from a child
        # process (substrax.tracking._mlflow_child); its start is setup, as in a long run.
        from substrax.tracking._mlflow_child import SPAWN_AFTER

        for step in range(SPAWN_AFTER + 1):
            logger.log_scalar("warm-up", 0.0, step=step)
        logger.flush()
        if mlflow_logger._sink:  # the child starts without holding the logger: wait for it here
            mlflow_logger._sink.writer.wait_ready(timeout=120)
            child = mlflow_logger._sink.writer.pid
    setup = time.perf_counter() - started
    # MLflow is written to from the logger's delivery thread: its CPU time is accounted below.
    workers = [
        t for t in threading.enumerate() if t.name == "substrax-tracking-MLFlowLogger('bench')"
    ]
    worker = time.pthread_getcpuclockid(workers[0].ident) if workers and workers[0].ident else None
    return Variant(
        after=lambda step, loss: logger.log_scalar("loss", loss, step=step),
        end=logger.flush,  # what was logged is delivered before the run counts as done
        close=logger.close,
        setup=setup,
        worker=worker,
        child=child,
    )


class _Counter:
    """The steps a store or manager numbers its saves by, increasing across runs."""

    def __init__(self) -> None:
        self.step = 0


def _store(base: Path, train: TrainStep[MLP]) -> Variant:
    from substrax.checkpoint import OrbaxCheckpointStore

    store = OrbaxCheckpointStore(base / "store", max_to_keep=2)
    count = _Counter()
    variant = Variant(end=store.wait, close=store.close)

    def after(_step: int, loss: float) -> None:
        count.step += 1
        if count.step % EVERY == 0:
            started = time.perf_counter()
            store.save(count.step, {"model": train.state}, metrics={"loss": loss})
            variant.in_save.append(time.perf_counter() - started)

    variant.after = after
    return variant


def _orbax(base: Path, train: TrainStep[MLP]) -> Variant:
    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True)
    manager = ocp.CheckpointManager(base / "orbax", options=options)
    count = _Counter()
    variant = Variant(end=manager.wait_until_finished, close=manager.close)

    def after(_step: int, _loss: float) -> None:
        count.step += 1
        if count.step % EVERY == 0:
            started = time.perf_counter()
            manager.save(
                count.step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(train.state))
            )
            variant.in_save.append(time.perf_counter() - started)

    variant.after = after
    return variant


def _callbacks(base: Path, train: TrainStep[MLP], steps: int) -> Variant:
    from rich.console import Console

    from substrax.callbacks import (
        CallbackList,
        EarlyStoppingCallback,
        EarlyStoppingConfig,
        LossSpikeDetector,
        ProgressCallback,
        ReduceLROnPlateauCallback,
    )
    from substrax.checkpoint import CheckpointCallback, OrbaxCheckpointStore

    store = OrbaxCheckpointStore(base / "callbacks", max_to_keep=2)
    callbacks = CallbackList(
        [
            EarlyStoppingCallback(EarlyStoppingConfig(monitor="loss", patience=1000)),
            ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1000),
            LossSpikeDetector(monitor="loss"),
            ProgressCallback(total_steps=steps, console=Console(file=io.StringIO())),
            CheckpointCallback(
                store,
                items=lambda _trainer: {"model": train.state},
                every_n_epochs=None,
                every_n_steps=EVERY,
                monitor=("loss",),
            ),
        ]
    )
    epoch_losses: list[float] = []
    started: list[bool] = []

    def after(step: int, loss: float) -> None:
        if not started:
            callbacks.on_train_begin(train)
            started.append(True)
        if step % EPOCH == 0:
            callbacks.on_epoch_begin(train, step // EPOCH)
        callbacks.on_batch_begin(train, step)
        logs = {"loss": loss}
        callbacks.on_batch_end(train, step, logs)
        epoch_losses.append(loss)
        if (step + 1) % EPOCH == 0:
            callbacks.on_epoch_end(train, step // EPOCH, {"loss": statistics.fmean(epoch_losses)})
            epoch_losses.clear()

    def end() -> None:
        store.wait()  # what on_train_end does, without ending the progress bar between runs

    def close() -> None:
        callbacks.on_train_end(train)
        store.close()

    return Variant(after=after, end=end, close=close)


def paired_cost(
    train: TrainStep[MLP], batch: dict[str, jax.Array], variant: Variant, count: int
) -> tuple[tuple[float, float, float], float]:
    """What logging adds to a step, from one run of ``count`` steps that logs every other one.

    Each step is timed from its dispatch to the next one's, so a logged step carries its logging
    call. Step ``2k`` logs and step ``2k + 1`` does not: each pair ran back to back, under the
    same load, so the load drifts that make whole runs differ by several percent on a shared
    machine cancel out of their difference. Returns the median difference (seconds) and its
    distribution-free 95% confidence interval (the order statistics a sign test gives): a step
    that another process delayed by milliseconds moves neither, where it would move a mean. What
    runs off the training thread (MLflow's delivery thread and writer process) is spread over
    both steps of a pair; its CPU is accounted apart.

    The median leaves out what a logger does at a few steps only: the file log writes its lines
    at about one step in fifty. The logging calls themselves are timed too, and what they take
    past their median, on average, is returned second (seconds per logged step): the cost of
    those rare calls, which the goal counts in full.
    """
    times: list[float] = []
    calls: list[float] = []
    before = time.perf_counter()
    for step in range(count):
        loss = float(train(batch))
        if step % 2 == 0:
            called = time.perf_counter()
            variant.after(step, loss)
            calls.append(time.perf_counter() - called)
        now = time.perf_counter()
        times.append(now - before)
        before = now
    variant.end()
    differences = sorted(times[i] - times[i + 1] for i in range(0, count - 1, 2))
    n = len(differences)
    spread = int(1.96 * n**0.5 / 2) + 1
    low, high = max(0, n // 2 - spread), min(n - 1, (n - 1) // 2 + spread)
    rare = statistics.fmean(calls) - statistics.median(calls)
    return (statistics.median(differences), differences[low], differences[high]), rare


def measure(
    steps: int, repeats: int, base: Path, log_steps: int, paired_steps: int
) -> dict[str, Variant]:
    model = MLP(nnx.Rngs(0))
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    train = TrainStep(model, optimizer, loss_fn)
    rng = np.random.default_rng(0)
    batch = {
        "x": jax.device_put(rng.normal(size=(256, 256)).astype(np.float32)),
        "y": jax.device_put(rng.integers(0, 10, size=(256,)).astype(np.int32)),
    }
    state_mb = sum(leaf.nbytes for leaf in jax.tree.leaves(train.state)) / (1 << 20)
    print(
        f"MLP 256-1024-1024-10, batch 256, adam; state {state_mb:.1f} MB;"
        f" {jax.device_count()} {jax.default_backend()} device(s), {os.cpu_count()} CPU cores;"
        f" {steps} steps per run ({log_steps} with logging), {repeats} rounds"
    )
    variants = {
        BARE: Variant(),
        BARE_LONG: Variant(),
        FILE_LOG: _logging(base, mlflow=False),
        LOGGING: _logging(base, mlflow=True),
        STORE: _store(base, train),
        ORBAX: _orbax(base, train),
        CALLBACKS: _callbacks(base, train, steps * (repeats + 1)),
    }

    def run(variant: Variant, count: int) -> float:
        cpu = 0.0 if variant.worker is None else time.clock_gettime(variant.worker)
        child = _process_cpu(variant.child)
        process = time.process_time()
        start = time.perf_counter()
        inside = 0.0
        for step in range(count):
            loss = float(train(batch))
            called = time.perf_counter()
            variant.after(step, loss)
            inside += time.perf_counter() - called
        ending = time.perf_counter()
        variant.in_after.append(inside / count)
        variant.end()
        done = time.perf_counter()
        variant.ends.append(done - ending)
        variant.cpu.append((time.process_time() - process) / count)
        if variant.worker is not None:
            variant.worker_cpu.append((time.clock_gettime(variant.worker) - cpu) / count)
        if variant.child is not None:
            variant.child_cpu.append((_process_cpu(variant.child) - child) / count)
        return (done - start) / count

    order = random.Random(0)  # noqa: S311 - an order of runs, not a secret
    for variant in variants.values():  # warm up: compile, open, the first save of each writer
        run(variant, 2 * EVERY)
        variant.ends.clear()
        variant.worker_cpu.clear()
        variant.child_cpu.clear()
        variant.in_after.clear()
        variant.cpu.clear()
        variant.in_save.clear()
    try:
        for _ in range(repeats):
            names = list(variants)
            order.shuffle(names)
            for name in names:
                count = log_steps if name in (BARE_LONG, FILE_LOG, LOGGING) else steps
                variants[name].times.append(run(variants[name], count))
        for name in (FILE_LOG, LOGGING):
            variants[name].paired, variants[name].rare = paired_cost(
                train, batch, variants[name], paired_steps
            )
    finally:
        for variant in variants.values():
            variant.close()
    return variants


def _process_cpu(pid: int | None) -> float:
    """The CPU seconds (user and system) process ``pid`` has used so far (0 when there is none).

    Read from the scheduler's own count (nanoseconds), not ``/proc/PID/stat``'s clock ticks:
    at 10 ms a tick, a writer using 70 ms over a 1000-step run reads 60 or 80.
    """
    if pid is None:
        return 0.0
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def table(variants: dict[str, Variant]) -> dict[str, float]:
    """Print the table; return each variant's median overhead over the bare loop."""

    def reference(name: str) -> list[float]:  # a bare run as long as the variant's
        return variants[BARE_LONG if name in (FILE_LOG, LOGGING) else BARE].times

    overhead = {
        name: statistics.median(t / b - 1.0 for t, b in zip(v.times, reference(name), strict=True))
        for name, v in variants.items()
    }
    print()
    print(f"{'loop':44} {'ms/step':>8} {'min':>7} {'max':>7} {'overhead':>9}")
    for name, variant in variants.items():
        print(
            f"{name:44} {statistics.median(variant.times) * 1e3:8.2f}"
            f" {min(variant.times) * 1e3:7.2f} {max(variant.times) * 1e3:7.2f}"
            f" {overhead[name]:+8.1%}"
        )
    print("(ms/step: median over rounds, wait for pending saves included; overhead: median over")
    print(" rounds of the run's time over the bare loop's of the same length in the same round)")
    for name in (FILE_LOG, LOGGING):
        variant = variants[name]
        print(
            f"{name}: made once before the runs in {variant.setup * 1e3:.0f} ms (not in the"
            f" table); its flush at each run's end {statistics.median(variant.ends) * 1e3:.1f} ms"
            " (median, in the table); the logging calls themselves"
            f" {statistics.median(variant.in_after) * 1e3:.3f} ms per step on the training thread"
            + (
                f"; its delivery thread's CPU {statistics.median(variant.worker_cpu) * 1e3:.3f}"
                " ms per step (in the table as far as it slows the loop)"
                if variant.worker_cpu
                else ""
            )
            + (
                f"; its MLflow writer process's CPU {statistics.median(variant.child_cpu) * 1e3:.3f}"
                " ms per step"
                if variant.child_cpu
                else ""
            )
        )
    for name in (STORE, ORBAX):
        variant = variants[name]
        extra = statistics.median(
            c - b for c, b in zip(variant.cpu, variants[BARE].cpu, strict=True)
        )
        print(
            f"{name}: per save, the loop waits in save() {statistics.median(variant.in_save) * 1e3:.1f}"
            f" ms (median; max {max(variant.in_save) * 1e3:.0f} ms) and the process burns"
            f" {extra * EVERY * 1e3:.0f} ms of CPU more than the bare loop's (median over rounds)"
        )
    bare = statistics.median(variants[BARE].times)
    costs: dict[str, float] = {}
    for name in (FILE_LOG, LOGGING):
        variant = variants[name]
        assert variant.paired is not None  # measure() pairs every logging variant
        median, low, high = variant.paired
        rounds = len(variant.times)
        background = statistics.median(
            w + c
            for w, c in zip(
                variant.worker_cpu or [0.0] * rounds,
                variant.child_cpu or [0.0] * rounds,
                strict=True,
            )
        )
        costs[name] = (median + variant.rare + background) / bare
        print(
            f"{name}, paired steps: a logged step takes {median * 1e3:+.3f} ms more (median;"
            f" 95% CI {low * 1e3:+.3f} to {high * 1e3:+.3f} ms), {median / bare:+.2%} of the bare"
            f" step ({low / bare:+.2%} to {high / bare:+.2%}); its rare slow calls (flushes)"
            f" {variant.rare * 1e3:.3f} ms per step past the median call ({variant.rare / bare:.2%});"
            f" off the training thread {background * 1e3:.3f} ms of CPU per step"
            f" ({background / bare:.2%}), counted in full (one ms of CPU taken from the step's"
            " cores, one ms longer step)"
        )
    store, orbax = overhead[STORE], overhead[ORBAX]
    print("goals:")
    for name in (FILE_LOG, LOGGING):
        cost = costs[name]
        print(
            f"  {name} < 1% of step time: {cost:+.2%} paired, with its rare calls and its CPU"
            f" off the training thread ({_verdict(cost < 0.01)}; whole runs:"
            f" {overhead[name]:+.2%})"
        )
    ratio = store / orbax if orbax > 0 else float("inf")
    print(
        f"  store's save overhead <= plain orbax's: {store:+.1%} vs {orbax:+.1%},"
        f" {ratio:.2f}x ({_verdict(store <= orbax)})"
    )
    return overhead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=7, help="rounds of every variant")
    parser.add_argument(
        "--log-steps",
        type=int,
        default=1000,
        help="steps per timed run of the logging variants (a run ends with the loggers' flush)",
    )
    parser.add_argument(
        "--paired-steps",
        type=int,
        default=3000,
        help="steps of each logging variant's paired run (logging at every other step)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smaller run: 50 steps (500 logging, 1000 paired), 3 rounds",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: temp)")
    args = parser.parse_args()
    steps, repeats, log_steps, paired_steps = (
        (50, 3, 500, 1000)
        if args.quick
        else (args.steps, args.repeats, args.log_steps, args.paired_steps)
    )
    base = Path(args.dir or tempfile.mkdtemp(prefix="substrax-loop-bench-"))
    try:
        table(measure(steps, repeats, base, log_steps, paired_steps))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
