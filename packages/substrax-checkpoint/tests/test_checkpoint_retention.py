import os
from pathlib import Path

import numpy as np
import pytest

from substrax.checkpoint import (
    BestMetricNotRecordedError,
    CheckpointNotWrittenError,
    CheckpointWriteError,
    Mode,
    OrbaxCheckpointStore,
    RetentionPolicy,
)


def _save(store, step, loss=None):
    metrics = None if loss is None else {"loss": loss}
    store.save(step, {"model": {"w": np.full(4, step, np.float32)}}, metrics=metrics)


def test_latest_n_and_best_k_together(store_dir):
    losses = [0.1, 0.9, 0.8, 0.05, 0.7, 0.6, 0.95]
    with OrbaxCheckpointStore(store_dir, max_to_keep=2, keep_best=2, best_metric="loss") as store:
        for step, loss in enumerate(losses):
            _save(store, step, loss)
            assert store.best_step("loss") in store.list_steps()
        store.wait()
        assert store.list_steps() == [0, 3, 5, 6]
        assert store.best_step("loss") == 3
    with OrbaxCheckpointStore(store_dir) as reopened:
        assert reopened.list_steps() == [0, 3, 5, 6]


def test_newest_step_is_never_evicted(store_dir):
    with OrbaxCheckpointStore(
        store_dir, max_to_keep=1, keep_best=1, best_metric="loss", best_mode="max"
    ) as store:
        _save(store, 1, 0.9)
        _save(store, 2, 0.1)
        _save(store, 3, 0.2)
        store.wait()
        assert store.list_steps() == [1, 3]


@pytest.mark.parametrize("async_save", [True, False])
def test_a_newest_step_saved_again_with_worse_metrics_never_cost_the_best_step(
    store_dir, async_save
):
    """Hostile finding: the callback's epoch-end save of a step every_n_steps had saved (with a
    batch's lower loss) came after retention had deleted the real best step for it."""
    from substrax.checkpoint import CheckpointCallback

    batch_losses, epoch_losses = [[0.9, 0.7, 0.4, 0.5], [0.4, 0.3, 0.2, 0.05]], [0.2, 0.3]
    with OrbaxCheckpointStore(
        store_dir, max_to_keep=1, keep_best=1, best_metric="loss", async_save=async_save
    ) as store:
        callback = CheckpointCallback(
            store,
            items=lambda _: {"model": {"w": np.zeros(2)}},
            every_n_steps=4,
            every_n_epochs=1,
            monitor="loss",
        )
        callback.on_train_begin(None)
        for epoch in range(2):
            callback.on_epoch_begin(None, epoch)
            for batch, loss in enumerate(batch_losses[epoch]):
                callback.on_batch_end(None, batch, {"loss": loss})
            callback.on_epoch_end(None, epoch, {"loss": epoch_losses[epoch]})
        callback.on_train_end(None)
        store.wait()
        assert store.list_steps() == [4, 8]
        assert store.best_step("loss") == 4
        assert store.read_metadata(8).metrics == {"loss": 0.3}
        _save(store, 9, 0.25)  # the next save: 8 is outranked by 4, and goes
        store.wait()
        assert store.list_steps() == [4, 9]


def test_a_best_metric_no_step_records_never_deletes(store_dir, caplog):
    """A misspelled best_metric keeps every step (with a warning); prune() refuses it."""
    with OrbaxCheckpointStore(
        store_dir, max_to_keep=1, keep_best=1, best_metric="lsos", async_save=False
    ) as store:
        for step, loss in [(1, 0.1), (2, 0.5), (3, 0.9)]:
            _save(store, step, loss)
        store.wait()
        assert store.list_steps() == [1, 2, 3]
        assert "'lsos', which no step records yet (the steps record: loss)" in caplog.text
        assert "every step is kept until one does" in caplog.text  # mid-epoch saves come first
        assert caplog.text.count("which no step records") == 1  # once per store, not per save
        with pytest.raises(BestMetricNotRecordedError) as raised:
            store.prune()
        assert raised.value.metric == "lsos"
        assert raised.value.recorded == ("loss",)
        assert isinstance(raised.value, ValueError)
        assert store.list_steps() == [1, 2, 3]
    with OrbaxCheckpointStore(
        store_dir, max_to_keep=1, keep_best=1, best_metric="loss", async_save=False
    ) as store:
        assert store.prune() == [2]


