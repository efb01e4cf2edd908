"""Damaged steps: missing or empty chunk files and a damaged dtypes record are
``CheckpointCorruptError`` naming the leaf; ``verify`` also compares the dtypes record with the
arrays' own metadata."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from substrax.checkpoint import CheckpointCorruptError, OrbaxCheckpointStore
from substrax.checkpoint._cli import main


# orbax's reader may leave a callback for its asyncio loop behind when a damaged file fails a
# read, and the loop is closed before it runs (seen on CI): these tests check the error the store
# raises, not orbax's clean-up
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _items() -> dict[str, dict[str, object]]:
    return {
        "model": {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64)},
        "data_iterator": {"order": np.arange(1000, dtype=np.int64), "pos": np.int64(7)},
    }


def _save(directory: Path, **options: bool) -> None:
    options = {"use_ocdbt": False, **options}  # one directory per array: its files are named
    with OrbaxCheckpointStore(directory, async_save=False, max_to_keep=None, **options) as store:
        store.save(1, _items())
        store.save(2, _items())


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``pristine(**options)``: a store ``_save`` wrote with ``options``, once per module."""
    made: dict[tuple[tuple[str, bool], ...], Path] = {}

    def path(**options: bool) -> Path:
        key = tuple(sorted(options.items()))
        if key not in made:
            made[key] = tmp_path_factory.mktemp("pristine") / "store"
            _save(made[key], **options)
        return made[key]

    return path


@pytest.fixture
def saved(pristine: Callable[..., Path], store_dir: Path) -> Callable[..., Path]:
    """``saved(**options)``: ``store_dir``, holding steps 1 and 2 as ``_save(store_dir,
    **options)`` writes them (a copy of the module's own: each test damages its copy)."""

    def copy(**options: bool) -> Path:
        shutil.copytree(pristine(**options), store_dir)
        return store_dir

    return copy


def _largest_chunk_file(array_dir: Path) -> Path:
    files = [p for p in array_dir.rglob("*") if p.is_file() and p.name != "zarr.json"]
    return max(files, key=lambda p: p.stat().st_size)


def _verify_rows(directory: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["verify", "--json", str(directory)])
    return code, {row["step"]: row for row in json.loads(capsys.readouterr().out)}


@pytest.mark.parametrize("compression", [False, True], ids=["plain", "compressed"])
@pytest.mark.parametrize("damage", ["missing", "empty"])
@pytest.mark.parametrize("where", ["model/w", "data_iterator/order", "data_iterator/pos"])
def test_a_missing_or_empty_chunk_file_is_corrupt_naming_the_leaf(
    saved, capsys, compression, damage, where
):
    item, leaf = where.split("/")
    store_dir = saved(use_compression=compression)
    chunk = _largest_chunk_file(store_dir / "2" / item / f"tree.{leaf}")
    if damage == "missing":
        chunk.unlink()
    else:
        chunk.write_bytes(b"")
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        with pytest.raises(CheckpointCorruptError) as error:
            store.restore(2)
        assert (error.value.step, error.value.item, error.value.leaf) == (2, item, leaf)
        assert store.restore(1).step == 1  # the step before still restores
    code, rows = _verify_rows(store_dir, capsys)
    assert code == 1
    assert rows[1]["ok"]
    assert (rows[2]["status"], rows[2]["item"], rows[2]["leaf"]) == ("FAILED", item, leaf)


def test_a_missing_array_metadata_file_names_the_leaf(saved):
    store_dir = saved()
    (store_dir / "2" / "model" / "tree.w" / "zarr.json").unlink()
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        for read in (store.restore, store.describe):
            with pytest.raises(CheckpointCorruptError) as error:
                read(2)
            assert (error.value.step, error.value.item, error.value.leaf) == (2, "model", "w")


@pytest.mark.parametrize("damage", ["missing", "empty", "not_json", "not_an_object"])
def test_a_damaged_dtypes_record_is_corrupt(saved, capsys, damage):
    store_dir = saved()
    record = store_dir / "2" / "dtypes" / "metadata"
    if damage == "missing":
        record.unlink()
    else:
        record.write_text(
            {"empty": "", "not_json": '{"model": {"w"', "not_an_object": "[1]"}[damage]
        )
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        with pytest.raises(CheckpointCorruptError) as error:
            store.restore(2, cast_dtypes=True)
        assert (error.value.step, error.value.item, error.value.path) == (2, "dtypes", record)
        assert "cast_dtypes" not in str(error.value)
        assert store.read_metadata(2).step == 2  # listing and metadata still work
    code, rows = _verify_rows(store_dir, capsys)
    assert code == 1
    assert [(f["item"], f["leaf"]) for f in rows[2]["failures"]] == [("dtypes", "<root>")]


