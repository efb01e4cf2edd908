"""A store's path: a reader needs an existing directory, a writer creates one, a file is refused."""

from pathlib import Path

import pytest

from substrax.checkpoint import (
    CheckpointStoreNotADirectoryError,
    CheckpointStoreNotFoundError,
    OrbaxCheckpointStore,
)
from substrax.checkpoint._paths import check_store_directory, make_store_directory


def test_a_reader_of_a_missing_store_is_refused_at_open(tmp_path):
    missing = tmp_path / "typo"
    with pytest.raises(CheckpointStoreNotFoundError) as error:
        OrbaxCheckpointStore(missing, read_only=True)
    assert isinstance(error.value, FileNotFoundError)
    assert error.value.directory == missing
    assert str(missing) in str(error.value)
    assert not missing.exists(), "a reader creates nothing"


@pytest.mark.parametrize("read_only", [True, False])
def test_a_file_is_not_a_store(tmp_path, read_only):
    file = tmp_path / "weights.npz"
    file.write_bytes(b"not a store")
    with pytest.raises(CheckpointStoreNotADirectoryError) as error:
        OrbaxCheckpointStore(file, read_only=read_only)
    assert isinstance(error.value, NotADirectoryError)
    assert error.value.directory == file
    assert str(file) in str(error.value)
    assert file.read_bytes() == b"not a store"


def test_a_writer_creates_its_directory_and_parents(tmp_path):
    root = tmp_path / "runs" / "a" / "checkpoints"
    with OrbaxCheckpointStore(root) as store:
        assert store.list_steps() == []
    assert root.is_dir()


def test_the_checks_alone(tmp_path):
    check_store_directory(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointStoreNotADirectoryError):
        check_store_directory(tmp_path / "file")
    with pytest.raises(CheckpointStoreNotADirectoryError):
        make_store_directory(tmp_path / "file" / "below")
    with pytest.raises(CheckpointStoreNotFoundError):
        check_store_directory(tmp_path / "absent")
    make_store_directory(tmp_path / "new")
    make_store_directory(tmp_path / "new")
    assert (tmp_path / "new").is_dir()


def test_a_relative_checkpoint_dir_is_resolved_against_the_working_directory_now(
    tmp_path, monkeypatch
):
    from substrax.checkpoint import resolve_checkpoint_dir

    monkeypatch.chdir(tmp_path)
    explicit = resolve_checkpoint_dir(Path("ckpt"), Path("/elsewhere"))
    from_run = resolve_checkpoint_dir(None, Path("runs/a"))
    monkeypatch.chdir("/")
    assert explicit == tmp_path.resolve() / "ckpt"
    assert from_run == tmp_path.resolve() / "runs" / "a" / "checkpoints"
    assert resolve_checkpoint_dir(Path("~/ckpt"), None) == Path.home().resolve() / "ckpt"
    assert not (tmp_path / "ckpt").exists()
    assert not (tmp_path / "runs").exists(), "resolving creates nothing"


@pytest.mark.parametrize(("checkpoint_dir", "run_dir"), [("", None), (" ", None), (None, "")])
def test_an_empty_directory_is_refused_not_read_as_the_working_directory(checkpoint_dir, run_dir):
    from substrax.checkpoint import resolve_checkpoint_dir

    with pytest.raises(ValueError, match=r"_dir='\s*' is empty"):
        resolve_checkpoint_dir(checkpoint_dir, run_dir)
