"""The step manifest: every file's size and CRC-32C, written after orbax commits, checked before a restore."""

import json
import shutil
from collections.abc import Collection
from pathlib import Path

import crc32c
import numpy as np
import orbax.checkpoint as ocp
import pytest

from substrax.checkpoint._manifest import (
    MANIFEST_FILE,
    Damage,
    Manifest,
    check_manifest,
    read_manifest,
    write_manifest,
)


CHUNK = "model/tree.w/c/0/0"
KERNEL = "model/tree.layers.0.kernel"


def _save(directory: Path, *, ocdbt: bool) -> None:
    """Steps 0 and 1 of a tiny state, the same arrays with other values, as the store lays them out."""

    def arrays() -> ocp.PyTreeCheckpointHandler:
        return ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt, use_zarr3=True)

    handlers = {"model": arrays(), "optimizer": arrays(), "metadata": ocp.JsonCheckpointHandler()}
    manager = ocp.CheckpointManager(directory, item_handlers=handlers)
    for step, value in [(0, 1.0), (1, 2.0)]:
        model = {
            "w": np.full((4, 3), value, np.float32),
            "layers": [{"kernel": np.full((2, 2), value)}],
        }
        args = ocp.args.Composite(
            model=ocp.args.PyTreeSave({"tree": model}),
            optimizer=ocp.args.PyTreeSave({"tree": np.full((3,), value, np.float32)}),
            metadata=ocp.args.JsonSave({"step": step}),
        )
        manager.save(step, args=args)
    manager.wait_until_finished()
    manager.close()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("zarr")
    _save(directory, ocdbt=False)
    return directory


@pytest.fixture(scope="module")
def saved_ocdbt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("ocdbt")
    _save(directory, ocdbt=True)
    return directory


@pytest.fixture
def step(saved: Path, tmp_path: Path) -> Path:
    """A fresh copy of step 0 with its manifest written."""
    step = shutil.copytree(saved / "0", tmp_path / "0")
    write_manifest(step)
    return step


def _check(step: Path, items: Collection[str] | None = None) -> list[Damage]:
    manifest = read_manifest(step)
    assert manifest is not None
    return check_manifest(step, manifest, items=items)