def test_a_step_without_a_dtypes_item_restores_as_before(saved):
    store_dir = saved()
    for path in sorted((store_dir / "2" / "dtypes").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (store_dir / "2" / "dtypes").rmdir()
    (store_dir / "2" / "substrax_manifest.json").unlink()  # as written before both existed
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        restored = store.restore(2, cast_dtypes=True).items
    np.testing.assert_array_equal(
        np.asarray(restored["model"]["w"]), np.asarray(_items()["model"]["w"])
    )


@pytest.mark.parametrize("edited", ["array_metadata", "dtypes_record"])
def test_verify_fails_a_leaf_whose_recorded_dtype_disagrees_with_its_array(saved, capsys, edited):
    store_dir = saved()
    if edited == "array_metadata":
        path = store_dir / "2" / "data_iterator" / "tree.order" / "zarr.json"
        metadata = json.loads(path.read_text())
        metadata["data_type"] = "uint64"
    else:
        path = store_dir / "2" / "dtypes" / "metadata"
        metadata = json.loads(path.read_text())
        metadata["data_iterator"]["order"] = "int32"
    path.write_text(json.dumps(metadata))
    (store_dir / "2" / "substrax_manifest.json").unlink()  # else the manifest names the file
    code, rows = _verify_rows(store_dir, capsys)
    assert code == 1
    assert rows[1]["ok"]
    failures = rows[2]["failures"]
    assert [(f["item"], f["leaf"]) for f in failures] == [("data_iterator", "order")]
    assert "dtypes record says" in failures[0]["error"]


_DAMAGED_FILES = {
    "sharding": ("model", "_sharding", "<root>"),
    "tree_metadata": ("model", "_METADATA", "<root>"),
    "array_metadata": ("model", "tree.w/zarr.json", "w"),
    "host_array_metadata": ("data_iterator", "tree.order/zarr.json", "order"),
}


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '"text"', "{}"])
@pytest.mark.parametrize("damaged", list(_DAMAGED_FILES))
def test_a_damaged_metadata_file_is_corrupt_naming_the_file(saved, capsys, damaged, content):
    item, name, leaf = _DAMAGED_FILES[damaged]
    store_dir = saved()
    path = store_dir / "2" / item / name
    path.write_text(content)
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        for read in (store.restore, store.describe):
            with pytest.raises(CheckpointCorruptError) as error:
                read(2)
            assert (error.value.step, error.value.item, error.value.path) == (2, item, path)
            assert error.value.leaf in (leaf, "w")  # orbax names the first leaf for _sharding
            assert str(path) in str(error.value)
        assert store.restore(1).step == 1
    code, rows = _verify_rows(store_dir, capsys)
    assert code == 1
    assert rows[1]["ok"]
    assert not rows[2]["ok"]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "{}"])
def test_verify_fails_a_step_whose_array_metadatas_file_is_damaged(saved, capsys, content):
    # orbax reads this file only when it writes a step: restores never need it, verify says so
    store_dir = saved()
    path = store_dir / "2" / "model" / "array_metadatas" / "process_0"
    path.write_text(content)
    code, rows = _verify_rows(store_dir, capsys)
    assert code == 1
    assert rows[1]["ok"]
    assert [(f["item"], f["leaf"]) for f in rows[2]["failures"]] == [("model", "<root>")]
    assert str(path) in rows[2]["failures"][0]["error"]


def test_a_step_that_lost_its_metadata_record_is_a_damaged_step_not_a_stranger(saved, capsys):
    """Hostile finding: with its record gone, the latest step stopped being a step; the store
    quietly resumed from the step before and verify passed."""
    store_dir = saved()
    record = store_dir / "2" / "metadata" / "metadata"
    record.unlink()  # the step's manifest still lists it
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        assert store.list_steps() == [1, 2]
        with pytest.raises(CheckpointCorruptError) as error:
            store.restore(None)
        assert error.value.step == 2
        assert f"{record}: missing against the step's manifest" in str(error.value)
        assert store.restore(1).step == 1
    code, rows = _verify_rows(store_dir, capsys)
    assert code == 1
    assert rows[1]["ok"]
    assert not rows[2]["ok"]


@pytest.mark.parametrize("prune", [False, True], ids=["at-a-save", "prune"])
def test_keep_best_keeps_a_step_whose_record_cannot_be_read_and_says_so(store_dir, caplog, prune):
    """Hostile finding: a step whose metadata record was damaged had no metrics to rank, and
    retention deleted it silently: it may have been the best step."""
    policy = {"max_to_keep": 1, "keep_best": 1, "best_metric": "loss", "async_save": False}
    with OrbaxCheckpointStore(store_dir, **policy) as store:
        store.save(1, _items(), metrics={"loss": 0.1})
        store.save(2, _items(), metrics={"loss": 0.5})
    (store_dir / "1" / "metadata" / "metadata").write_text("{not json")
    with OrbaxCheckpointStore(store_dir, **policy) as store:
        if prune:
            assert store.prune() == []
        else:
            store.save(3, _items(), metrics={"loss": 0.9})
        assert 1 in store.list_steps()
    warned = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].startswith(f"the metadata records of steps [1] in {store_dir}")
    assert "they are kept, as any may be the best" in warned[0]


@pytest.mark.parametrize("damage", ["tree metadata", "item"])
def test_describe_and_show_name_a_step_missing_a_file_or_an_item(saved, capsys, damage):
    """Hostile finding: describe() and `show` raised a bare TypeError (no _METADATA) or
    KeyError (an item's folder gone) with a traceback; restore named the damage."""
    store_dir = saved()
    if damage == "item":
        shutil.rmtree(store_dir / "2" / "data_iterator")
    else:
        (store_dir / "2" / "model" / "_METADATA").unlink()
    item = "data_iterator" if damage == "item" else "model"
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        with pytest.raises(CheckpointCorruptError) as error:
            store.describe(2)
        assert (error.value.step, error.value.item) == (2, item)
        assert store.describe(1)
    assert main(["show", str(store_dir), "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m substrax.checkpoint: error: checkpoint step 2 in ")
    assert "Traceback" not in err
