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


@pytest.mark.parametrize(
    ("extra", "error", "match"),
    [
        ({"x": float("nan")}, ValueError, r"extra\['x'\] is nan, which JSON cannot hold"),
        ({"a": {"b": [1, float("-inf")]}}, ValueError, r"extra\['a'\]\['b'\]\[1\] is -inf"),
        ({"obj": object()}, TypeError, r"extra\['obj'\] holds a value of type 'object'"),
        ({1: "x"}, TypeError, "extra has the key 1, not a str"),
        ({"a": {"": 1}}, ValueError, r"extra\['a'\] has an empty key"),
        (["a"], TypeError, "extra must be a mapping"),
    ],
)
def test_check_extra_refuses_what_would_not_read_back(extra, error, match):
    with pytest.raises(error, match=match):
        check_extra(extra)


def test_a_save_with_extra_that_json_cannot_hold_is_refused_and_writes_nothing(store_dir):
    # it used to succeed, and every read of the step then failed: the run could not resume
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        with pytest.raises(ValueError, match="nan, which JSON cannot hold"):
            store.save(3, {"model": {"w": np.zeros(2)}}, extra={"x": float("nan")})
        store.save(4, {"model": {"w": np.zeros(2)}}, extra={"x": "nan", "l": [1, 2.5, None]})
        assert store.list_steps() == [4]
        assert store.read_metadata(4).extra == {"x": "nan", "l": [1, 2.5, None]}


def test_check_extra_accepts_other_keys_and_guards_the_record_and_the_store(store_dir):
    check_extra({"run": "a", "nonfinite_metrics": {}})
    with pytest.raises(ValueError, match=r"\['created_at', 'step'\]"):
        CheckpointMetadata(step=1, items=("model",), extra={"step": 2, "created_at": "x"})
    with OrbaxCheckpointStore(store_dir) as store, pytest.raises(ValueError, match="'epoch'"):
        store.save(1, {"model": {"w": np.zeros(2)}}, extra={"epoch": 3})
    with OrbaxCheckpointStore(store_dir) as store:
        assert store.list_steps() == []


def test_the_0_1_22_metadata_module_path_gives_the_same_names_and_warns():
    import substrax.checkpoint

    with pytest.warns(DeprecationWarning, match="use `from substrax.checkpoint import"):
        from substrax.checkpoint.metadata import (
            LIBRARY_NAMES as OLD_LIBRARY_NAMES,
            RESERVED_METADATA_KEYS as OLD_RESERVED,
        )
    assert OLD_LIBRARY_NAMES is substrax.checkpoint.LIBRARY_NAMES
    assert OLD_RESERVED is substrax.checkpoint.RESERVED_METADATA_KEYS