def _flip(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_an_intact_step_has_no_damage_and_every_file_is_listed(step: Path) -> None:
    manifest = read_manifest(step)
    assert manifest is not None
    on_disk = {p.relative_to(step).as_posix() for p in step.rglob("*") if p.is_file()}
    assert set(manifest.files) == on_disk - {MANIFEST_FILE}
    assert {CHUNK, "_CHECKPOINT_METADATA", "model/_METADATA", "metadata/metadata"} <= on_disk
    assert check_manifest(step, manifest) == []


def test_the_manifest_records_sizes_and_crc32c_as_json(step: Path) -> None:
    document = json.loads((step / MANIFEST_FILE).read_text())
    assert (document["format"], document["algorithm"]) == (1, "crc32c")
    data = (step / CHUNK).read_bytes()
    assert document["files"][CHUNK] == {"size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}


def test_a_flipped_byte_in_a_chunk_names_the_item_array_and_file(step: Path) -> None:
    _flip(step / CHUNK, offset=0)
    [damage] = _check(step)
    assert (damage.file, damage.item, damage.array) == (CHUNK, "model", "w")
    assert damage.problem.startswith("CRC-32C ")
    assert str(damage).startswith(f"{CHUNK} (array 'w' of item 'model'): CRC-32C ")


def test_a_truncated_file_is_a_size_problem(step: Path) -> None:
    chunk = step / KERNEL / "c/0/0"
    size = chunk.stat().st_size
    chunk.write_bytes(chunk.read_bytes()[:-5])
    [damage] = _check(step)
    assert (damage.item, damage.array) == ("model", "layers.0.kernel")
    assert damage.problem == f"size {size - 5}, recorded {size}"


def test_a_deleted_file_is_missing(step: Path) -> None:
    (step / KERNEL / "zarr.json").unlink()
    assert _check(step) == [Damage(f"{KERNEL}/zarr.json", "model", "layers.0.kernel", "missing")]


def test_an_item_that_is_one_array_names_the_array_empty(step: Path) -> None:
    [chunk] = [p for p in (step / "optimizer/tree/c").rglob("*") if p.is_file()]
    _flip(chunk)
    [damage] = _check(step)
    assert (damage.item, damage.array) == ("optimizer", "")


def test_an_item_directory_that_is_the_array_names_it_empty(tmp_path: Path) -> None:
    (tmp_path / "rng/c").mkdir(parents=True)  # orbax's layout of a bare array saved unwrapped
    (tmp_path / "rng/zarr.json").write_text("{}")
    (tmp_path / "rng/c/0").write_bytes(b"key")
    write_manifest(tmp_path)
    _flip(tmp_path / "rng/c/0")
    [damage] = _check(tmp_path)
    assert (damage.file, damage.item, damage.array) == ("rng/c/0", "rng", "")


def test_a_chunk_copied_from_another_step_fails_its_crc(step: Path, saved: Path) -> None:
    other = saved / "1" / CHUNK
    assert other.stat().st_size == (step / CHUNK).stat().st_size
    assert other.read_bytes() != (step / CHUNK).read_bytes()
    shutil.copyfile(other, step / CHUNK)
    [damage] = _check(step)
    assert (damage.file, damage.array) == (CHUNK, "w")
    assert damage.problem.startswith("CRC-32C ")


@pytest.mark.parametrize(
    ("file", "item"),
    [
        ("_CHECKPOINT_METADATA", None),
        ("model/_METADATA", "model"),
        ("metadata/metadata", "metadata"),
    ],
)
def test_a_damaged_metadata_file_is_damage_of_no_array(
    step: Path, file: str, item: str | None
) -> None:
    _flip(step / file, offset=len((step / file).read_bytes()) // 2)
    [damage] = _check(step)
    assert (damage.file, damage.item, damage.array) == (file, item, None)


def test_items_checks_only_their_directories_with_metadata_and_top_level_files(step: Path) -> None:
    [optimizer_chunk] = [p for p in (step / "optimizer/tree/c").rglob("*") if p.is_file()]
    damaged = [
        CHUNK,
        optimizer_chunk.relative_to(step).as_posix(),
        "metadata/metadata",
        "_CHECKPOINT_METADATA",
    ]
    for file in damaged:
        _flip(step / file)
    assert [d.file for d in _check(step)] == sorted(damaged)
    assert [d.file for d in _check(step, items=["optimizer"])] == sorted(damaged[1:])
    assert [d.file for d in _check(step, items=["model"])] == sorted([CHUNK, *damaged[2:]])


def test_items_given_as_one_string_is_refused_with_the_fix(step: Path) -> None:
    with pytest.raises(TypeError, match=r"items='model' is one string.*\['model'\]"):
        _check(step, items="model")


def test_files_that_are_not_listed_are_not_damage(step: Path) -> None:
    (step / "model/tree.w/c/0/1").write_bytes(b"extra")
    (step / ".nfs0001").write_bytes(b"litter")
    assert _check(step) == []


def test_a_step_without_a_manifest_reads_as_none(saved: Path, tmp_path: Path) -> None:
    step = shutil.copytree(saved / "0", tmp_path / "0")
    assert read_manifest(step) is None


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe\x00",
        b"[]",
        b'{"format": 2, "algorithm": "crc32c", "files": {}}',
        b'{"format": 1, "algorithm": "sha256", "files": {}}',
        b'{"format": 1, "algorithm": "crc32c"}',
        b'{"format": 1, "algorithm": "crc32c", "files": {}}',  # lists nothing: checks nothing
        b'{"format": 1, "algorithm": "crc32c", "files": {"../x": {"size": 1, "crc32c": "00000000"}}}',
        b'{"format": 1, "algorithm": "crc32c", "files": {"/x": {"size": 1, "crc32c": "00000000"}}}',
        b'{"format": 1, "algorithm": "crc32c", "files": {"x": {"size": -1, "crc32c": "00000000"}}}',
        b'{"format": 1, "algorithm": "crc32c", "files": {"x": {"size": true, "crc32c": "00000000"}}}',
        b'{"format": 1, "algorithm": "crc32c", "files": {"x": {"size": 1, "crc32c": "xyz"}}}',
        b'{"format": 1, "algorithm": "crc32c", "files": {"x": [1, "00000000"]}}',
    ],
)
def test_a_garbled_manifest_is_itself_damage(step: Path, content: bytes) -> None:
    (step / MANIFEST_FILE).write_bytes(content)
    manifest = read_manifest(step)
    assert manifest is not None
    assert manifest.unreadable
    [damage] = check_manifest(step, manifest, items=["optimizer"])
    assert (damage.file, damage.item, damage.array) == (MANIFEST_FILE, None, None)
    assert damage.problem.startswith("unreadable manifest (")


def test_writing_replaces_the_manifest_atomically_and_skips_a_leftover(step: Path) -> None:
    leftover = step / f".{MANIFEST_FILE}.0123456789ab.tmp"
    leftover.write_text("{half a manifest")
    (step / CHUNK).write_bytes(b"rewritten")
    before = {p.name for p in step.iterdir()}
    write_manifest(step)
    assert {p.name for p in step.iterdir()} == before  # replaced in place, no temporary file left
    manifest = read_manifest(step)
    assert manifest is not None
    assert leftover.name not in manifest.files
    assert manifest.files[CHUNK].size == len(b"rewritten")
    assert check_manifest(step, manifest) == []


def test_a_vanished_step_raises_and_writing_creates_nothing(tmp_path: Path) -> None:
    gone = tmp_path / "7"
    with pytest.raises(FileNotFoundError):
        write_manifest(gone)
    assert not gone.exists()
    with pytest.raises(FileNotFoundError):
        read_manifest(gone)
    with pytest.raises(FileNotFoundError):
        check_manifest(gone, Manifest({}))


def test_symbolic_links_are_never_followed(step: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(step / KERNEL, outside)
    (step / "linked").symlink_to(outside / "zarr.json")
    (step / "model/linked").symlink_to(outside, target_is_directory=True)
    write_manifest(step)
    manifest = read_manifest(step)
    assert manifest is not None
    assert not [file for file in manifest.files if "linked" in file]
    (step / CHUNK).unlink()
    (step / CHUNK).symlink_to(outside / "zarr.json")
    shutil.rmtree(step / KERNEL)
    (step / KERNEL).symlink_to(outside)
    problems = {d.file: d.problem for d in check_manifest(step, manifest)}
    assert problems.pop(CHUNK) == "a symbolic link"
    assert set(problems.values()) == {"reached through a symbolic link out of the step"}
    assert all(file.startswith(KERNEL + "/") for file in problems)


def test_many_files_are_checked_on_threads_and_each_damage_is_found(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for index in range(12):  # above the bytes a check reads on one thread
        path = tmp_path / "model" / f"tree.a{index}" / "c.0"
        path.parent.mkdir(parents=True)
        path.write_bytes(rng.bytes((1 << 20) + index))
        (path.parent / "zarr.json").write_text("{}")
    write_manifest(tmp_path)
    for index in (0, 11):
        _flip(tmp_path / "model" / f"tree.a{index}" / "c.0", offset=1 << 19)
    assert [(d.file, d.array) for d in _check(tmp_path)] == [
        ("model/tree.a0/c.0", "a0"),
        ("model/tree.a11/c.0", "a11"),
    ]


def test_an_ocdbt_step_names_the_item_but_no_array(saved_ocdbt: Path, tmp_path: Path) -> None:
    step = shutil.copytree(saved_ocdbt / "0", tmp_path / "0")
    write_manifest(step)
    assert _check(step) == []
    data_files = [p for p in (step / "model").rglob("d/*") if p.is_file()]
    assert data_files
    largest = max(data_files, key=lambda p: p.stat().st_size)
    _flip(largest, offset=0)
    [damage] = _check(step)
    assert (damage.file, damage.item, damage.array) == (
        largest.relative_to(step).as_posix(),
        "model",
        None,
    )
