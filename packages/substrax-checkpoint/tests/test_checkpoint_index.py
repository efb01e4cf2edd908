"""The step index: ``best_step`` from memory, reconciled with the directory, written atomically."""

import json
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import substrax.checkpoint._index as index_module
from substrax.checkpoint import OrbaxCheckpointStore
from substrax.checkpoint._index import INDEX_FILE


def test_best_step_reads_no_step_metadata(store_dir, monkeypatch):
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        for step in range(6):
            store.save(step, {"rng": {"s": step}}, metrics={"loss": float(10 - step)})

    def refuse(*args, **kwargs):
        raise AssertionError("best_step read a step's metadata")

    monkeypatch.setattr(index_module, "read_step", refuse)
    with OrbaxCheckpointStore(store_dir) as reopened:
        assert reopened.best_step("loss") == 5


@pytest.mark.parametrize("async_save", [False, True])
def test_an_index_that_cannot_be_written_never_fails_a_committed_save(
    store_dir, caplog, async_save
):
    """Hostile finding: a synchronous save on a disk that filled up after orbax committed the
    step raised the index write's OSError; the step was stored, and its retry was refused."""
    with OrbaxCheckpointStore(store_dir, max_to_keep=None, async_save=async_save) as store:
        store.save(1, {"rng": {"s": 1}}, metrics={"loss": 1.0})
        store.wait()
        (store_dir / INDEX_FILE).unlink()
        (store_dir / INDEX_FILE).mkdir()  # the index can no longer be written
        store.save(2, {"rng": {"s": 2}}, metrics={"loss": 0.5})
        store.wait()
        assert store.list_steps() == [1, 2]
    warned = [r.getMessage() for r in caplog.records if INDEX_FILE in r.getMessage()]
    assert warned
    assert "the steps are saved, and the index, a cache of their records" in warned[0]
    (store_dir / INDEX_FILE).rmdir()
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.best_step("loss") == 2


def test_index_is_reconciled_with_the_directory(store_dir):
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        for step in range(3):
            store.save(step, {"rng": {"s": step}}, metrics={"loss": float(step)})
    (store_dir / "substrax_index.json").write_text("{not json")
    shutil.rmtree(store_dir / "0")
    with OrbaxCheckpointStore(store_dir) as reopened:
        assert reopened.list_steps() == [1, 2]
        assert reopened.best_step("loss") == 1


def test_a_step_put_back_from_another_store_is_indexed_by_its_own_record(store_dir, tmp_path):
    """Hostile finding: a step directory replaced from a backup or another run kept the index's
    old metrics, so best_step named the wrong step and keep_best deleted the true best."""
    other = tmp_path / "other"
    for directory, losses in ((store_dir, (0.5, 0.1, 0.6)), (other, (0.5, 0.9, 0.6))):
        with OrbaxCheckpointStore(directory, max_to_keep=None) as store:
            for step, loss in enumerate(losses, start=1):
                store.save(step, {"model": {"w": np.full(2, loss)}}, metrics={"loss": loss})
    shutil.rmtree(store_dir / "2")
    shutil.copytree(other / "2", store_dir / "2")  # step 2 now holds loss 0.9
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.best_step("loss") == 1
    with OrbaxCheckpointStore(store_dir, max_to_keep=1, keep_best=1, best_metric="loss") as store:
        assert store.best_step("loss") == 1
        store.save(4, {"model": {"w": np.full(2, 0.7)}}, metrics={"loss": 0.7})
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1, 4]  # the true best kept, and the latest
        assert reader.restore(1).items["model"]["w"].tolist() == [0.5, 0.5]


