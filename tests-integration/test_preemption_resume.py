"""End to end: a run SIGTERMed mid-way saves on the way out and a new process finishes it.

The resumed run must end with exactly the parameters, optimizer state, RNG state and
early-stopping state of a run that was never interrupted (8 emulated devices, data parallel).
The process that resumes runs that reference too, once it finished: the program's ``main`` again,
from scratch in a directory of its own (one interpreter less importing jax, flax and orbax).
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
from substrax.testing import json_objects


PROGRAM = Path(__file__).parent / "programs" / "resumable_training.py"
STEPS = 24
ENV = child_environment(JaxRuntime(platforms=("cpu",), cpu_devices=8))


def _resume_then_run_straight(out: Path, straight: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROGRAM), str(out), str(STEPS), "0", str(straight)],
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

    # a new process resumes, then runs the uninterrupted reference from scratch
    resumed = _resume_then_run_straight(interrupted, tmp_path / "straight")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.splitlines()[0]) == {"resumed_from": stopped_at}
    # then the reference ran from step 0: it found no checkpoint to resume from
    records = json_objects(resumed.stdout)
    assert [r for r in records if "resumed_from" in r] == [{"resumed_from": stopped_at}]
    assert any(r.get("step") == 0 for r in records)

    expected, actual = _final(tmp_path / "straight"), _final(interrupted)
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)
