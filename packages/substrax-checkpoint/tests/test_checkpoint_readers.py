"""Readers: a read_only store writes nothing, follows a writer, waits for steps; an empty store
says so."""

import json
import math
import threading

import numpy as np
import pytest

from substrax.checkpoint import (
    CheckpointNotFoundError,
    CheckpointStoreClosedError,
    CheckpointStoreReadOnlyError,
    CheckpointWaitTimeoutError,
    OrbaxCheckpointStore,
)
from substrax.checkpoint._cli import main
from substrax.checkpoint._manifest import MANIFEST_FILE
from substrax.checkpoint._reads import verify_step


def _tree(root):
    return sorted(
        (str(path.relative_to(root)), path.stat().st_mtime_ns, path.stat().st_size)
        for path in root.rglob("*")
    )


def _state(step):
    return {"model": {"w": np.full(3, step, np.float32)}, "data_iterator": {"i": step}}


def test_readers_write_delete_and_rename_nothing(store_dir, capsys):
    with OrbaxCheckpointStore(store_dir, max_to_keep=None, async_save=False) as store:
        for step in (1, 2, 3):
            store.save(step, _state(step), metrics={"loss": 1.0 / step})
    (store_dir / "4.orbax-checkpoint-tmp-1700000000" / "model").mkdir(parents=True)
    (store_dir / ".substrax_index.json.999.tmp").write_text("{")
    before = _tree(store_dir)
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1, 2, 3]
        assert reader.best_step("loss") == 3
        assert reader.restore(2).items["data_iterator"]["i"] == 2
        assert reader.describe(3)["model"][0].shape == (3,)
        with pytest.raises(CheckpointStoreReadOnlyError, match=r"cannot save: .* read_only"):
            reader.save(4, _state(4))
        with pytest.raises(CheckpointStoreReadOnlyError, match="read_only") as refused:
            reader.delete(1)
        assert isinstance(refused.value, PermissionError)
        assert (refused.value.operation, refused.value.directory) == ("delete", store_dir.resolve())
    for command in (["ls"], ["verify"], ["prune", "--max-to-keep", "1", "--dry-run"]):
        assert main([command[0], "--json", str(store_dir), *command[1:]]) == 0
    assert main(["show", "--json", str(store_dir), "2"]) == 0
    capsys.readouterr()
    assert _tree(store_dir) == before


def test_a_reader_follows_a_writer(store_dir):
    writer = OrbaxCheckpointStore(store_dir, max_to_keep=2)
    writer.save(1, _state(1), metrics={"loss": 0.5})
    writer.wait()
    reader = OrbaxCheckpointStore(store_dir, read_only=True)
    assert reader.restore(1).items["data_iterator"]["i"] == 1  # the reader's manager is open now
    writer.save(2, _state(2), metrics={"loss": 0.1})
    writer.save(3, _state(3), metrics={"loss": 0.3})
    writer.wait()
    assert reader.list_steps() == [2, 3]
    assert reader.latest_step() == 3
    assert reader.best_step("loss") == 2
    assert reader.restore(None).step == 3
    np.testing.assert_array_equal(reader.restore(2).items["model"]["w"], np.full(3, 2.0))
    reader.close()
    writer.close()


def test_a_reader_waits_for_the_manifest_a_live_writer_owes(store_dir, monkeypatch, wall_clock):
    """The newest step is committed before its manifest: a reader waits for it, bounded."""
    from substrax.checkpoint import _save as save_module

    sealing = save_module.write_manifest

    def slow_seal(step_dir):
        wall_clock.sleep(1.0)
        sealing(step_dir)

    monkeypatch.setattr(save_module, "write_manifest", slow_seal)
    with (
        OrbaxCheckpointStore(store_dir) as writer,
        OrbaxCheckpointStore(store_dir, read_only=True) as reader,
    ):
        for step in (1, 2):
            writer.save(step, _state(step))
            assert reader.wait_for_step(after=step - 1, timeout=60, poll_interval=0.01) == step
            assert not (store_dir / str(step) / MANIFEST_FILE).exists()  # committed, not sealed
            if step == 1:
                checkpoint = reader.restore(step)
                assert (checkpoint.step, checkpoint.verified) == (step, True)
            else:
                assert verify_step(reader, step) == ([], True)


def test_an_empty_store_says_it_is_empty(store_dir):
    with OrbaxCheckpointStore(store_dir) as store:
        for call in (store.restore, store.read_metadata):
            with pytest.raises(CheckpointNotFoundError) as error:
                call(store.latest_step())
            assert error.value.step is None
            assert error.value.directory == store_dir
            assert f"the checkpoint store at {store_dir} is empty" in str(error.value)
        with pytest.raises(CheckpointNotFoundError, match="no checkpoint step 3"):
            store.restore(3)  # a missing step keeps its own message
        store.save(4, _state(4))
        assert store.restore(None).step == 4
        assert store.read_metadata(None).step == 4
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.restore(reader.latest_step()).items["data_iterator"]["i"] == 4


