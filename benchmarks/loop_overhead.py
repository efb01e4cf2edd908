"""What the plumbing costs inside a training loop: logging, checkpointing and callbacks per step.

Run: ``uv run python benchmarks/loop_overhead.py [--steps 100] [--log-steps 1000]
[--paired-steps 3000] [--repeats 5] [--sqlite] [--quick]`` (a full run takes about 12 minutes on
a 2-core machine at 20 ms a step; ``--quick`` about 4). One process on 1 CPU device
(``JAX_PLATFORMS=cpu``) trains an MLP 256-1024-1024-10 (batch 256, adam through
``optax.inject_hyperparams``, a 16 MB state with the optimizer's) with one
``substrax.spmd.TrainStep``, and times the same loop

* bare: the step, and its loss read to the host (every variant reads it, as a loop that watches
  its loss does, so the ratios are the plumbing's own cost);
* logging the loss every step: a ``FileLogger`` alone; a ``FileLogger`` and an ``MLFlowLogger``
  (in a ``MultiLogger``) talking to a real ``mlflow server`` that the benchmark starts on
  127.0.0.1 (SQLite backend store and artifacts in the temp dir) and always stops; a
  ``FileLogger`` and a ``WandbLogger`` in offline mode. With ``--sqlite``, also a ``FileLogger``
  and an ``MLFlowLogger`` on a SQLite file in the process (informational, no goal: what MLflow's
  SQL store costs when it runs under the training loop rather than in a server);
* with the store saving every 10 steps: ``OrbaxCheckpointStore`` (async, its defaults);
* with plain orbax saving every 10 steps: a ``CheckpointManager`` (async, its defaults);
* with every callback on: early stopping, plateau learning-rate reduction (both checked at each
  "epoch" of 50 steps), loss-spike detection, a progress bar (drawn into a buffer) and a
  ``CheckpointCallback`` saving to the store every 10 steps.

Loggers are made once, before any timed run, as a training script makes them before its loop;
their setup is timed apart and not counted per step. A run's time is its whole wall time, the
loggers' ``flush`` or the wait for pending saves at its end included, over its steps. The
variants run in rounds, each round in another order, so load drifts hit all alike; a variant's
overhead is the median over rounds of its time over the bare loop's of the same length in the
same round (logging runs are ``--log-steps`` long, against a bare run as long).

Whole runs differ by several percent on a shared machine, so each logging variant also gets a
paired run (``--paired-steps``): it logs at every other step, and a logged step is compared with
the unlogged step right after it (median difference, with a distribution-free 95% interval). The
logging goals are judged on that difference, plus what the few slow logging calls (the file log
writing its lines) take past the median call, plus the CPU per step of everything the logger runs
off the training thread on this machine, counted in full: its threads (the delivery thread,
which batches about every second, and W&B's own thread) and, for W&B, its service processes
(``wandb-core``). The MLflow server's CPU is printed apart and not counted: a server usually
runs on another machine (here it shares the cores, so whole runs feel it).

Goals: the file log every step at most 1% of the bare step; file + MLflow through a server every
step at most 2%; file + W&B offline every step at most 2%; the store's overhead no more than
plain orbax's. Beside the W&B logger runs its plain alternative, measured the same way: a thread
that calls W&B's ``run.log`` once a second with that second's rows (W&B's own cost of the rows). Figures of past runs are in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import itertools
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Benchmarks talk to no address but 127.0.0.1: MLflow would fetch its telemetry config at the
# first tracked call (the server started below inherits this too), and W&B runs offline, with no
# error reporting (wandb.init waits for W&B's servers otherwise).
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ.update(
    {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
    }
)
# The user's choice, as docs/guides/tracking.md advises for an MLflow server: no retries inside
# MLflow (the logger's delivery thread retries on its own) and 5 s per request. MLflow reads
# these at each request; they are set before MLflow is imported.
os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "5"

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
SERVER_BOOT_SECONDS = 240  # about 40 s on a quiet 2-core machine; minutes on a loaded one
BARE = "bare loop"
BARE_LONG = "bare loop, as long as a logging run"
FILE_LOG = "file log every step"
SERVER = "file + MLflow through a server, every step"
WANDB = "file + W&B offline, every step"
PLAIN_WANDB = "file + W&B offline by a plain thread, every step"
SQLITE = "file + MLflow on SQLite in the process, every step"
STORE = f"store saving every {EVERY} steps"
ORBAX = f"plain orbax saving every {EVERY} steps"
CALLBACKS = "every callback (checkpoint included)"
# Each logging variant's goal, as a share of the bare step (None: informational).
GOALS: dict[str, float | None] = {
    FILE_LOG: 0.01,
    SERVER: 0.02,
    WANDB: 0.02,
    PLAIN_WANDB: None,
    SQLITE: None,
}


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


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (Linux's ``/proc/PID/task/*/children``)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += map(int, (task / "children").read_text().split())
    return found


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children...), as they are now."""
    return [p for child in _children(pid) for p in (child, *_descendants(child))]


