"""A child saving in a loop is SIGKILLed at random moments; the store always stays readable."""

import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from substrax.checkpoint import OrbaxCheckpointStore


KILLS = 12  # kill -9 at 12 random moments, two stores at a time
LANES = 2

# Each lane's children are forked from one interpreter that imported numpy and substrax (jax,
# orbax) once and never opened a store, so no thread of jax or orbax exists to be forked. For
# each directory read on stdin it forks a child that opens the store and saves in a loop,
# printing each step once save() returned, until it is SIGKILLed (also when this interpreter
# dies); then it prints "exited <code>" once it has reaped the child. It ends at end of input.
FORKER = textwrap.dedent(
    """
    import ctypes, os, sys
    import numpy as np
    from substrax.checkpoint import OrbaxCheckpointStore
    print("ready", flush=True)
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG: SIGKILLed if the forker dies
            with OrbaxCheckpointStore(line.strip(), max_to_keep=2) as store:
                step = (store.latest_step() or 0) + 1
                while True:
                    w = np.arange(4096, dtype=np.float32) * step
                    store.save(step, {"model": {"w": w}, "data_iterator": {"step": step}})
                    print(os.getpid(), step, flush=True)
                    step += 1
        _, status = os.waitpid(pid, 0)
        print("exited", os.waitstatus_to_exitcode(status), flush=True)
    """
)


@contextmanager
def _forker() -> Iterator["subprocess.Popen[str]"]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
    with tempfile.TemporaryFile("w+") as errors:
        forker = subprocess.Popen(
            [sys.executable, "-c", FORKER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        try:
            assert forker.stdout is not None
            if forker.stdout.readline() != "ready\n":
                forker.wait(timeout=30)
                errors.seek(0)
                raise AssertionError(f"the forker failed to start:\n{errors.read()[-3000:]}")
            yield forker
        finally:
            forker.kill()  # its child, if one is left, is SIGKILLed with it
            forker.communicate(timeout=30)


def _expected(step: int) -> np.ndarray:
    return np.arange(4096, dtype=np.float32) * step


def _kill_at_random(forker: "subprocess.Popen[str]", directory: Path, rng: random.Random) -> None:
    assert forker.stdin is not None
    assert forker.stdout is not None
    forker.stdin.write(f"{directory}\n")
    forker.stdin.flush()
    first = forker.stdout.readline().split()  # the first save of this run is in flight or done
    # a child that ended before its first save says "exited N": fail now, never wait on it
    assert first[:1] != ["exited"], f"the saving child ended early: {first}"
    assert len(first) == 2, first
    # a save returns once the write before it is committed: after the second, the store holds
    # a step even on a lane's first run (a loaded machine took longer than the random wait)
    second = forker.stdout.readline().split()
    assert second[:1] != ["exited"], f"the saving child ended early: {second}"
    assert len(second) == 2, second
    time.sleep(rng.uniform(0.0, 0.4))
    os.kill(int(first[0]), signal.SIGKILL)
    while not (line := forker.stdout.readline()).startswith("exited"):
        assert line, "the forker ended early"
    assert line.split() == ["exited", str(-signal.SIGKILL)]


def test_sigkill_never_breaks_the_store(tmp_path: Path) -> None:
    rng = random.Random(20)  # noqa: S311 - kill timings, not secrets
    directories = [tmp_path / f"lane{lane}" for lane in range(LANES)]
    latest_seen = dict.fromkeys(range(LANES), 0)
    # the forkers are killed first on a failure: a lane still reading from one then ends
    with ThreadPoolExecutor(LANES) as lanes, _forker() as first, _forker() as second:
        forkers = [first, second]
        for _ in range(KILLS // LANES):
            # each lane runs its own child; the lanes overlap to keep the test short
            kills = [
                lanes.submit(_kill_at_random, forkers[lane], directory, rng)
                for lane, directory in enumerate(directories)
            ]
            for lane, kill in enumerate(kills):
                kill.result()  # raises what failed in the lane
                with OrbaxCheckpointStore(directories[lane]) as store:
                    latest = store.latest_step()
                    assert latest is not None
                    assert latest >= latest_seen[lane]
                    checkpoint = store.restore(latest)
                    w = np.asarray(checkpoint.items["model"]["w"])
                    assert w.tobytes() == _expected(latest).tobytes()
                    assert checkpoint.items["data_iterator"] == {"step": latest}
                    assert not [p for p in directories[lane].iterdir() if "tmp" in p.name]
                    latest_seen[lane] = latest
