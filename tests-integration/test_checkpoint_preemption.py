"""SIGTERM makes a training loop save its step and exit 0."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from substrax.checkpoint import OrbaxCheckpointStore


CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from substrax.checkpoint import OrbaxCheckpointStore, PreemptionHandler
    store = OrbaxCheckpointStore(sys.argv[1])
    with PreemptionHandler(store) as preemption:
        for step in range(10_000):
            w = np.full(8, step, np.float32)
            print(step, flush=True)
            time.sleep(0.02)
            preemption.check(step, lambda: {"model": {"w": w}}, metrics={"loss": 1.0 / (step + 1)})
    raise SystemExit(3)
    """
)


def test_sigterm_saves_and_exits_cleanly(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    seen = [int(child.stdout.readline()) for _ in range(6)]
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    last = max([*seen, *map(int, out.split())])
    with OrbaxCheckpointStore(directory) as store:
        assert store.list_steps() == [last]
        checkpoint = store.restore(last)
    assert checkpoint.metadata.extra == {"preempted": True}
    assert checkpoint.items["model"]["w"].tolist() == [float(last)] * 8
