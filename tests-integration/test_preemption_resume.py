"""End to end: a run SIGTERMed mid-way saves on the way out and a new process finishes it.

The resumed run must end with exactly the parameters, optimizer state, RNG state and
early-stopping state of a run that was never interrupted (8 emulated devices, data parallel).
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from substrax.checkpoint import OrbaxCheckpointStore
from substrax.runtime import JaxRuntime, child_environment


PROGRAM = Path(__file__).parent / "programs" / "resumable_training.py"
STEPS = 24
ENV = child_environment(JaxRuntime(platforms=("cpu",), cpu_devices=8))


def _run(out: Path, step_seconds: float = 0.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROGRAM), str(out), str(STEPS), str(step_seconds)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _final(out: Path) -> dict[str, np.ndarray]:
    with np.load(out / "final-0.npz") as data:
        return {name: data[name] for name in data.files}


def test_sigterm_saves_and_a_new_process_resumes_to_the_same_state(tmp_path: Path) -> None:
    uninterrupted = _run(tmp_path / "straight")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]

    interrupted = tmp_path / "interrupted"
    child = subprocess.Popen(
        [sys.executable, str(PROGRAM), str(interrupted), str(STEPS), "0.2"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    deadline = time.monotonic() + 240
    for line in child.stdout:
        if json.loads(line).get("step") == 3:
            child.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() < deadline, "the run never reached step 3"
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr[-3000:]
    assert not (interrupted / "final-0.npz").exists()

    with OrbaxCheckpointStore(interrupted / "checkpoints") as store:
        stopped_at = store.latest_step()
        assert stopped_at is not None
        assert 3 <= stopped_at < STEPS - 1
        assert store.read_metadata(stopped_at).extra["preempted"] is True

    resumed = _run(interrupted)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.splitlines()[0]) == {"resumed_from": stopped_at}

    expected, actual = _final(tmp_path / "straight"), _final(interrupted)
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)
