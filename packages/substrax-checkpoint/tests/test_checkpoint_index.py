"""The step index: ``best_step`` from memory, reconciled with the directory, written atomically."""

import json
import shutil

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


def test_index_is_reconciled_with_the_directory(store_dir):
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        for step in range(3):
            store.save(step, {"rng": {"s": step}}, metrics={"loss": float(step)})
    (store_dir / "substrax_index.json").write_text("{not json")
    shutil.rmtree(store_dir / "0")
    with OrbaxCheckpointStore(store_dir) as reopened:
        assert reopened.list_steps() == [1, 2]
        assert reopened.best_step("loss") == 1


def test_the_index_follows_saves_retention_and_deletes_on_disk(store_dir):
    def indexed():
        return json.loads((store_dir / INDEX_FILE).read_text())["steps"]

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


def test_an_async_save_leaves_the_index_write_to_the_chores_thread_and_wait_finishes_it(store_dir):
    def indexed():
        return json.loads((store_dir / INDEX_FILE).read_text())["steps"]

    with OrbaxCheckpointStore(store_dir, max_to_keep=2) as store:
        for step in (1, 2, 3):
            store.save(step, {"model": {"w": np.zeros(2)}}, metrics={"loss": step})
        store.wait()
        assert sorted(indexed()) == ["2", "3"]
        (store_dir / INDEX_FILE).unlink()
        (store_dir / INDEX_FILE).mkdir()  # the next index write cannot rename over it
        store.save(4, {"model": {"w": np.zeros(2)}}, metrics={"loss": 4})
        with pytest.raises(IsADirectoryError):
            store.wait()  # the failed write is raised here, not lost on the chores thread
        (store_dir / INDEX_FILE).rmdir()
        store.save(5, {"model": {"w": np.zeros(2)}}, metrics={"loss": 5})
    assert sorted(indexed()) == ["4", "5"]