def test_the_index_follows_saves_retention_and_deletes_on_disk(store_dir):
    def indexed():
        steps = json.loads((store_dir / INDEX_FILE).read_text())["steps"]
        for entry in steps.values():  # the identity of the record each entry was read from
            assert [type(n) for n in entry.pop("record")] == [int, int, int], entry
        return steps

    with OrbaxCheckpointStore(store_dir, max_to_keep=2, async_save=False) as store:
        for step in (1, 2, 3):
            store.save(step, {"model": {"w": np.zeros(2)}}, epoch=step, metrics={"loss": step})
        assert indexed() == {
            "2": {"epoch": 2, "metrics": {"loss": 2.0}},
            "3": {"epoch": 3, "metrics": {"loss": 3.0}},
        }
        store.delete(2)
        assert list(indexed()) == ["3"]
    # written through a temporary file renamed over the index: none is left beside it
    assert [p.name for p in store_dir.iterdir() if p.name.startswith(f".{INDEX_FILE}")] == []


def test_an_async_save_leaves_the_index_write_to_the_chores_thread_and_wait_finishes_it(
    store_dir, caplog
):
    def indexed():
        steps = json.loads((store_dir / INDEX_FILE).read_text())["steps"]
        for entry in steps.values():  # the identity of the record each entry was read from
            assert [type(n) for n in entry.pop("record")] == [int, int, int], entry
        return steps

    with OrbaxCheckpointStore(store_dir, max_to_keep=2) as store:
        for step in (1, 2, 3):
            store.save(step, {"model": {"w": np.zeros(2)}}, metrics={"loss": step})
        store.wait()
        assert sorted(indexed()) == ["2", "3"]
        (store_dir / INDEX_FILE).unlink()
        (store_dir / INDEX_FILE).mkdir()  # the next index write cannot rename over it
        store.save(4, {"model": {"w": np.zeros(2)}}, metrics={"loss": 4})
        with caplog.at_level("WARNING", logger="substrax.checkpoint"):
            store.wait()  # the failed write is told here, not lost on the chores thread
        assert "Is a directory" in caplog.text
        assert store.list_steps() == [3, 4]  # a cache that failed fails no committed save
        (store_dir / INDEX_FILE).rmdir()
        store.save(5, {"model": {"w": np.zeros(2)}}, metrics={"loss": 5})
    assert sorted(indexed()) == ["4", "5"]


# Saves steps 1 and 2, waits (the index holds both), overwrites step 2 with a better loss and
# waits until that step is committed on disk, without a ``save`` or ``wait`` after it: the
# parent kills it there with SIGKILL.
_OVERWRITER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import numpy as np
    from substrax.checkpoint import OrbaxCheckpointStore

    root = Path(sys.argv[1])
    store = OrbaxCheckpointStore(root, max_to_keep=None)
    state = {"model": {"w": np.zeros(4, np.float32)}}
    store.save(1, state, metrics={"loss": 0.5})
    store.save(2, state, metrics={"loss": 0.9})
    store.wait()
    store.save(2, state, metrics={"loss": 0.1}, overwrite=True)
    record = root / "2" / "metadata" / "metadata"
    while True:
        try:
            if json.loads(record.read_text())["metrics"] == {"loss": 0.1}:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    print("committed", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.usefixtures("child_processes")
def test_a_kill_after_an_overwrite_leaves_an_index_that_agrees_with_the_step_on_disk(store_dir):
    writer = subprocess.Popen(
        [sys.executable, "-c", _OVERWRITER, str(store_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "committed"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        if writer.stdout is not None:
            writer.stdout.close()
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.read_metadata(2).metrics == {"loss": 0.1}  # what step 2 holds on disk
        assert reader.best_step("loss") == 2
    policy = {"max_to_keep": 1, "keep_best": 1, "best_metric": "loss"}
    with OrbaxCheckpointStore(store_dir, **policy) as store:  # the resumed run
        assert store.best_step("loss") == 2
        store.save(3, {"model": {"w": np.ones(4, np.float32)}}, metrics={"loss": 0.7})
        store.wait()
        assert store.list_steps() == [2, 3]  # retention kept the step that holds the best loss
        assert store.read_metadata(2).metrics == {"loss": 0.1}
