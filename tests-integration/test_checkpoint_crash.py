"""A child saving in a loop is SIGKILLed at random moments; the store always stays readable."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

from substrax.checkpoint import OrbaxCheckpointStore


KILLS = 12  # kill -9 at 12 random moments, two stores at a time
LANES = 2

CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from substrax.checkpoint import OrbaxCheckpointStore
    with OrbaxCheckpointStore(sys.argv[1], max_to_keep=2) as store:
        step = (store.latest_step() or 0) + 1
        while True:
            w = np.arange(4096, dtype=np.float32) * step
            store.save(step, {"model": {"w": w}, "data_iterator": {"step": step}})
            print(step, flush=True)
            step += 1
    """
)


def _expected(step: int) -> np.ndarray:
    return np.arange(4096, dtype=np.float32) * step


def _kill_at_random(directory: Path, rng: random.Random) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout is not None
        child.stdout.readline()  # the first save of this run is in flight or done
        time.sleep(rng.uniform(0.0, 0.4))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()


def test_sigkill_never_breaks_the_store(tmp_path: Path) -> None:
    rng = random.Random(20)  # noqa: S311 - kill timings, not secrets
    directories = [tmp_path / f"lane{lane}" for lane in range(LANES)]
    latest_seen = dict.fromkeys(range(LANES), 0)
    for _ in range(KILLS // LANES):
        # each lane runs its own child; the lanes overlap to keep the test short
        threads = []
        for lane, directory in enumerate(directories):
            thread = threading.Thread(target=_kill_at_random, args=(directory, rng))
            thread.start()
            threads.append((lane, thread))
        for lane, thread in threads:
            thread.join()
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
