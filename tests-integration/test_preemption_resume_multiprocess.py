"""End to end across two ``jax.distributed`` processes: SIGTERM both, save together, resume.

Each process has 4 emulated CPU devices (8 global, data parallel, gloo collectives). Both
processes of a run are SIGTERMed at different moments mid-run; both must save the same step
and exit 0, and a new pair of processes must resume from it and end with exactly the
parameters, optimizer state, RNG state and early-stopping state of an uninterrupted pair. The
resuming pair runs that reference too, once it finished: the program's ``main`` again, from
scratch in a directory of its own (two interpreters less importing jax, flax and orbax).
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import numpy as np

from substrax.checkpoint import OrbaxCheckpointStore
from substrax.testing import free_port, json_objects


PROGRAM = Path(__file__).parent / "programs" / "resumable_training.py"
STEPS = 16
STEP_SECONDS = 0.25
TIMEOUT_S = 120
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))},
    "JAX_PLATFORMS": "cpu",
    "JAX_NUM_CPU_DEVICES": "4",
}


def _start(
    out: Path,
    step_seconds: float,
    started: list[subprocess.Popen[str]],
    *,
    then_straight: Path | None = None,
) -> list[subprocess.Popen[str]]:
    out.mkdir(parents=True, exist_ok=True)
    if then_straight is None:
        argv = [sys.executable, str(PROGRAM), str(out), str(STEPS), str(step_seconds)]
    else:
        then_straight.mkdir(parents=True, exist_ok=True)
        # initialize_distributed, called again with the same launcher variables, is a no-op
        argv = [sys.executable, str(PROGRAM), str(out), str(STEPS), "0", str(then_straight)]
    coordinator = f"127.0.0.1:{free_port()}"
    pair = []
    for pid in range(2):
        launcher = {
            "JAX_COORDINATOR_ADDRESS": coordinator,
            "JAX_NUM_PROCESSES": "2",
            "JAX_PROCESS_ID": str(pid),
        }
        with (out / f"stderr-{pid}.log").open("a") as stderr:
            pair.append(
                subprocess.Popen(
                    argv,
                    env=ENV | launcher,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
            )
    started.extend(pair)
    return pair


def _records(lines: list[str]) -> list[dict[str, object]]:
    """The JSON lines of a child's stdout; gloo prints its connection notes there too."""
    return json_objects("\n".join(lines))


def _next_step(stdout: IO[str], seen: list[str], at_least: int) -> None:
    """Read ``stdout`` until a step >= ``at_least`` is printed (or the pipe closes)."""
    for line in stdout:
        seen.append(line)
        records = _records([line])
        if records and int(records[0].get("step", -1)) >= at_least:  # type: ignore[arg-type]
            return


def _finish(
    pair: list[subprocess.Popen[str]],
    out: Path,
    seen: list[list[str]] | None = None,
    *,
    signalled_late: int | None = None,
) -> list[list[str]]:
    """Wait for a pair; both must exit 0.

    ``signalled_late`` names a process whose SIGTERM may land after it saved and left the
    handler, while jax tears down its distributed client (which puts back the default
    disposition): dying of that signal then is allowed, once the process said it stopped.
    """
    lines = seen or [[], []]
    for pid, proc in enumerate(pair):
        stdout, _ = proc.communicate(timeout=TIMEOUT_S)
        lines[pid].extend(stdout.splitlines(keepends=True))
        stderr = (out / f"stderr-{pid}.log").read_text()
        stopped = any("stopped" in record for record in _records(lines[pid]))
        if pid == signalled_late and proc.returncode == -signal.SIGTERM and stopped:
            continue
        assert proc.returncode == 0, f"process {pid} exited {proc.returncode}:\n{stderr[-3000:]}"
    return lines


def _final(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def test_both_processes_sigtermed_save_one_step_and_a_new_pair_resumes_it(tmp_path: Path) -> None:
    started: list[subprocess.Popen[str]] = []
    watchdog = threading.Timer(2 * TIMEOUT_S, lambda: [p.kill() for p in started])
    watchdog.start()
    try:
        interrupted_dir = tmp_path / "interrupted"
        interrupted = _start(interrupted_dir, STEP_SECONDS, started)
        seen: list[list[str]] = [[], []]
        assert interrupted[0].stdout is not None
        assert interrupted[1].stdout is not None
        _next_step(interrupted[0].stdout, seen[0], at_least=3)
        interrupted[0].send_signal(signal.SIGTERM)
        # process 1's own signal comes two steps' time later: past the step boundary where
        # process 0 stops, so only the agreement can stop process 1 there too (without it,
        # process 1 would enter the next step's collective while process 0 saves, and hang)
        time.sleep(2 * STEP_SECONDS)
        interrupted[1].send_signal(signal.SIGTERM)  # absorbed if it is already saving
        _finish(interrupted, interrupted_dir, seen, signalled_late=1)

        assert not list(interrupted_dir.glob("final-*.npz"))
        with OrbaxCheckpointStore(interrupted_dir / "checkpoints") as store:
            stopped_at = store.latest_step()
            assert stopped_at is not None
            assert 3 <= stopped_at < STEPS - 1
            assert store.read_metadata(stopped_at).extra["preempted"] is True
        ends = [_records(lines)[-2:] for lines in seen]
        for pid in range(2):  # each process trained up to the saved step and no further
            assert ends[pid][0]["step"] == stopped_at
            assert ends[pid][1]["stopped"] == stopped_at
        assert ends[0][1]["signalled"] is True

        # a new pair resumes, then runs the uninterrupted reference from scratch
        straight = tmp_path / "straight"
        resuming = _start(interrupted_dir, 0.0, started, then_straight=straight)
        resumed = _finish(resuming, interrupted_dir)
        for pid in range(2):
            records = _records(resumed[pid])
            assert records[0] == {"resumed_from": stopped_at}
            # then the reference ran from step 0: it found no checkpoint to resume from
            assert [r for r in records if "resumed_from" in r] == [records[0]]
            assert any(r.get("step") == 0 for r in records)

        expected = _final(straight / "final-0.npz")
        for pid in range(2):
            actual = _final(interrupted_dir / f"final-{pid}.npz")
            assert expected.keys() == actual.keys()
            for name in expected:
                np.testing.assert_array_equal(
                    actual[name], expected[name], err_msg=f"{pid}: {name}"
                )
    finally:
        watchdog.cancel()
        for proc in started:
            if proc.poll() is None:  # a peer that never arrived or a hung pair: stop it
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