def _process_cpu(pid: int) -> float:
    """The CPU seconds process ``pid`` has used so far, all its threads (ended ones included).

    Read from the kernel's CPU clock of that process (the clock id ``clock_getcpuclockid``
    gives, in nanoseconds), not ``/proc/PID/stat``'s 10 ms ticks. 0 for a process that is gone.
    """
    try:
        return time.clock_gettime((~pid << 3) | 2)  # CPUCLOCK_SCHED of the whole process
    except OSError:
        return 0.0


def _tree_cpu(roots: list[int]) -> float:
    """The CPU seconds used so far by the processes ``roots`` and every process below them."""
    return sum(_process_cpu(p) for root in roots for p in (root, *_descendants(root)))


def _thread_cpu(clocks: dict[int, int]) -> dict[int, float]:
    """Each live thread's CPU seconds so far, by thread id (a thread that ended is left out)."""
    read: dict[int, float] = {}
    for ident, clock in clocks.items():
        with contextlib.suppress(OSError):
            read[ident] = time.clock_gettime(clock)
    return read


@dataclass
class Variant:
    """One way to run the loop: what happens after each step, and at the end of a run."""

    after: Callable[[int, float], None] = lambda _step, _loss: None
    end: Callable[[], None] = lambda: None
    close: Callable[[], None] = lambda: None
    times: list[float] = field(default_factory=list)  # seconds per step, one per round
    ends: list[float] = field(default_factory=list)  # seconds end() took, one per round
    setup: float = 0.0  # seconds to make the variant's objects, once, before any timed run
    threads: dict[int, int] = field(default_factory=dict)  # CPU clocks of its own threads, by id
    thread_cpu: list[float] = field(default_factory=list)  # their CPU seconds per step, per round
    helpers: list[int] = field(default_factory=list)  # processes it runs on this machine (W&B's)
    helper_cpu: list[float] = field(default_factory=list)  # their CPU seconds per step, per round
    server: int | None = None  # the process id of the server it talks to (elsewhere, usually)
    server_cpu: list[float] = field(default_factory=list)  # its CPU seconds per step, per round
    cpu: list[float] = field(default_factory=list)  # the process's CPU seconds per step, per round
    in_save: list[float] = field(default_factory=list)  # seconds the loop spent in save calls
    in_after: list[float] = field(
        default_factory=list
    )  # seconds per step spent in after(), per round
    paired: tuple[float, float, float] | None = None  # a logged step's extra seconds, 95% CI
    rare: float = 0.0  # seconds per logged step its slow calls (the flushes) take past the median

    def off_thread(self) -> float:
        """The median over rounds of the CPU seconds per step it uses off the training thread."""
        return statistics.median(
            t + h
            for t, h in zip(
                self.thread_cpu or [0.0] * len(self.times),
                self.helper_cpu or [0.0] * len(self.times),
                strict=True,
            )
        )


class MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 (a free port), SQLite store and artifacts in ``root``.

    It stays in the benchmark's process group, so whatever kills the group (``run_all.py``'s
    timeout) kills it too; :meth:`stop` ends it and the uvicorn process under it.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = root / "mlflow-server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "mlflow", "server"),
                    *("--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}"),
                    *("--artifacts-destination", str(self.root / "artifacts")),
                    *("--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.started = time.monotonic()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:  # noqa: S310 - 127.0.0.1
                return bool(response.status == 200)
        except OSError:
            return False

    def wait_ready(self, bound: float = SERVER_BOOT_SECONDS) -> float:
        """Wait until ``/health`` answers; return the seconds since :meth:`start`.

        Raises:
            RuntimeError: the server exited, or did not answer within ``bound`` seconds of its
                start (its log's tail is in the message).
        """
        assert self.process is not None, "start() first"
        while not self._healthy():
            code = self.process.poll()
            waited = time.monotonic() - self.started
            if code is not None or waited > bound:
                why = (
                    f"exited with status {code}" if code is not None else f"no answer in {bound} s"
                )
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"mlflow server on {self.uri}: {why}; its log ends:\n{tail}")
            time.sleep(0.25)
        return time.monotonic() - self.started

    def stop(self) -> None:
        """End the server (SIGTERM, which it passes to uvicorn), then kill what is left."""
        if self.process is None:
            return
        pids = [self.process.pid, *_descendants(self.process.pid)]
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=15)
        for pid in pids:  # uvicorn, or a CLI that did not end on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=15)
        self.process = None


