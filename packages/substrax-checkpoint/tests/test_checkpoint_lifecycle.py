"""The open store's lifecycle (``_lifecycle``): its properties, the pending write finished by
``wait``, closing (idempotent, by a ``with`` block even when its body raises)."""

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
