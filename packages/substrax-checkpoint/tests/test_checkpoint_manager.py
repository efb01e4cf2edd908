import json

import numpy as np

from substrax.checkpoint import OrbaxCheckpointStore
from substrax.checkpoint._manager import (
    DELETED,
    Layout,
    has_deleted,
    remove_partial_steps,
    step_directories,
)


def test_step_directories_are_the_directories_holding_their_own_step_s_record(tmp_path):
    for name in ("3", "10", "1", "5", "6", "007"):
        (tmp_path / name / "metadata").mkdir(parents=True)
        step = {"5": 4}.get(name, int(name))  # 5 holds step 4's record (a copy)
        (tmp_path / name / "metadata" / "metadata").write_text(json.dumps({"step": step}))
    (tmp_path / "6" / "metadata" / "metadata").write_text("{")  # damaged: still a step
    (tmp_path / "7").write_text("a file, not a step")
    (tmp_path / "8" / "results").mkdir(parents=True)  # no record: not a step
    (tmp_path / "4.orbax-checkpoint-tmp").mkdir()
    (tmp_path / "best").mkdir()
    assert step_directories(tmp_path) == [1, 3, 6, 10]
    assert step_directories(tmp_path / "absent") == []


def test_an_interrupted_save_leaves_nothing_after_the_cleanup(tmp_path):
    (tmp_path / "2").mkdir()
    (tmp_path / "3.orbax-checkpoint-tmp" / "model").mkdir(parents=True)
    (tmp_path / ".substrax_index.json.123.tmp").write_text("{")
    (tmp_path / "notes.txt").write_text("kept")
    remove_partial_steps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "notes.txt"]


def test_every_layout_writes_what_it_names(tmp_path):
    value = {"w": np.arange(6, dtype=np.float32)}
    for layout in (
        Layout(),
        Layout(ocdbt=False),
        Layout(ocdbt=False, zarr3=False, compression=True),
    ):
        root = tmp_path / f"{layout.ocdbt}-{layout.zarr3}-{layout.compression}"
        options = {
            "use_ocdbt": layout.ocdbt,
            "use_zarr3": layout.zarr3,
            "use_compression": layout.compression,
        }
        with OrbaxCheckpointStore(root, async_save=False, **options) as store:
            store.save(1, {"model": value})
            np.testing.assert_array_equal(store.restore(1).items["model"]["w"], value["w"])
        item = root / "1" / "model"
        assert (item / "ocdbt.process_0").exists() == layout.ocdbt
        if not layout.ocdbt:
            zarr = item / "tree.w"
            assert (zarr / "zarr.json").exists() == layout.zarr3
            assert (zarr / ".zarray").exists() == (not layout.zarr3)


def test_deleted_steps_leave_in_one_rename_and_their_files_are_removed(tmp_path):
    with OrbaxCheckpointStore(tmp_path, max_to_keep=1, keep_every=2) as store:
        for step in (1, 2, 3, 4):
            store.save(step, {"model": {"w": np.full(4, step, np.float32)}})
        store.delete(2)
        store.save(4, {"model": {"w": np.zeros(4, np.float32)}}, overwrite=True)
    assert step_directories(tmp_path) == [4]
    assert not has_deleted(tmp_path), "the deleted steps' files are gone once the store closes"
    assert (tmp_path / DELETED).is_dir()


def test_the_cleanup_empties_the_deleted_steps(tmp_path):
    (tmp_path / DELETED / "7" / "model").mkdir(parents=True)
    (tmp_path / DELETED / "stray").write_text("x")
    assert has_deleted(tmp_path)
    remove_partial_steps(tmp_path)
    assert not has_deleted(tmp_path)
    assert not has_deleted(tmp_path / "absent")