def test_keep_every(store_dir):
    with OrbaxCheckpointStore(store_dir, max_to_keep=1, keep_every=4) as store:
        for step in range(10):
            _save(store, step)
        store.wait()
        assert store.list_steps() == [0, 4, 8, 9]


def test_policy_validation():
    with pytest.raises(ValueError, match="best_metric"):
        RetentionPolicy(keep_best=1)
    with pytest.raises(ValueError, match="max_to_keep"):
        RetentionPolicy(max_to_keep=0)
    with pytest.raises(ValueError, match="mode"):
        RetentionPolicy(best_mode="up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep_best=-1 must be an integer >= 0"):
        RetentionPolicy(keep_best=-1)
    with pytest.raises(ValueError, match="keep_every=0 must be an integer >= 1"):
        RetentionPolicy(keep_every=0)
    with pytest.raises(TypeError, match=r"max_to_keep=2.5 must be an integer >= 1, not float"):
        RetentionPolicy(max_to_keep=2.5)  # type: ignore[arg-type]
    assert RetentionPolicy(max_to_keep=None).steps_to_keep([3, 1], {}) == {1, 3}


@pytest.mark.parametrize("mode", ["max", Mode.MAX])
def test_the_mode_is_a_mode_and_its_string_is_accepted(mode):
    policy = RetentionPolicy(max_to_keep=1, keep_best=1, best_metric="acc", best_mode=mode)
    assert policy.best_mode is Mode.MAX
    metrics = {1: {"acc": 0.9}, 2: {"acc": 0.1}, 3: {"acc": 0.5}}
    assert policy.steps_to_keep([1, 2, 3], metrics) == {1, 3}


def test_async_save_returns_before_commit_and_blocking_mode(store_dir, tmp_path):
    state = {"model": {"w": np.arange(1 << 20, dtype=np.float32)}}
    with OrbaxCheckpointStore(store_dir) as store:
        path = store.save(1, state)
        state["model"]["w"][:] = 0  # save returned: the values were copied already
        assert store.list_steps() == [1]
        store.wait()
        assert (path / "model").is_dir()
        assert store.restore(1).items["model"]["w"][5] == 5
    with OrbaxCheckpointStore(tmp_path / "blocking", async_save=False) as store:
        path = store.save(1, state)
        assert (path / "metadata" / "metadata").is_file()
        assert not [p for p in path.parent.iterdir() if "tmp" in p.name]


def test_background_write_error_surfaces_at_next_save(store_dir, monkeypatch):
    # An I/O error at the commit of step 1 (the rename of its temporary directory), injected at
    # the OS boundary, where a full or failing disk would raise it, in the background writer.
    rename = os.rename

    def failing_rename(src, dst, *args, **kwargs):
        if "orbax-checkpoint-tmp" in str(src) and Path(dst) == store_dir / "1":
            raise OSError(5, "injected I/O error while committing")
        return rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", failing_rename)
    state = {"model": {"w": np.arange(1 << 10, dtype=np.float32)}}
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, state)  # returns before the write is committed
        with pytest.raises(CheckpointWriteError) as error:
            store.save(2, state)
        assert error.value.step == 1
        assert "injected I/O error" in str(error.value)
        assert 1 not in store.list_steps()
        store.save(2, state)
        store.wait()
        assert store.list_steps() == [2]


@pytest.mark.parametrize("written_by", ["orbax", "store"])
def test_a_save_that_raises_the_previous_write_s_error_names_its_own_step_too(
    store_dir, monkeypatch, written_by
):
    # step 2's commit fails in the background; the save of step 3 raises that error and writes
    # nothing either: the error names both steps. Step 2 is orbax's first step of the tree, or
    # a step the store writes itself from step 1's files.
    rename = os.rename
    failing = store_dir / "2"

    def failing_rename(src, dst, *args, **kwargs):
        if "orbax-checkpoint-tmp" in str(src) and Path(dst) == failing:
            raise OSError(5, "injected I/O error while committing")
        return rename(src, dst, *args, **kwargs)

    state = {"model": {"w": np.arange(1 << 10, dtype=np.float32)}}
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        if written_by == "store":
            store.save(1, state)
            store.wait()
        monkeypatch.setattr(os, "rename", failing_rename)
        monkeypatch.setattr(Path, "rename", failing_rename)
        store.save(2, state)  # returns before the write is committed
        with pytest.raises(CheckpointWriteError) as error:
            store.save(3, state)
        assert error.value.step == 2
        assert error.value.unwritten == (2, 3)
        assert "injected I/O error" in str(error.value)
        assert "steps 2 and 3" in str(error.value)
        monkeypatch.undo()
        assert store.list_steps() == ([1] if written_by == "store" else [])
        store.save(3, state)
        store.wait()
        assert 3 in store.list_steps()


