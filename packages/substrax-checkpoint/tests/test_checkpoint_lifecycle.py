"""The open store's lifecycle (``_lifecycle``): its properties, the pending write finished by
``wait``, closing (idempotent, by a ``with`` block even when its body raises)."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from substrax.checkpoint import (
    CheckpointStoreClosedError,
    OrbaxCheckpointStore,
    RetentionPolicy,
)


def test_properties_name_the_absolute_directory_and_the_retention_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with OrbaxCheckpointStore("relative/store", max_to_keep=2, keep_every=10) as store:
        assert store.directory == tmp_path / "relative" / "store"
        assert store.directory.is_absolute()
        assert store.retention == RetentionPolicy(max_to_keep=2, keep_every=10)
        assert "relative/store" in repr(store)


def test_wait_commits_the_pending_write_for_readers(store_dir):
    with OrbaxCheckpointStore(store_dir) as writer:
        writer.wait()  # nothing pending: returns at once
        writer.save(4, {"model": {"w": np.arange(3, dtype=np.float32)}})
        writer.wait()
        assert (store_dir / "4").is_dir()
        with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
            assert reader.list_steps() == [4]
            assert reader.latest_step() == 4


def test_close_is_idempotent_and_ends_every_operation(store_dir):
    store = OrbaxCheckpointStore(store_dir, async_save=True)
    store.save(1, {"model": {"w": np.ones(2, np.float32)}})
    store.close()  # finishes the pending write first
    store.close()
    for call in (
        store.latest_step,
        lambda: store.wait_for_step(timeout=1.0),
        lambda: store.save(2, {"model": {"w": np.ones(2, np.float32)}}),
    ):
        with pytest.raises(CheckpointStoreClosedError):
            call()
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1]


def test_a_with_block_closes_the_store_even_when_its_body_raises(store_dir):
    store = OrbaxCheckpointStore(store_dir)

    def body() -> None:
        with store:
            store.save(1, {"model": {"w": np.ones(2, np.float32)}})
            raise KeyError("from the body")

    with pytest.raises(KeyError, match="from the body"):
        body()
    with pytest.raises(CheckpointStoreClosedError):
        store.list_steps()
    with OrbaxCheckpointStore(store_dir) as next_writer:  # the writer lock was released
        assert next_writer.list_steps() == [1]


# saves step 1, then step 2 asynchronously (its write held back a moment), and leaves the store
# unclosed: the program ends (falls off its end, raises, sys.exit) or drops the store ("del")
UNCLOSED = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import substrax.checkpoint._save as save_module
    from substrax.checkpoint import OrbaxCheckpointStore

    held = save_module.save_held

    def slow(*args):
        time.sleep(0.5)
        return held(*args)

    store = OrbaxCheckpointStore(sys.argv[1])
    store.save(1, {"model": {"w": np.ones(4, np.float32)}})
    store.wait()
    save_module.save_held = slow
    store.save(2, {"model": {"w": np.full(4, 2, np.float32)}}, metrics={"loss": 0.5})
    how = sys.argv[2]
    if how == "raise":
        raise RuntimeError("the training loop crashed")
    if how == "exit":
        sys.exit(3)
    if how == "del":
        del store
        print("dropped", flush=True)
    """
)


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("how", ["end", "raise", "exit", "del"])
def test_a_store_nobody_closed_finishes_its_write_or_warns_it_is_lost(store_dir, how):
    child = subprocess.run(
        [sys.executable, "-c", UNCLOSED, str(store_dir), how],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == {"raise": 1, "exit": 3}.get(how, 0), child.stderr
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        steps = reader.list_steps()
        assert all(reader.restore(step).verified for step in steps)
    if how == "del":  # dropped while the interpreter runs: the write finishes first
        assert steps == [1, 2]
        assert "dropped" in child.stdout
        assert "is lost" not in child.stderr
    else:  # an exiting interpreter starts no thread, and orbax's write needs new ones
        assert steps == [1]
        assert f"checkpoint step 2 in {store_dir} is lost" in child.stderr
        assert "call store.close()" in child.stderr
        # a hostile finding: the index's failed update printed two tracebacks before it
        assert "index after it" not in child.stderr
        if how != "raise":
            assert "Traceback" not in child.stderr
