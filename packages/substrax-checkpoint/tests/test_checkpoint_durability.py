"""What a save leaves on disk when its process dies: only whole steps, each with its manifest or none."""

import json
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


@pytest.mark.usefixtures("child_processes")
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


# commits step 2, then is killed as it writes the step's manifest: its temporary file left behind
KILLED_BEFORE_MANIFEST = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import substrax.checkpoint._save as save_module
    from substrax.checkpoint import OrbaxCheckpointStore

    def killed(step_dir):
        (step_dir / ".substrax_manifest.json.5eed.tmp").write_text('{"format": 1, "fi')
        os.kill(os.getpid(), signal.SIGKILL)

    store = OrbaxCheckpointStore(sys.argv[1], async_save=False)
    store.save(1, {"model": {"w": np.arange(3.0)}})
    save_module.write_manifest = killed
    store.save(2, {"model": {"w": np.arange(3.0) + 2}})
    """
)


@pytest.mark.usefixtures("child_processes")
def test_a_step_killed_before_its_manifest_stays_unverified_and_its_leftover_goes(
    store_dir, monkeypatch, caplog, capsys
):
    from substrax.checkpoint import _manifest
    from substrax.checkpoint._cli import main

    killed = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_MANIFEST, str(store_dir)], timeout=120, check=False
    )
    assert killed.returncode == -signal.SIGKILL
    leftover = store_dir / "2" / f".{_manifest.MANIFEST_FILE}.5eed.tmp"
    assert leftover.exists()
    assert not (store_dir / "2" / _manifest.MANIFEST_FILE).exists()
    monkeypatch.setattr(_manifest, "MANIFEST_WAIT", 0.3)  # the manifest never comes
    with caplog.at_level("INFO"), OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.restore(1).verified
        late = reader.restore(2)
        assert not late.verified
        np.testing.assert_array_equal(late.items["model"]["w"], np.arange(3.0) + 2)
    assert "restored unverified" in caplog.text
    assert leftover.exists(), "a reader removes nothing"
    with OrbaxCheckpointStore(store_dir) as writer:  # the next writer tidies up
        assert not leftover.exists()
        assert sorted(p.name for p in store_dir.iterdir() if p.name.startswith(".substrax-m")) == []
        assert not writer.restore(2).verified
    assert not (store_dir / "2" / _manifest.MANIFEST_FILE).exists(), "never sealed after the fact"
    capsys.readouterr()
    assert main(["verify", "--json", str(store_dir)]) == 0
    assert [row["status"] for row in json.loads(capsys.readouterr().out)] == ["ok", "unverified"]


# saves steps 1 and 2, then overwrites step 2 and is killed: before the new step 2 is committed
# ("before"), or once it is, as its manifest is written ("after")
KILLED_MID_OVERWRITE = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import substrax.checkpoint._save as save_module
    from substrax.checkpoint import OrbaxCheckpointStore

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    store = OrbaxCheckpointStore(sys.argv[1], max_to_keep=None)
    for step in (1, 2):
        store.save(step, {"model": {"w": np.full(3, step, np.float32)}}, metrics={"loss": step})
    store.wait()
    if sys.argv[2] == "before":
        save_module.save_held = killed
    else:
        save_module.write_manifest = killed
    store.save(2, {"model": {"w": np.full(3, 9, np.float32)}}, metrics={"loss": 0.1}, overwrite=True)
    store.wait()
    """
)


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize(("killed", "value", "loss"), [("before", 2, 2.0), ("after", 9, 0.1)])
def test_a_writer_killed_mid_overwrite_leaves_the_old_step_or_the_new_one(
    store_dir, killed, value, loss, caplog
):
    child = subprocess.run(
        [sys.executable, "-c", KILLED_MID_OVERWRITE, str(store_dir), killed],
        timeout=120,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL
    with caplog.at_level("WARNING"), OrbaxCheckpointStore(store_dir) as store:  # the next writer
        assert store.list_steps() == [1, 2]
        checkpoint = store.restore(2)
        np.testing.assert_array_equal(checkpoint.items["model"]["w"], np.full(3, value))
        assert checkpoint.metadata.metrics == {"loss": loss}
        assert store.best_step("loss") == (2 if killed == "after" else 1)
    assert ("the step it was replacing is back in place" in caplog.text) == (killed == "before")
    assert not list((store_dir / ".substrax-replaced").iterdir())
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.best_step("loss") == (2 if killed == "after" else 1)
