"""What a save leaves on disk when its process dies, and how its arrays are written (unsynced)."""

import signal
import subprocess
import sys
import textwrap
import time

import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

from substrax.checkpoint import OrbaxCheckpointStore
from substrax.checkpoint._checksums import unsynced


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
        following = steps[-1] + 1
        store.save(following, {"model": {"w": jnp.zeros(2)}})
        assert store.list_steps()[-1] == following
    assert not list(store_dir.glob("*.orbax-checkpoint-tmp*")), "the partial save was removed"


def test_array_files_are_written_without_fsync(store_dir, monkeypatch):
    from substrax.checkpoint import _array_writes

    contexts: list[ts.Context] = []
    write = _array_writes.write_arrays

    def recording(writes, **kwargs):
        contexts.extend(context for _, _, context in writes)
        return write(writes, **kwargs)

    monkeypatch.setattr(_array_writes, "write_arrays", recording)
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": {"w": jnp.ones((4, 4)), "b": jnp.ones(4)}})
        assert len(contexts) == 2
        assert contexts[0] is contexts[1], "one child context per save, shared by its arrays"
        assert contexts[0].spec.to_json() == {"file_io_sync": False}
        np.testing.assert_array_equal(store.restore(1).items["model"]["w"], np.ones((4, 4)))


def test_unsynced_inherits_everything_else_from_orbax_context():
    parent = ts.Context({"file_io_concurrency": {"limit": 3}})
    child = unsynced(parent)
    assert child.parent is parent
    assert child.spec.to_json() == {"file_io_sync": False}
    assert child["file_io_concurrency"] is parent["file_io_concurrency"]
