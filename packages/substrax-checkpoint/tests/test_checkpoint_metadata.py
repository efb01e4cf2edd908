"""The metadata record's public helpers: the library versions a save records, the check that
keeps ``extra`` off the record's own field names and to text JSON holds, and a record that does
not read back reported as the step's corruption."""

import importlib.metadata
import json
import os

import numpy as np
import pytest

from substrax.checkpoint import (
    LIBRARY_NAMES,
    RESERVED_METADATA_KEYS,
    CheckpointCorruptError,
    CheckpointMetadata,
    OrbaxCheckpointStore,
    Producer,
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


def _nested(depth: int) -> dict:
    extra: dict = {"leaf": 1}
    for _ in range(depth):
        extra = {"a": [extra]}
    return extra


def test_extra_nested_past_a_hundred_levels_is_refused_and_a_hundred_reads_back(store_dir):
    # 2000 levels raised a bare RecursionError from the check
    with pytest.raises(ValueError, match=r"^extra\['a'\]\[0\].*more than 100 levels deep"):
        check_extra(_nested(2000))
    with pytest.raises(ValueError, match="more than 100 levels deep"):
        check_extra(_nested(50))  # a mapping and a list a level, and the last: 101 containers
    deepest = {"x": _nested(49)}  # 100 containers, extra itself the first
    check_extra(deepest)
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": {"w": np.zeros(2)}}, extra=deepest)
        assert store.read_metadata(1).extra == deepest


def test_a_save_with_extra_that_json_cannot_hold_is_refused_and_writes_nothing(store_dir):
    # it used to succeed, and every read of the step then failed: the run could not resume
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        with pytest.raises(ValueError, match="nan, which JSON cannot hold"):
            store.save(3, {"model": {"w": np.zeros(2)}}, extra={"x": float("nan")})
        store.save(4, {"model": {"w": np.zeros(2)}}, extra={"x": "nan", "l": [1, 2.5, None]})
        assert store.list_steps() == [4]
        assert store.read_metadata(4).extra == {"x": "nan", "l": [1, 2.5, None]}


def test_check_extra_accepts_other_keys_and_guards_the_record_and_the_store(store_dir):
    check_extra({"run": "a", "nonfinite": {}})
    with pytest.raises(ValueError, match=r"\['created_at', 'step'\]"):
        CheckpointMetadata(step=1, items=("model",), extra={"step": 2, "created_at": "x"})
    with OrbaxCheckpointStore(store_dir) as store, pytest.raises(ValueError, match="'epoch'"):
        store.save(1, {"model": {"w": np.zeros(2)}}, extra={"epoch": 3})
    with OrbaxCheckpointStore(store_dir) as store:
        assert store.list_steps() == []


def test_check_extra_refuses_the_key_a_save_refuses_with_the_same_message(store_dir):
    # it passed check_extra, and the save it vouched for then refused it
    with pytest.raises(ValueError, match="'nonfinite_metrics' is where the store records") as seen:
        check_extra({"nonfinite_metrics": {"loss": "nan"}})
    with (
        OrbaxCheckpointStore(store_dir) as store,
        pytest.raises(ValueError, match="nonfinite") as saved,
    ):
        store.save(1, {"model": {"w": np.zeros(2)}}, extra={"nonfinite_metrics": {}})
    assert str(saved.value) == str(seen.value)
    record = CheckpointMetadata(step=1, items=("model",), extra={"nonfinite_metrics": {}})
    assert record.extra == {"nonfinite_metrics": {}}  # the record holds a save's own entry


def test_reserved_metadata_keys_holds_every_key_a_save_refuses_as_reserved(store_dir):
    """Hostile finding: the exported set lacked "nonfinite_metrics", which save refuses."""
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": {"w": np.zeros(2)}}, metrics={"loss": float("nan")})
        recorded = json.loads((store_dir / "1" / "metadata" / "metadata").read_text())
        own_extra = set(store.read_metadata(1).extra)  # what the save itself puts in extra
        candidates = {*recorded, *own_extra, *RESERVED_METADATA_KEYS, "loss", "run"}
        refused = set[str]()
        for key in sorted(candidates):
            try:
                store.save(2, {"model": {"w": np.zeros(2)}}, extra={key: 1})
            except ValueError as error:
                refused.add(key if "are reserved" in str(error) else f"{key}: {error}")
            else:
                store.delete(2)
    assert own_extra == {"nonfinite_metrics"}
    assert refused == RESERVED_METADATA_KEYS


def test_check_extra_refuses_a_tuple_which_would_read_back_as_a_list():
    with pytest.raises(TypeError, match=r"extra\['a'\]\['b'\] is a tuple, .* pass a list"):
        check_extra({"a": {"b": (1, 2)}})
    with pytest.raises(TypeError, match="is a tuple"):
        CheckpointMetadata(step=1, items=("model",), extra={"a": (1, 2)})
    check_extra({"a": {"b": [1, 2]}})


def test_check_extra_refuses_a_cycle_naming_it_and_takes_a_shared_list():
    loop: list[object] = [1]
    loop.append(loop)
    with pytest.raises(ValueError, match=r"extra\['a'\]\[1\] is extra\['a'\] itself: a cycle"):
        check_extra({"a": loop})
    table: dict[str, object] = {}
    table["self"] = {"up": table}
    with pytest.raises(ValueError, match=r"extra\['t'\]\['self'\]\['up'\] is extra\['t'\]"):
        check_extra({"t": table})
    shared = [1, 2]
    check_extra({"a": shared, "b": [shared, shared]})  # held twice, no cycle


def test_the_0_1_22_metadata_module_path_gives_the_same_names_and_warns():
    import substrax.checkpoint

    with pytest.warns(DeprecationWarning, match="use `from substrax.checkpoint import"):
        from substrax.checkpoint.metadata import (
            LIBRARY_NAMES as OLD_LIBRARY_NAMES,
            RESERVED_METADATA_KEYS as OLD_RESERVED,
        )
    assert OLD_LIBRARY_NAMES is substrax.checkpoint.LIBRARY_NAMES
    assert OLD_RESERVED is substrax.checkpoint.RESERVED_METADATA_KEYS


BAD_NAME = os.fsdecode(b"/data/shard-\xff.tfrecord")  # a file name that is not UTF-8: '\udcff'
ADVICE = r"lone surrogate .*os\.fsencode\(value\)\.decode\('utf-8', 'backslashreplace'\)"


@pytest.mark.parametrize(
    ("arguments", "where"),
    [
        ({"extra": {"files": [BAD_NAME]}}, r"extra\['files'\]\[0\]"),
        ({"extra": {"by_file": {BAD_NAME: 1}}}, r"a key of extra\['by_file'\]"),
        ({"metrics": {BAD_NAME: 0.5}}, "a metric name"),
        ({"metrics": {BAD_NAME: float("nan")}}, "a metric name"),  # recorded aside, in extra
        ({"items": {"model": {"w": np.zeros(2), "path": BAD_NAME}}}, "item 'model' leaf 'path'"),
        ({"items": {"model": {BAD_NAME: np.zeros(2)}}}, "the path of an item 'model' leaf"),
    ],
)
def test_a_lone_surrogate_is_refused_at_the_save_naming_where_it_is(store_dir, arguments, where):
    # it used to be saved: every read of the step then raised pydantic's ValidationError, and
    # retention could prune the steps that still read
    with OrbaxCheckpointStore(store_dir, async_save=False, max_to_keep=1) as store:
        store.save(1, {"model": {"w": np.ones(2)}}, metrics={"loss": 0.5})
        items = arguments.pop("items", {"model": {"w": np.zeros(2)}})
        with pytest.raises(ValueError, match=f"{where} is .*{ADVICE}"):
            store.save(2, items, **arguments)
        assert store.list_steps() == [1]
        assert store.restore(1).metadata.metrics == {"loss": 0.5}
        safe = os.fsencode(BAD_NAME).decode("utf-8", "backslashreplace")
        store.save(2, {"model": {"w": np.zeros(2)}}, extra={"files": [safe]})
        assert store.read_metadata(2).extra == {"files": ["/data/shard-\\xff.tfrecord"]}


@pytest.mark.parametrize("field", ["name", "version"])
def test_a_producer_with_a_lone_surrogate_is_refused_when_made(field):
    fields = {"name": "trainer", "version": "1.0", field: BAD_NAME}
    with pytest.raises(ValueError, match=rf"Producer\.{field} is .*{ADVICE}"):
        Producer(**fields)


@pytest.mark.parametrize(
    "change",
    [
        {"extra": {"shard": BAD_NAME}},  # what a save used to accept
        {"producer": {"name": BAD_NAME, "version": "1"}},
        {"metrics": {"loss": "low"}},
        {"step": -1},
    ],
    ids=["surrogate", "producer", "metric", "step"],
)
def test_a_metadata_record_that_does_not_read_back_is_corrupt_naming_step_and_file(
    store_dir, change
):
    with OrbaxCheckpointStore(store_dir, async_save=False, use_checksums=False) as store:
        store.save(1, {"model": {"w": np.zeros(2)}})
        store.save(2, {"model": {"w": np.ones(2)}})
    path = store_dir / "2" / "metadata" / "metadata"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        for read in (store.read_metadata, store.restore):
            with pytest.raises(CheckpointCorruptError) as error:
                read(2)
            assert (error.value.step, error.value.path, error.value.item) == (2, path, "metadata")
            assert "metadata record does not read back" in str(error.value)
            assert "pydantic" not in type(error.value).__module__
            str(error.value).encode()  # printable: no lone surrogate quoted
        assert store.restore(1).step == 1  # the recovery the guide shows


def test_a_producer_is_built_by_position_as_in_0_1_22():
    assert Producer("trainer", "1.2") == Producer(name="trainer", version="1.2")
