import hashlib
import json
import math
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest

from substrax.checkpoint import (
    CURRENT_FORMAT_VERSION,
    CheckpointCorruptError,
    CheckpointMetadata,
    OrbaxCheckpointStore,
    UnsupportedCheckpointError,
    upgrade_checkpoints,
)
from substrax.checkpoint._cli import main


def _digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_format2_is_read_in_memory(format2_store):
    with OrbaxCheckpointStore(format2_store, read_only=True) as store:
        assert store.list_steps() == [7]
        record = store.read_metadata(7)
        checkpoint = store.restore(
            7,
            templates={"model": {"params": {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3)}}},
            cast_dtypes=True,
        )
        assert store.best_step("loss") == 7
    assert record.items == ("model",)
    assert record.metrics == {"loss": 0.125}
    assert record.created_at.startswith("2023-11-14T22:13:20")
    assert record.extra == {
        "model_type": "dict",
        "model_class": "dict",
        "physics_metadata": {"pde": "darcy"},
        "upgraded_from": {"format_version": 2},
    }
    np.testing.assert_array_equal(
        checkpoint.items["model"]["params"]["w"], np.arange(6, dtype=np.float32).reshape(2, 3)
    )


def test_upgrade_copies_format2_without_touching_the_source(format2_store, tmp_path):
    before = _digest(format2_store)
    destination = tmp_path / "upgraded"
    assert main(["upgrade", str(format2_store), str(destination)]) == 1  # float64 narrowing
    assert not any(destination.rglob("metadata")), "a failed upgrade wrote no step"
    import jax

    jax.config.update("jax_enable_x64", True)
    try:
        destination = tmp_path / "upgraded-x64"
        assert upgrade_checkpoints(format2_store, destination) == [7]
    finally:
        jax.config.update("jax_enable_x64", False)
    assert _digest(format2_store) == before
    raw = json.loads((destination / "7" / "metadata" / "metadata").read_text())
    record = CheckpointMetadata.from_dict(raw)
    assert record.format_version == CURRENT_FORMAT_VERSION
    assert record.extra["upgraded_from"] == {"format_version": 2}
    with OrbaxCheckpointStore(destination) as store:
        model = store.restore(7, cast_dtypes=True).items["model"]
    np.testing.assert_array_equal(model["params"]["w"], np.arange(6).reshape(2, 3))


def test_upgrade_copies_a_step_saved_with_a_nan_metric_and_a_failure_leaves_no_copy(tmp_path):
    """Hostile finding: a step with a NaN metric failed the upgrade (its own record was refused
    as a user's extra key) and left the steps before it in the destination."""
    source = tmp_path / "source"
    with OrbaxCheckpointStore(source) as store:
        for step, loss in [(1, 0.5), (2, math.nan), (3, 0.4)]:
            store.save(step, {"model": {"w": np.full(2, step)}}, metrics={"loss": loss})
    assert upgrade_checkpoints(source, tmp_path / "copy") == [1, 2, 3]
    with OrbaxCheckpointStore(tmp_path / "copy", read_only=True) as copy:
        record = copy.read_metadata(2)
        assert (record.metrics, record.nonfinite_metrics.keys()) == ({}, {"loss"})
        assert math.isnan(record.nonfinite_metrics["loss"])
        assert copy.best_step("loss") == 3
    for file in (source / "3").rglob("*"):  # a step the upgrade cannot read
        if file.is_file() and file.stat().st_size > 0 and file.parent.name != "metadata":
            file.write_bytes(b"\0" * file.stat().st_size)
    empty = tmp_path / "empty"
    for destination in (tmp_path / "new", empty):
        empty.mkdir(exist_ok=True)
        with pytest.raises(CheckpointCorruptError) as raised:
            upgrade_checkpoints(source, destination)
        assert any("upgrading step 3" in note for note in raised.value.__notes__)
        assert not destination.exists() or not any(destination.iterdir())
    assert not [path.name for path in tmp_path.iterdir() if ".upgrading-" in path.name]


