"""The store's directory changed under an open writer: made read-only, removed, its lock replaced."""

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from substrax.checkpoint import (
    CheckpointStoreRemovedError,
    CheckpointWriteError,
    OrbaxCheckpointStore,
)
from substrax.checkpoint._lock import LOCK_FILE
from substrax.testing import run_python


STATE = {"model": {"w": np.ones(4, np.float32)}}

# Saves step 1, makes the directory read-only, saves step 2 (whose write and then whose index
# update are refused) and reports, as one JSON line, what closing the store raised and logged.
# It leaves at once: orbax's threads for the failed write wait on its signals until their
# coordination timeout, and would hold a normal exit that long.
READ_ONLY_RUN = textwrap.dedent(
    """
    import json, logging, os, sys
    import numpy as np
    from substrax.checkpoint import OrbaxCheckpointStore

    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("substrax.checkpoint").addHandler(handler)
    directory = sys.argv[1]
    state = {"model": {"w": np.ones(4, np.float32)}}
    try:
        with OrbaxCheckpointStore(directory) as store:
            store.save(1, state)
            store.wait()
            os.chmod(directory, 0o555)
            store.save(2, state)
    except BaseException as error:
        print(json.dumps({
            "raised": f"{type(error).__module__}.{type(error).__name__}",
            "step": getattr(error, "step", None),
            "directory": str(getattr(error, "directory", None)),
            "cause": type(error.__cause__).__name__,
            "message": str(error),
            "logged": logged,
        }))
    else:
        print(json.dumps({"raised": None, "logged": logged}))
    sys.stdout.flush()
    os._exit(0)  # orbax's threads still wait for the signals of the write that failed
    """
)


def _open_elsewhere(directory) -> str:
    """Open ``directory`` as a writer in another process: "opened", or the error's class name."""
    program = (
        "import sys\n"
        "from substrax.checkpoint import CheckpointLockedError, OrbaxCheckpointStore\n"
        "try:\n"
        "    OrbaxCheckpointStore(sys.argv[1]).close()\n"
        "except CheckpointLockedError:\n"
        "    print('CheckpointLockedError')\n"
        "else:\n"
        "    print('opened')\n"
    )
    return run_python(program, str(directory), timeout=120).check().stdout.split()[-1]


def test_a_directory_made_read_only_raises_the_write_error_not_the_index_s(
    store_dir, run_where_file_modes_apply
):
    store_dir.mkdir()
    try:
        result = run_where_file_modes_apply([sys.executable, "-c", READ_ONLY_RUN, str(store_dir)])
    finally:
        store_dir.chmod(0o755)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["raised"] == "substrax.checkpoint.CheckpointWriteError", report
    assert report["step"] == 2
    assert report["directory"] == str(store_dir)
    assert report["cause"] == "PermissionError"  # the write's own error, chained
    assert "PermissionError: [Errno 13]" in report["message"]  # naming the file it refused
    # the index update that failed after it is logged, naming the step and the directory
    assert any("step 2" in line and str(store_dir) in line for line in report["logged"]), report
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1]


def test_a_removed_directory_is_refused_at_save_and_not_created_again(store_dir):
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, STATE)
        store.wait()
        shutil.rmtree(store_dir)
        with pytest.raises(CheckpointStoreRemovedError) as error:
            store.save(2, STATE)
        assert error.value.directory == store_dir
        assert str(store_dir) in str(error.value)
        assert "removed" in str(error.value)
        assert not store_dir.exists()
        with pytest.raises(CheckpointStoreRemovedError):  # every later save too
            store.save(3, STATE)
    assert not store_dir.exists()  # closing created nothing either


@pytest.mark.parametrize("written_by", ["orbax", "store"])
def test_a_directory_removed_during_the_store_s_own_write_is_an_error_and_not_made_again(
    store_dir, tmp_path, monkeypatch, written_by
):
    # `rm -rf` of the store while a step is written: the write's files land after the removal
    # (TensorStore and orbax create the folders they miss), and the commit renames them into a
    # directory that has no writer lock any more. Injected at the commit's rename, where the
    # removal happens just before: the step's temporary directory is all that came back.
    rename = os.rename
    aside = tmp_path / "aside"

    def remove_then_rename(src, dst, *args, **kwargs):
        if "orbax-checkpoint-tmp" in str(src) and Path(dst) == store_dir / "2":
            shutil.move(src, aside)
            shutil.rmtree(store_dir)
            store_dir.mkdir()
            shutil.move(aside, src)
        return rename(src, dst, *args, **kwargs)

    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        if written_by == "store":  # step 2 is then written by the store from step 1's files
            store.save(1, STATE)
            store.wait()
        monkeypatch.setattr(os, "rename", remove_then_rename)
        monkeypatch.setattr(Path, "rename", remove_then_rename)
        store.save(2, STATE)
        with pytest.raises(CheckpointWriteError, match="CheckpointStoreRemovedError") as error:
            store.wait()
        monkeypatch.undo()
        assert error.value.step == 2
        assert isinstance(error.value.__cause__, CheckpointStoreRemovedError)
        assert error.value.__cause__.directory == store_dir
        assert not store_dir.exists(), "nothing of the removed store was made again"
        with pytest.raises(CheckpointStoreRemovedError):
            store.save(3, STATE)
    assert not store_dir.exists()


@pytest.mark.usefixtures("child_processes")
def test_a_store_opened_after_the_removal_takes_a_lock_of_its_own(store_dir):
    # a notebook re-runs its cell after removing the directory: the new store locks the new
    # directory (the old one's lock went with the old directory) and saves; the old one may not
    old = OrbaxCheckpointStore(store_dir)
    old.save(1, STATE)
    old.wait()
    shutil.rmtree(store_dir)
    with OrbaxCheckpointStore(store_dir) as new:
        new.save(5, STATE)
        new.wait()
        with pytest.raises(CheckpointStoreRemovedError):
            old.save(2, STATE)
        old.close()  # releases the old lock only: the new store's stays held
        assert json.loads((store_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
        new.save(6, STATE)
        assert _open_elsewhere(store_dir) == "CheckpointLockedError"
    assert _open_elsewhere(store_dir) == "opened"
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [5, 6]


def test_a_replaced_lock_file_means_another_writer_may_hold_the_directory(store_dir):
    # a second writer got in after the directory was removed and made again: its lock file
    # stands where ours was, and our saves stop rather than write beside it
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, STATE)
        store.wait()
        lock = store_dir / LOCK_FILE
        lock.unlink()
        lock.write_text("{}")
        with pytest.raises(CheckpointStoreRemovedError):
            store.save(2, STATE)
        assert store.list_steps() == [1]


def test_a_store_whose_directory_stayed_saves_on(store_dir):
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, STATE)
        store.wait()
        store.save(2, STATE)
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1, 2]
