"""The metadata record's public helpers: the library versions a save records, and the check
that keeps ``extra`` off the record's own field names."""

import importlib.metadata

import numpy as np
import pytest

from substrax.checkpoint import (
    LIBRARY_NAMES,
    RESERVED_METADATA_KEYS,
    CheckpointMetadata,
    OrbaxCheckpointStore,
    check_extra,
    library_versions,
)


def test_library_versions_are_the_installed_ones_and_a_fresh_dict():
    versions = library_versions()
    assert set(versions) <= set(LIBRARY_NAMES)
    assert {"jax", "orbax-checkpoint", "numpy", "substrax-checkpoint"} <= set(versions)
    assert versions == {name: importlib.metadata.version(name) for name in versions}
    versions["jax"] = "0"
    assert library_versions()["jax"] == importlib.metadata.version("jax")


def test_a_save_records_the_library_versions(store_dir):
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, {"model": {"w": np.zeros(2, np.float32)}})
        assert dict(store.read_metadata(1).libraries) == library_versions()


@pytest.mark.parametrize("key", sorted(RESERVED_METADATA_KEYS))
def test_check_extra_refuses_every_reserved_key_by_name(key):
    with pytest.raises(ValueError, match=rf"extra keys \['{key}'\] are reserved") as error:
        check_extra({key: 1, "run": "a"})
    assert "rename them" in str(error.value)


def test_check_extra_accepts_other_keys_and_guards_the_record_and_the_store(store_dir):
    check_extra({"run": "a", "nonfinite_metrics": {}})
    with pytest.raises(ValueError, match=r"\['created_at', 'step'\]"):
        CheckpointMetadata(step=1, items=("model",), extra={"step": 2, "created_at": "x"})
    with OrbaxCheckpointStore(store_dir) as store, pytest.raises(ValueError, match="'epoch'"):
        store.save(1, {"model": {"w": np.zeros(2)}}, extra={"epoch": 3})
    with OrbaxCheckpointStore(store_dir) as store:
        assert store.list_steps() == []