def test_a_write_error_raised_by_wait_names_only_its_step():
    error = CheckpointWriteError(step=4, directory=Path("/tmp/store"), cause="disk full")
    assert error.unwritten == (4,)
    assert "checkpoint step 4 in /tmp/store was not committed: disk full" in str(error)


@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_nan_or_infinite_metric_is_never_the_best(mode):
    policy = RetentionPolicy(max_to_keep=1, keep_best=1, best_metric="loss", best_mode=mode)
    for bad in (float("nan"), float("inf"), float("-inf")):
        metrics = {1: {"loss": bad}, 2: {"loss": 0.5}, 3: {"loss": 0.7}, 4: {"loss": 0.6}}
        assert policy.steps_to_keep([1, 2, 3, 4], metrics) == {4, 2 if mode == "min" else 3}
        nan_last = {1: {"loss": 0.5}, 2: {"loss": 0.7}, 3: {"loss": bad}, 4: {"loss": 0.9}}
        assert policy.steps_to_keep([1, 2, 3, 4], nan_last) == {4, 1 if mode == "min" else 4}


def test_partial_step_is_invisible_and_cleaned(store_dir):
    with OrbaxCheckpointStore(store_dir) as store:
        _save(store, 1, 0.5)
    partial = store_dir / "2.orbax-checkpoint-tmp-123"
    (partial / "model").mkdir(parents=True)
    (partial / "model" / "junk").write_bytes(os.urandom(16))
    with OrbaxCheckpointStore(store_dir) as store:
        assert store.list_steps() == [1]
        assert not partial.exists()
        _save(store, 2, 0.4)
        assert store.latest_step() == 2


def test_retention_deletes_a_step_only_once_the_next_is_committed_with_its_manifest(
    store_dir, monkeypatch
):
    """max_to_keep=1: the old step stays held (and restorable) until the new one is sealed."""
    from substrax.checkpoint import _save as save_module

    sealing = save_module.write_manifest
    held_at_seal: list[tuple[str, list[str]]] = []

    def seal(step_dir: Path) -> None:
        steps = sorted(p.name for p in store_dir.iterdir() if p.name.isdigit())
        held_at_seal.append((step_dir.name, steps))
        sealing(step_dir)

    monkeypatch.setattr(save_module, "write_manifest", seal)
    with OrbaxCheckpointStore(store_dir, max_to_keep=1) as store:
        _save(store, 1)
        store.wait()
        _save(store, 2)  # in flight: step 1 is still the only committed step
        assert 1 in store.list_steps()
        restored = store.restore(1)
        assert (restored.step, restored.verified) == (1, True)
        np.testing.assert_array_equal(restored.items["model"]["w"], np.full(4, 1.0))
        store.wait()
        assert store.list_steps() == [2]
    assert held_at_seal == [("1", ["1"]), ("2", ["1", "2"])]
    assert not (store_dir / "1").exists()
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [2]
        assert reader.restore(2).verified


def test_retention_and_prune_never_touch_folders_the_store_did_not_write(store_dir, caplog):
    for seed in ("0", "1"):  # a sweep's per-seed results, named like steps
        (store_dir / seed).mkdir(parents=True)
        (store_dir / seed / "results.csv").write_text("precious")
    with caplog.at_level("WARNING"):
        with OrbaxCheckpointStore(store_dir, max_to_keep=1) as store:
            _save(store, 100)
            _save(store, 200)
            store.wait()
            assert store.list_steps() == [200]
            assert store.prune() == []
            with pytest.raises(CheckpointNotWrittenError) as occupied:  # never replaced
                store.save(1, {"model": {"w": np.zeros(4)}}, overwrite=True)
            assert occupied.value.reason == "occupied"
            assert "move it out of the store" in str(occupied.value)
        with OrbaxCheckpointStore(store_dir, max_to_keep=1, read_only=True) as reader:
            assert reader.list_steps() == [200]
    for seed in ("0", "1"):
        assert (store_dir / seed / "results.csv").read_text() == "precious"
    messages = [record.getMessage() for record in caplog.records]
    warned = [message for message in messages if "is named like a checkpoint step" in message]
    assert len(warned) == 2, "said once for each folder, however often the store looks"
    assert all("leaves it in place" in message for message in warned)
