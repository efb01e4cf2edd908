"""What a save leaves on disk when its process dies: only whole steps, each with its manifest or none."""

import signal
import subprocess
import sys
import textwrap
import time

import jax.numpy as jnp
import numpy as np
import pytest

from substrax.checkpoint import OrbaxCheckpointStore


# saves step after step of arrays filled with their step number, until it is killed
SAVER = textwrap.dedent(
    """
    import sys
    import jax.numpy as jnp
    import numpy as np
    from substrax.checkpoint import OrbaxCheckpointStore

    store = OrbaxCheckpointStore(sys.argv[1], max_to_keep=2)
    for step in range(1, 100_000):
        state = {
            "w": jnp.full((256, 512), step, jnp.float32),
            "b": jnp.full((512,), step, jnp.float32),
            "n": np.int64(step),
        }
        store.save(step, {"model": state}, metrics={"loss": float(step)})
        if step == 3:
            print("saving", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.13, 0.37])
def test_a_writer_killed_mid_save_leaves_only_whole_steps(store_dir, delay):
    saver = subprocess.Popen(
        [sys.executable, "-c", SAVER, str(store_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert saver.stdout is not None
        assert saver.stdout.readline().strip() == "saving"
        time.sleep(delay)
    finally:
        saver.send_signal(signal.SIGKILL)
        saver.wait(timeout=30)
        if saver.stdout is not None:
            saver.stdout.close()
    with OrbaxCheckpointStore(store_dir) as store:  # the next writer: cleans, then reads
        steps = store.list_steps()
        assert steps, "the steps committed before the kill are listed"
        for step in steps:
            items = store.restore(step).items["model"]
            np.testing.assert_array_equal(np.asarray(items["w"]), np.full((256, 512), step))
            np.testing.assert_array_equal(np.asarray(items["b"]), np.full((512,), step))
            assert int(items["n"]) == step
            assert store.restore(step).verified or step == steps[-1], "only the last may lack it"
        following = steps[-1] + 1
        store.save(following, {"model": {"w": jnp.zeros(2)}})
        assert store.list_steps()[-1] == following
    assert not list(store_dir.glob("*.orbax-checkpoint-tmp*")), "the partial save was removed"