class _PlainWandb:
    """The plain alternative to ``WandbLogger``: the step's loss kept in a list, and a thread that
    calls W&B's ``run.log`` once a second with that second's rows (reading each value there),
    what a hand-written logger does to keep W&B off the training thread. No spool, no retries.
    """

    def __init__(self, directory: Path) -> None:
        import wandb

        self.run = wandb.init(
            project="bench", dir=str(directory), mode="offline", reinit="create_new"
        )
        self.rows: list[tuple[int, object]] = []
        self.logged = self.sent = 0
        self.wanted = 0  # the rows a flush waits for: sent at once, not at the next second
        self.changed = threading.Condition()
        self.closing = False
        self.thread = threading.Thread(target=self._send, name="plain-wandb", daemon=True)
        self.thread.start()

    def log(self, step: int, loss: object) -> None:
        with self.changed:
            self.rows.append((step, loss))
            self.logged += 1

    def _send(self) -> None:
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.closing or self.sent < self.wanted, timeout=1.0)
                rows, self.rows = self.rows, []
                closing = self.closing
            for step, loss in rows:
                self.run.log({"loss": float(np.asarray(loss))}, step=step)
            with self.changed:
                self.sent += len(rows)
                self.changed.notify_all()
            if closing:
                return

    def flush(self) -> None:
        with self.changed:
            self.wanted = self.logged
            self.changed.notify_all()
            self.changed.wait_for(lambda: self.sent >= self.wanted)

    def close(self) -> None:
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        self.thread.join()
        self.run.finish()


