import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

from substrax.checkpoint import OrbaxCheckpointStore
from substrax.checkpoint._durability import batched_sync, flush_tree, sync_filesystem, unsynced


linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="syncfs(2) exists on Linux only"
)


@linux_only
def test_a_local_directory_is_flushed_once_per_item(tmp_path: Path) -> None:
    assert batched_sync(tmp_path)
    sync_filesystem(tmp_path)


def test_a_missing_or_remote_directory_keeps_per_file_flushes(tmp_path: Path) -> None:
    assert not batched_sync(tmp_path / "missing")
    assert not batched_sync("gs://bucket/run")


def test_a_flush_that_cannot_open_its_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        sync_filesystem(tmp_path / "missing")


def test_the_per_file_fallback_flushes_every_file_and_directory(tmp_path: Path) -> None:
    (tmp_path / "tree.w" / "c").mkdir(parents=True)
    (tmp_path / "tree.w" / "c" / "0").write_bytes(b"chunk")
    (tmp_path / "tree.w" / "zarr.json").write_text("{}")
    flush_tree(tmp_path)
    assert (tmp_path / "tree.w" / "c" / "0").read_bytes() == b"chunk"


def test_the_unsynced_context_turns_only_the_flushes_off() -> None:
    parent = ts.Context({"cache_pool": {"total_bytes_limit": 1 << 20}})
    child = unsynced(parent)
    assert child["file_io_sync"].to_json() is False
    assert parent["file_io_sync"].to_json() is True
    assert child["cache_pool"].to_json() == {"total_bytes_limit": 1 << 20}
    assert unsynced(None)["file_io_sync"].to_json() is False


@pytest.mark.parametrize("async_save", [True, False])
def test_jax_arrays_written_with_one_flush_restore(tmp_path: Path, async_save: bool) -> None:
    state = {f"w{i}": jnp.full((64, 8), i, jnp.float32) for i in range(12)}
    state["count"] = jnp.int32(3)
    with OrbaxCheckpointStore(tmp_path, async_save=async_save) as store:
        store.save(1, {"model": state})
        store.save(2, {"model": state})
        store.wait()
        restored = store.restore(2).items["model"]
    assert sorted(restored) == sorted(state)
    for name, value in state.items():
        np.testing.assert_array_equal(restored[name], value)