def _ctrl_c_at_the_first_save(tmp_path, monkeypatch, finished):
    """A store of steps 1-3 at ``tmp_path / "source"``, its copy's first save sending Ctrl-C to
    the main thread (each save's step and whether it was written whole go to ``finished``)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Ctrl-C is delivered to the main thread, which runs no test here")
    main_thread = threading.main_thread().ident
    assert main_thread is not None
    source = tmp_path / "source"
    with OrbaxCheckpointStore(source) as store:
        for step in (1, 2, 3):
            store.save(step, {"model": {"w": np.full(4, step)}})
    save = OrbaxCheckpointStore.save

    def save_while_ctrl_c_is_pressed(self, step, *args, **kwargs):
        if step == 1:
            signal.pthread_kill(main_thread, signal.SIGINT)
        written = save(self, step, *args, **kwargs)
        finished.append((step, written.is_dir()))
        return written

    monkeypatch.setattr(OrbaxCheckpointStore, "save", save_while_ctrl_c_is_pressed)
    return source


def test_ctrl_c_during_an_upgrade_finishes_the_write_in_flight_then_leaves_nothing(
    tmp_path, monkeypatch
):
    """Hostile finding: Ctrl-C during an upgrade removed the copy while orbax still wrote into
    it (its threads' tracebacks at exit). The copy runs on a thread of its own: the step being
    written is finished, no other starts, and then the copy is removed."""
    finished = []
    source = _ctrl_c_at_the_first_save(tmp_path, monkeypatch, finished)
    with pytest.raises(KeyboardInterrupt):
        upgrade_checkpoints(source, tmp_path / "copy")
    assert finished[:1] == [(1, True)], "the write in flight was cut short"
    assert all(whole for _, whole in finished)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["source"]


def test_a_ctrl_c_whose_keyboard_interrupt_is_lost_still_stops_the_upgrade(tmp_path, monkeypatch):
    """A third pass: a Ctrl-C whose KeyboardInterrupt Python dropped (raised in jax's gc
    callback) let the upgrade copy every step and exit 0. Here the handler in place raises
    nothing, as such a Ctrl-C does: the upgrade still stops, leaves nothing, and raises."""
    import signal

    source = _ctrl_c_at_the_first_save(tmp_path, monkeypatch, [])
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(signum))
    try:
        with pytest.raises(KeyboardInterrupt):
            upgrade_checkpoints(source, tmp_path / "copy")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT]  # the handler in place ran too
    assert sorted(path.name for path in tmp_path.iterdir()) == ["source"]


def test_upgrade_keeps_a_step_without_a_manifest_unverified(tmp_path):
    """Hostile finding: the copy of a step whose files were never checked (no manifest) got a
    manifest of what was read, damage included, and verify called it ok."""
    source = tmp_path / "source"
    with OrbaxCheckpointStore(source, use_ocdbt=False) as store:
        for step in (1, 2):
            store.save(step, {"model": {"w": np.arange(64, dtype=np.float32) * step}})
    (source / "2" / "substrax_manifest.json").unlink()
    assert upgrade_checkpoints(source, tmp_path / "copy") == [1, 2]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["copy", "source"]  # no staging
    with OrbaxCheckpointStore(tmp_path / "copy", read_only=True) as copy:
        assert copy.restore(1).verified
        assert not copy.restore(2).verified


def test_upgrade_refuses_bad_destinations(format2_store, tmp_path):
    with pytest.raises(ValueError, match="is the source"):
        upgrade_checkpoints(format2_store, format2_store)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        upgrade_checkpoints(format2_store, busy)


def test_format2_sidecar_is_refused_as_current_record():
    with pytest.raises(UnsupportedCheckpointError, match="upgrade"):
        CheckpointMetadata.from_dict({"step": 1, "checkpoint_version": "2.0"})


def test_reads_the_0_1_22_layout(tmp_path):
    """Format version 1 as 0.1.22 wrote it: OCDBT items under a ``tree`` node, JSON records."""
    root = tmp_path / "v0122"
    record = {
        "format": "substrax-checkpoint",
        "format_version": 1,
        "step": 1,
        "epoch": None,
        "items": ["model", "data_iterator"],
        "libraries": {"jax": "0.7.0", "substrax": "0.1.22"},
        "producer": None,
        "metrics": {"loss": 0.5},
        "extra": {"run": "a"},
        "created_at": "2026-01-01T00:00:00+00:00",
    }
    options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
    with ocp.CheckpointManager(root, options=options) as manager:
        manager.save(
            1,
            args=ocp.args.Composite(
                model=ocp.args.PyTreeSave({"tree": {"w": np.ones(3, np.float32)}}),
                data_iterator=ocp.args.PyTreeSave({"tree": {"position": 4}}),
                metadata=ocp.args.JsonSave(record),
                dtypes=ocp.args.JsonSave({"model": {"w": "float32"}, "data_iterator": {}}),
            ),
        )
    assert (root / "1" / "model" / "manifest.ocdbt").exists()
    with OrbaxCheckpointStore(root) as store:
        checkpoint = store.restore(1, templates={"model": {"w": np.zeros(3, np.float32)}})
        assert checkpoint.metadata.extra == {"run": "a"}
        assert checkpoint.items["data_iterator"] == {"position": 4}
        store.save(2, {"model": {"w": np.zeros(3, np.float32)}})
        assert store.list_steps() == [1, 2]