def test_wait_for_step(store_dir, wall_clock):
    with OrbaxCheckpointStore(store_dir, async_save=False) as writer:
        reader = OrbaxCheckpointStore(store_dir, read_only=True)
        with pytest.raises(CheckpointWaitTimeoutError) as error:
            reader.wait_for_step(timeout=0.2, poll_interval=0.05)
        assert (error.value.after, error.value.timeout, error.value.latest_step) == (
            None,
            0.2,
            None,
        )
        assert isinstance(error.value, TimeoutError)
        assert str(store_dir) in str(error.value)

        def save_later():
            wall_clock.sleep(0.5)
            writer.save(7, _state(7))

        thread = threading.Thread(target=save_later)
        thread.start()
        assert reader.wait_for_step(timeout=60, poll_interval=0.05) == 7
        thread.join()
        assert reader.wait_for_step(after=6, timeout=0) == 7
        with pytest.raises(CheckpointWaitTimeoutError) as error:
            reader.wait_for_step(after=7, timeout=0.1, poll_interval=0.05)
        assert (error.value.after, error.value.latest_step) == (7, 7)
        assert "no step after 7 was committed" in str(error.value)
        with pytest.raises(ValueError, match="timeout"):
            reader.wait_for_step(timeout=-1)
        with pytest.raises(ValueError, match="poll_interval"):
            reader.wait_for_step(timeout=1, poll_interval=0)
        assert writer.wait_for_step(after=2, timeout=1) == 7
        reader.close()
        with pytest.raises(CheckpointStoreClosedError, match="closed") as closed:
            reader.wait_for_step(timeout=1)
        assert isinstance(closed.value, RuntimeError)


@pytest.mark.parametrize(
    ("argument", "value", "bound"),
    [
        *[("timeout", value, ">= 0") for value in (math.nan, math.inf, -math.inf, -1.0)],
        *[("poll_interval", value, "> 0") for value in (math.nan, math.inf, 0.0, -0.5)],
    ],
)
def test_wait_for_step_refuses_seconds_that_are_not_finite_or_out_of_range(
    store_dir, argument, value, bound
):
    refusal = rf"{argument}={value!r} must be a finite number of seconds {bound}"
    with OrbaxCheckpointStore(store_dir) as store, pytest.raises(ValueError, match=refusal):
        store.wait_for_step(**{"timeout": 1.0, argument: value})


def test_a_step_whose_directory_goes_while_it_is_read_is_not_found(store_dir):
    with OrbaxCheckpointStore(store_dir, max_to_keep=None, async_save=False) as store:
        store.save(1, _state(1))
        store.save(2, _state(2))
        # what a writer's retention does to a step: one rename out of the store, under the read
        # of this store, which still lists the step
        (store_dir / "2").rename(store_dir / "gone-2")
        assert store.list_steps() == [1, 2]
        for read in (store.restore, store.read_metadata, store.describe):
            with pytest.raises(CheckpointNotFoundError) as error:
                read(2)
            assert (error.value.step, error.value.deleted, error.value.available) == (2, True, (1,))
            assert "was deleted while it was read" in str(error.value)
        assert verify_step(store, 2) == (None, False)  # verify reports it deleted, not FAILED
        assert verify_step(store, 1) == ([], True)
        (store_dir / "gone-2").rename(store_dir / "2")


@pytest.mark.usefixtures("child_processes")
def test_readers_of_a_live_writer_with_retention_see_only_deleted_steps(store_dir, capsys):
    """A writer keeping one step saves while readers restore, describe, list and verify."""
    store_dir.mkdir()
    done = threading.Event()

    def write():
        try:
            with OrbaxCheckpointStore(store_dir, max_to_keep=1) as writer:
                for step in range(1, 41):
                    big = np.full(1 << 18, step, np.float32)
                    items = {"model": {"w": big}, "data_iterator": {"i": step}}
                    writer.save(step, items, metrics={"loss": 1.0 / step})
        finally:
            done.set()

    thread = threading.Thread(target=write)
    thread.start()
    unexpected: list[str] = []
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        while not done.is_set():
            for step in reader.list_steps():
                try:
                    restored = reader.restore(step)
                    assert restored.items["data_iterator"]["i"] == step
                    reader.describe(step)
                except CheckpointNotFoundError:
                    pass  # deleted before or while it was read
                except Exception as error:  # every other error is a failure
                    unexpected.append(f"{type(error).__name__}: {error}")
            for command in (
                ["ls"],
                ["prune", "--keep-best", "1", "--best-metric", "loss", "--dry-run"],
                ["verify"],
            ):
                code = main([command[0], "--json", str(store_dir), *command[1:]])
                out, err = capsys.readouterr()
                if code != 0:
                    unexpected.append(f"{command} exited {code}: {out} {err}")
                if command == ["verify"]:
                    rows = json.loads(out)
                    # "unverified": committed, its manifest not yet written (a moment later)
                    allowed = ("ok", "deleted", "unverified")
                    unexpected += [str(r) for r in rows if r["status"] not in allowed]
    thread.join()
    assert unexpected == []