def _logging(base: Path, kind: str, server: MlflowServer | None = None) -> Variant:
    """A ``FileLogger``, alone (``"file"``) or with an MLflow (``"server"``, ``"sqlite"``) or W&B
    (``"wandb"``) logger in a ``MultiLogger``, or with the plain W&B thread (``"plain-wandb"``),
    made before any timed run as a training script makes them before its loop.

    Their making (the run created on the server or in the database, ``wandb.init``) is timed on
    its own, as the variant's one-time setup. The threads and processes that appear while they
    are made are theirs: their CPU is accounted in the runs.
    """
    from substrax.tracking import FileLogger, Logger, MLFlowLogger, MultiLogger, WandbLogger

    if kind in ("server", "sqlite"):
        importlib.import_module("mlflow")  # the import is not the logger's setup
    if kind in ("wandb", "plain-wandb"):
        importlib.import_module("wandb")
    directory = base / f"log-{kind}"
    directory.mkdir(parents=True)
    threads = {t.ident for t in threading.enumerate()}
    children = set(_children(os.getpid()))
    started = time.perf_counter()
    loggers: list[Logger] = [FileLogger("bench", directory)]
    if kind == "server":
        assert server is not None
        loggers.append(MLFlowLogger("bench", tracking_uri=server.uri, log_dir=directory))
    elif kind == "sqlite":
        uri = f"sqlite:///{directory / 'mlflow.db'}"
        loggers.append(MLFlowLogger("bench", tracking_uri=uri, log_dir=directory))
    elif kind == "wandb":
        os.environ["WANDB_DIR"] = str(directory)
        loggers.append(WandbLogger("bench", project="bench", log_dir=directory))
    logger = MultiLogger(loggers)
    plain = _PlainWandb(directory) if kind == "plain-wandb" else None
    setup = time.perf_counter() - started
    clocks = {
        t.ident: time.pthread_getcpuclockid(t.ident)
        for t in threading.enumerate()
        if t.ident is not None and t.ident not in threads and t.is_alive()
    }
    # Each run counts its steps from 0; the loggers get steps that keep increasing across runs,
    # as a training run's do (W&B's history drops a row whose step is below one it holds).
    steps = itertools.count()
    if plain is not None:
        written = plain

        def after(_step: int, loss: float) -> None:
            step = next(steps)
            logger.log_scalar("loss", loss, step=step)
            written.log(step, loss)

        def end() -> None:
            logger.flush()
            written.flush()

        def close() -> None:
            logger.close()
            written.close()

        actions = (after, end, close)
    else:
        actions = (
            lambda _step, loss: logger.log_scalar("loss", loss, step=next(steps)),
            logger.flush,  # what was logged is delivered before the run counts as done
            logger.close,
        )
    return Variant(
        after=actions[0],
        end=actions[1],
        close=actions[2],
        setup=setup,
        threads=clocks,
        helpers=[p for p in _children(os.getpid()) if p not in children],  # W&B's service
        server=server.process.pid if kind == "server" and server and server.process else None,
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
    runs off the training thread (the delivery thread, W&B's service) is spread over both steps
    of a pair; its CPU is accounted apart.

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


def run(train: TrainStep[MLP], batch: dict[str, jax.Array], variant: Variant, count: int) -> float:
    """One timed run of ``count`` steps; returns its seconds per step and notes the rest."""
    threads = _thread_cpu(variant.threads)
    helpers = _tree_cpu(variant.helpers)
    served = _tree_cpu([variant.server] if variant.server else [])
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
    if variant.threads:
        now = _thread_cpu(variant.threads)
        used = sum(now[i] - threads[i] for i in now.keys() & threads.keys())
        variant.thread_cpu.append(used / count)
    if variant.helpers:
        variant.helper_cpu.append((_tree_cpu(variant.helpers) - helpers) / count)
    if variant.server:
        variant.server_cpu.append((_tree_cpu([variant.server]) - served) / count)
    return (done - start) / count


def warm_up(train: TrainStep[MLP], batch: dict[str, jax.Array], variant: Variant) -> None:
    """An untimed run: compile, open, the first save of each writer."""
    run(train, batch, variant, 2 * EVERY)
    for kept in (variant.ends, variant.in_after, variant.cpu, variant.in_save):
        kept.clear()
    for kept in (variant.thread_cpu, variant.helper_cpu, variant.server_cpu):
        kept.clear()


def measure(
    sizes: tuple[int, int, int, int], base: Path, server: MlflowServer, *, sqlite: bool
) -> dict[str, Variant]:
    """Every variant's runs: ``sizes`` is (steps, rounds, logging steps, paired steps)."""
    steps, repeats, log_steps, paired_steps = sizes
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
        f" {steps} steps per run ({log_steps} with logging, {paired_steps} paired), {repeats}"
        f" rounds; MLflow server at {server.uri}"
    )

    made: dict[str, Variant] = {}
    try:
        made[BARE] = Variant()
        made[BARE_LONG] = Variant()
        made[FILE_LOG] = _logging(base, "file")
        made[WANDB] = _logging(base, "wandb")
        made[PLAIN_WANDB] = _logging(base, "plain-wandb")
        # W&B's SDK thread and its service process serve both W&B runs: each variant counts them
        names = {t.ident: t.name for t in threading.enumerate()}
        made[PLAIN_WANDB].threads |= {
            ident: clock
            for ident, clock in made[WANDB].threads.items()
            if not names.get(ident, "").startswith("substrax-")
        }
        made[PLAIN_WANDB].helpers = made[WANDB].helpers
        if sqlite:
            made[SQLITE] = _logging(base, "sqlite")
        made[STORE] = _store(base, train)
        made[ORBAX] = _orbax(base, train)
        made[CALLBACKS] = _callbacks(base, train, steps * (repeats + 1))
        for variant in made.values():  # while the server boots
            warm_up(train, batch, variant)
        booted = server.wait_ready()
        print(f"the MLflow server answered /health {booted:.0f} s after its start")
        made[SERVER] = _logging(base, "server", server)
        warm_up(train, batch, made[SERVER])
        order = (
            BARE,
            BARE_LONG,
            FILE_LOG,
            SERVER,
            WANDB,
            PLAIN_WANDB,
            SQLITE,
            STORE,
            ORBAX,
            CALLBACKS,
        )
        variants = {name: made[name] for name in order if name in made}
        logging = [name for name in variants if name in GOALS]
        shuffle = random.Random(0)  # noqa: S311 - an order of runs, not a secret
        for _ in range(repeats):
            names = list(variants)
            shuffle.shuffle(names)
            for name in names:
                count = log_steps if name == BARE_LONG or name in logging else steps
                variants[name].times.append(run(train, batch, variants[name], count))
        for name in logging:
            variants[name].paired, variants[name].rare = paired_cost(
                train, batch, variants[name], paired_steps
            )
    finally:
        for variant in made.values():
            variant.close()
    return variants


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def table(variants: dict[str, Variant]) -> dict[str, float]:
    """Print the table; return each variant's median overhead over the bare loop."""
    logging = [name for name in variants if name in GOALS]

    def reference(name: str) -> list[float]:  # a bare run as long as the variant's
        return variants[BARE_LONG if name in logging else BARE].times

    overhead = {
        name: statistics.median(t / b - 1.0 for t, b in zip(v.times, reference(name), strict=True))
        for name, v in variants.items()
    }
    width = max(map(len, variants)) + 1
    print()
    print(f"{'loop':{width}} {'ms/step':>8} {'min':>7} {'max':>7} {'overhead':>9}")
    for name, variant in variants.items():
        print(
            f"{name:{width}} {statistics.median(variant.times) * 1e3:8.2f}"
            f" {min(variant.times) * 1e3:7.2f} {max(variant.times) * 1e3:7.2f}"
            f" {overhead[name]:+8.1%}"
        )
    print("(ms/step: median over rounds, the loggers' flush and the wait for pending saves")
    print(" included; overhead: median over rounds of the run's time over the bare loop's of the")
    print(" same length in the same round)")
    bare = statistics.median(variants[BARE].times)
    for name in logging:
        variant = variants[name]
        parts = [
            f"{name}: made once before the runs in {variant.setup * 1e3:.0f} ms (not in the"
            f" table); its flush at each run's end {statistics.median(variant.ends) * 1e3:.1f} ms"
            " (median, in the table); the logging calls themselves"
            f" {statistics.median(variant.in_after) * 1e3:.3f} ms per step on the training thread"
        ]
        if variant.thread_cpu:
            parts.append(
                f"its threads' CPU (delivery{', W&B' if name in (WANDB, PLAIN_WANDB) else ''})"
                f" {statistics.median(variant.thread_cpu) * 1e3:.3f} ms per step"
            )
        if variant.helper_cpu:
            parts.append(
                "its processes' CPU (W&B's service)"
                f" {statistics.median(variant.helper_cpu) * 1e3:.3f} ms per step"
            )
        print("; ".join(parts))
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
    costs: dict[str, float] = {}
    for name in logging:
        variant = variants[name]
        assert variant.paired is not None  # measure() pairs every logging variant
        median, low, high = variant.paired
        background = variant.off_thread()
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
    served = statistics.median(variants[SERVER].server_cpu)
    print(
        f"the MLflow server's own CPU: {served * 1e3:.3f} ms per step ({served / bare:.2%} of the"
        " bare step), not in the goal: a tracking server usually runs on another machine; here"
        " it shares this machine's cores, so the whole-run figures feel it"
    )
    store, orbax = overhead[STORE], overhead[ORBAX]
    print("goals:")
    for name in logging:
        cost, goal = costs[name], GOALS[name]
        against = {
            SQLITE: f"through a server {costs[SERVER]:+.2%}",
            PLAIN_WANDB: f"the plain alternative to the W&B logger's {costs[WANDB]:+.2%}",
        }
        judged = (
            f"informational, no goal; {against[name]}" if goal is None else _verdict(cost <= goal)
        )
        print(
            f"  {name}"
            + ("" if goal is None else f" <= {goal:.0%} of step time")
            + f": {cost:+.2%} paired, with its rare calls and its CPU off the training thread"
            f" ({judged}; whole runs: {overhead[name]:+.2%})"
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
    parser.add_argument("--repeats", type=int, default=5, help="rounds of every variant")
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
        "--sqlite",
        action="store_true",
        help="also file + MLflow on SQLite in the process (informational; about 3 minutes more)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smaller run: 50 steps (500 logging, 1000 paired), 3 rounds",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: temp)")
    args = parser.parse_args()
    sizes = (
        (50, 3, 500, 1000)
        if args.quick
        else (args.steps, args.repeats, args.log_steps, args.paired_steps)
    )
    if min(sizes) < 1 or sizes[3] < 2:
        parser.error("every size must be at least 1, --paired-steps at least 2")
    started = time.monotonic()
    base = Path(args.dir or tempfile.mkdtemp(prefix="substrax-loop-bench-"))
    server = MlflowServer(base / "mlflow-server")

    def stop_on_sigterm(signum: int, _frame: object) -> None:
        # An exception raised here can land in a callback that drops it (jax's gc callback):
        # stop the server and leave at once instead.
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        server.start()  # it boots (about 40 s) while the other variants warm up
        table(measure(sizes, base, server, sqlite=args.sqlite))
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(f"({time.monotonic() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
