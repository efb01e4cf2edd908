"""The save path: validation, refusals decided once as a ``NotWrittenReason``, overwrites,
leaves whose stored names collide, and saves that fail before anything is written."""

import datetime
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from substrax.checkpoint import (
    CheckpointLeafNameCollisionError,
    CheckpointNotWrittenError,
    CheckpointWriteError,
    NotWrittenReason,
    OrbaxCheckpointStore,
)
from substrax.checkpoint._save import SaveRequest, refusal


def test_strict_writes(store_dir):
    items = {"model": {"w": np.zeros(2, np.float32)}}
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(5, items)
        with pytest.raises(CheckpointNotWrittenError) as exists:
            store.save(5, items)
        assert (exists.value.reason, exists.value.step, exists.value.latest_step) == (
            "exists",
            5,
            5,
        )
        assert exists.value.reason is NotWrittenReason.EXISTS
        assert "pass overwrite=True" in str(exists.value)
        with pytest.raises(CheckpointNotWrittenError) as below:
            store.save(3, items)
        assert below.value.reason == "below_latest"
        assert below.value.reason in {"exists", "below_latest", "rejected"}
        store.save(5, {"model": {"w": np.ones(2, np.float32)}}, overwrite=True)
        assert store.restore(5).items["model"]["w"].tolist() == [1.0, 1.0]
        with pytest.raises(ValueError, match=r"step=-1 must be an integer >= 0"):
            store.save(-1, items)
        with pytest.raises(TypeError, match=r"step=True must be an integer >= 0, not bool"):
            store.save(True, items)
        with pytest.raises(ValueError, match="unknown checkpoint item"):
            store.save(6, {"weights": 1})
        with pytest.raises(ValueError, match="at least one item"):
            store.save(6, {})
        with pytest.raises(ValueError, match="reserved"):
            store.save(6, items, extra={"step": 1})
        assert store.list_steps() == [5]


@pytest.mark.parametrize(
    ("step", "steps", "overwrite", "expected"),
    [
        (1, [], False, None),
        (6, [1, 5], False, None),
        (5, [1, 5], False, NotWrittenReason.EXISTS),
        (5, [1, 5], True, None),
        (1, [1, 5], True, NotWrittenReason.BELOW_LATEST),
        # a hostile finding: this was "exists", whose advice (overwrite=True) was refused next
        (1, [1, 5], False, NotWrittenReason.BELOW_LATEST),
        (3, [1, 5], False, NotWrittenReason.BELOW_LATEST),
        (3, [1, 5], True, NotWrittenReason.BELOW_LATEST),
    ],
)
def test_one_refusal_per_save(step, steps, overwrite, expected):
    assert refusal(step, steps, overwrite=overwrite) is expected
    assert refusal(step, steps, overwrite=overwrite, occupied=True) is NotWrittenReason.OCCUPIED


def test_a_reason_is_its_string_and_says_what_to_do():
    reasons = ["exists", "below_latest", "rejected", "occupied"]
    assert [reason.value for reason in NotWrittenReason] == reasons
    error = CheckpointNotWrittenError(step=2, latest_step=4, reason="rejected")
    assert error.reason is NotWrittenReason.REJECTED
    assert str(error).endswith(NotWrittenReason.REJECTED.advice)
    with pytest.raises(ValueError, match="'later'"):
        CheckpointNotWrittenError(step=2, latest_step=4, reason="later")  # type: ignore[arg-type]


def test_a_request_holds_what_orbax_writes():
    request = SaveRequest.build(
        3,
        {"model": {"w": np.float32(2.0)}},
        epoch=1,
        metrics={"loss": 1},
        producer=None,
        extra={"note": "x"},
    )
    assert request.items["model"]["w"].shape == ()  # a NumPy scalar saved as a 0-d array
    assert request.dtypes["model"] == {"w": "float32"}
    assert (request.entry().epoch, dict(request.entry().metrics)) == (1, {"loss": 1.0})
    assert sorted(request.orbax_args(request.items)) == ["dtypes", "metadata", "model"]


def test_a_request_records_host_leaves_and_refuses_what_orbax_cannot_store():
    def build(items):
        return SaveRequest.build(1, items, epoch=None, metrics=None, producer=None, extra=None)

    request = build({"data_iterator": {"order": np.arange(2), "seed": np.int8(3), "position": 4}})
    assert request.dtypes == {
        "data_iterator": {"order": "int64", "seed": "int8"},
        "host_leaves": {"data_iterator": {"order": "ndarray", "seed": "numpy_scalar"}},
        "shapes": {"data_iterator": {"order": [2], "seed": []}},
    }
    huge = "leaf 'position' is the Python int 1180591620717411303424, which no 64-bit integer"
    with pytest.raises(ValueError, match=f"item 'data_iterator' {huge} holds; save it as"):
        build({"data_iterator": {"position": 2**70}})
    empty = r"item 'model' leaf 'mask' is an empty array \(shape \(0, 3\)\): orbax cannot"
    with pytest.raises(ValueError, match=empty):
        build({"model": {"mask": np.zeros((0, 3))}})


@pytest.mark.parametrize("dtype", ["uint4", "uint2"])
def test_a_dtype_tensorstore_cannot_store_is_refused_at_the_save(store_dir, dtype):
    # it failed only at wait(), with orbax's traceback logged, and the step was gone
    leaf = jnp.zeros(4, getattr(jnp, dtype))
    with OrbaxCheckpointStore(store_dir) as store:
        message = rf"item 'model' leaf 'w' has dtype {dtype}, which TensorStore .* cannot store"
        with pytest.raises(TypeError, match=message):
            store.save(1, {"model": {"w": leaf, "b": np.zeros(2)}})
        store.save(1, {"model": {"w": leaf.astype(jnp.uint8), "b": np.zeros(2)}})
        store.wait()
        assert store.restore(1).items["model"]["w"].dtype == jnp.uint8


def _colliding(kind: str, make) -> tuple[dict, tuple[str, str], str]:
    """A tree two of whose leaves orbax would store (or the store record) under one name, their
    paths and that name."""
    if kind == "dotted_key":
        return {"a.b": make(1.0), "a": {"b": make(2.0)}}, ("a.b", "a/b"), "a.b"
    if kind == "slashed_key":  # orbax's names differ (a/b, a.b); the store's records would not
        return {"a/b": make(1.0), "a": {"b": make(2.0)}}, ("['a/b']", "['a']['b']"), "a/b"
    if kind == "trailing_slash":  # hostile finding: TensorStore drops the "/", one array kept
        return {"a/": make(1.0), "a": make(2.0)}, ("a/", "a"), "a"
    return {"x": [make(1.0)], "x.0": make(2.0)}, ("x/0", "x.0"), "x.0"


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "blocking"])
@pytest.mark.parametrize("leaves", ["numpy", "jax"])
@pytest.mark.parametrize("kind", ["dotted_key", "dotted_index", "slashed_key", "trailing_slash"])
def test_leaves_whose_stored_names_collide_are_refused_naming_both(
    store_dir, async_save, leaves, kind
):
    make = (
        (lambda v: np.full(3, v, np.float32)) if leaves == "numpy" else (lambda v: jnp.full(3, v))
    )
    tree, paths, stored = _colliding(kind, make)
    with OrbaxCheckpointStore(store_dir, max_to_keep=None, async_save=async_save) as store:
        for step in (1, 2):  # orbax writes a first step of a tree, the store a second one itself
            with pytest.raises(CheckpointLeafNameCollisionError) as error:
                store.save(step, {"model": tree})
            assert isinstance(error.value, ValueError)
            assert error.value.item == "model"
            assert set(error.value.paths) == set(paths)
            assert error.value.stored_name == stored
            assert all(repr(path) in str(error.value) for path in paths)
            store.save(step, {"model": {"a": make(float(step))}})  # nothing of it was kept
        store.wait()
        assert store.list_steps() == [1, 2]
        assert store.best_step("loss") is None


@pytest.mark.parametrize("use_ocdbt", [True, False], ids=["ocdbt", "files"])
def test_a_trailing_slash_collision_is_refused_in_either_layout(store_dir, use_ocdbt):
    """Hostile finding: both leaves restored as one of them (which one varied), verify said ok."""
    with OrbaxCheckpointStore(store_dir, use_ocdbt=use_ocdbt, async_save=False) as store:
        with pytest.raises(CheckpointLeafNameCollisionError, match="TensorStore drops a trailing"):
            store.save(1, {"model": {"a/": jnp.ones(3), "a": jnp.zeros(3)}})
        with pytest.raises(CheckpointLeafNameCollisionError) as error:
            store.save(1, {"model": {"a": {"b/": jnp.ones(2)}, "a.b": jnp.zeros(2)}})
        assert error.value.stored_name == "a.b"
        assert store.list_steps() == []


@pytest.mark.parametrize(
    ("tree", "shown", "why"),
    [
        # hostile findings: saved and verified, then no restore found the array
        ({"a\\b": 1.0}, r"\['a\\\\b'\]", "TensorStore reads"),
        ({"a/b": 1.0, "a\\b": 2.0}, r"\['a\\\\b'\]", "TensorStore reads"),
        # a bare ValueError (or FAILED_PRECONDITION) from orbax's threads after the write began
        ({"a//b": 1.0}, r"\['a//b'\]", "with '//' in a key"),
        ({"x/../y": 1.0}, r"\['x/../y'\]", "a folder named '..'"),
        ({"a\0b": 1.0}, r"\['a\\x00b'\]", "a NUL ends"),
        ({"k" * 300: 1.0}, r"\['k{300}'\]", "is over 255 bytes"),
        ({"a.__lock": 1.0}, r"\['a\.__lock'\]", "TensorStore's '.__lock'"),
        ({"a": 1.0, "a/c/0": 2.0}, r"\['a/c/0'\]", "'c' holds the leaf \\['a'\\]'s data"),
        ({"a": 1.0, "a/zarr.json": 2.0}, r"\['a/zarr\.json'\]", "holds the leaf"),
        # the writer's own restore raised CheckpointCorruptError (orbax read tree.x, tree.x.y)
        ({"x/": 1.0, "x": {"y": 2.0}}, r"\['x'\]\['y'\]", "extends the leaf \\['x/'\\]"),
    ],
)
def test_a_key_a_store_without_ocdbt_cannot_store_is_refused_naming_it(store_dir, tree, shown, why):
    tree = jax.tree.map(lambda value: np.full(2, value, np.float32), tree)
    with OrbaxCheckpointStore(store_dir, use_ocdbt=False, async_save=False) as store:
        with pytest.raises(ValueError, match=f"item 'model' leaf {shown} cannot be stored with"):
            store.save(1, {"model": tree})
        with pytest.raises(ValueError, match=f"{why}.*open the store with use_ocdbt=True"):
            store.save(1, {"model": tree})
        assert store.list_steps() == []


def test_keys_a_store_without_ocdbt_can_store_are_kept(store_dir):
    """A leaf folder inside another's, and a str (kept in orbax's JSON) under any key."""
    tree = {"a": np.ones(2), "a/b": np.zeros(2), "a\\b": "text", "./c": np.full(2, 2.0)}
    with OrbaxCheckpointStore(store_dir, use_ocdbt=False, async_save=False) as store:
        store.save(1, {"model": tree})
        restored = store.restore(1, templates={"model": tree}).items["model"]
    assert restored["a\\b"] == "text"
    assert [restored[key].tolist() for key in ("a", "a/b", "./c")] == [[1, 1], [0, 0], [2, 2]]


@pytest.mark.parametrize(
    ("leaf", "async_save"),
    [
        ("datetime", False),
        ("object", False),
        ("bytes", False),
        ("complex", False),
        ("donated", False),
        ("donated", True),
    ],
)
def test_a_save_that_fails_at_once_leaves_no_trace_in_the_index(store_dir, leaf, async_save):
    def bad() -> object:
        if leaf == "datetime":
            return datetime.datetime.now(tz=datetime.UTC)
        if leaf == "object":
            return np.array([object()], dtype=object)
        if leaf == "bytes":
            return b"abc"
        if leaf == "complex":
            return 1 + 2j
        donated = jnp.ones(3)
        jax.jit(lambda a: a + 1, donate_argnums=0)(donated)
        return donated  # deleted by the donation

    good = {"model": {"w": np.ones(3, np.float32)}}
    with OrbaxCheckpointStore(store_dir, max_to_keep=None, async_save=async_save) as store:
        store.save(1, good, metrics={"loss": 0.5})
        store.wait()
        with pytest.raises(Exception):  # noqa: B017, PT011 - whatever jax or orbax raise
            store.save(2, {"model": {"w": bad()}}, metrics={"loss": 0.1})
        assert store.best_step("loss") == 1
        assert store.latest_step() == 1
        assert store.list_steps() == [1]
        assert store.restore(store.best_step("loss")).step == 1
        store.save(2, good, metrics={"loss": 0.7})  # the step can be saved again
        store.wait()
        assert store.list_steps() == [1, 2]
        assert store.best_step("loss") == 1
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.best_step("loss") == 1
        assert reader.read_metadata(2).metrics == {"loss": 0.7}


@pytest.mark.parametrize("async_save", [False, True])
def test_a_donated_array_is_refused_naming_its_leaf(store_dir, async_save):
    """Hostile finding: jax's bare "Array has been deleted" named neither the leaf nor a fix."""
    donated = jnp.ones(4)
    jax.jit(lambda a: a + 1, donate_argnums=0)(donated)
    items = {"model": {"layer": {"kernel": donated}, "bias": jnp.ones(2)}}
    with OrbaxCheckpointStore(store_dir, async_save=async_save) as store:
        with pytest.raises(
            ValueError, match=r"item 'model' leaf 'layer/kernel' is a jax\.Array th"
        ):
            store.save(1, items)
        assert store.list_steps() == []


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"metrics": {"loss": "low"}}, TypeError, "metric 'loss' must be a number, not 'low'"),
        ({"metrics": {"loss": "0.5"}}, TypeError, "metric 'loss' must be a number"),
        ({"metrics": {"ok": True}}, TypeError, "metric 'ok' must be a number, not the bool True"),
        ({"metrics": {"ok": np.bool_(False)}}, TypeError, "metric 'ok' .* not the bool False"),
        ({"metrics": {"ok": jnp.asarray(True)}}, TypeError, "metric 'ok' .* not the bool"),
        ({"producer": {"name": "p"}}, TypeError, r"producer must be a Producer\(name=..."),
        # hostile findings: a name that is no str broke a later save's retention with a bare
        # TypeError; a list of pairs gave an AttributeError
        ({"metrics": {7: 1.0}}, TypeError, "metric name 7 must be a str"),
        ({"metrics": [("loss", 1.0)]}, TypeError, "metrics must be a mapping"),
    ],
)
def test_a_save_refuses_a_wrong_type_by_name_and_writes_nothing(store_dir, options, error, match):
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        with pytest.raises(error, match=match):
            store.save(1, {"model": {"w": np.zeros(2)}}, **options)
        assert store.list_steps() == []


def test_a_metric_past_floats_range_is_an_infinity_and_a_numpy_step_is_a_step(store_dir):
    """Hostile findings: 10**400 raised a bare OverflowError naming no metric; save refused
    np.int64(2) where restore takes it."""
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(np.int64(2), {"model": {"w": np.zeros(2)}}, metrics={"loss": 10**400})
        assert store.list_steps() == [2]
        assert store.read_metadata(2).metrics == {}  # set aside, as NaN and infinities are
        assert store.read_metadata(2).extra["nonfinite_metrics"] == {"loss": "inf"}


def test_a_numpy_epoch_is_an_epoch(store_dir):
    """Hostile finding: save(step=np.int64(7)) was taken, epoch=np.int64(3) a TypeError."""
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(np.int64(7), {"model": {"w": np.zeros(2)}}, epoch=np.int64(3))
        epoch = store.read_metadata(7).epoch
    assert (epoch, type(epoch)) == (3, int)


def test_a_folder_named_with_leading_zeros_hides_no_step(store_dir):
    """Hostile finding: a foreign folder "0005" hid the real step 5 from the writer: restore()
    took step 4, best_step named 4, retention never deleted 5, and save(5, overwrite=True) was
    refused as occupied."""
    (store_dir / "0005").mkdir(parents=True)
    (store_dir / "0005" / "results.csv").write_text("a\n")
    with OrbaxCheckpointStore(store_dir, max_to_keep=3, async_save=False) as store:
        for step in range(1, 6):
            store.save(step, {"model": {"w": np.full(2, float(step))}}, metrics={"loss": 1 / step})
        assert store.list_steps() == [3, 4, 5]
        assert store.restore(None).step == 5
        assert store.best_step("loss") == 5
        store.save(5, {"model": {"w": np.zeros(2)}}, overwrite=True)
        for step in range(6, 9):
            store.save(step, {"model": {"w": np.zeros(2)}})
        assert store.list_steps() == [6, 7, 8]
    assert not (store_dir / "5").exists()
    assert (store_dir / "0005" / "results.csv").exists()


@pytest.mark.parametrize(("step", "error"), [("5", TypeError), (-1, ValueError), (1.0, TypeError)])
def test_a_read_refuses_a_step_that_is_no_step_number(store_dir, step, error):
    # restore("5") said "no checkpoint step 5 ... (steps held: 5)"
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(5, {"model": {"w": np.zeros(2)}})
        with pytest.raises(error, match="step"):
            store.restore(step)
        with pytest.raises(error, match="step"):
            store.read_metadata(step)
        assert store.restore(np.int64(5)).step == 5


@pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("failure", ["datetime", "donated", "commit"])
def test_a_failed_overwrite_keeps_the_step_it_would_replace(
    store_dir, monkeypatch, failure, async_save
):
    rename = os.rename

    def failing_commit(src, dst, *args, **kwargs):  # a full disk as orbax commits the new step
        if "orbax-checkpoint-tmp" in str(src) and Path(dst) == store_dir / "2":
            raise OSError(28, "injected: no space left on device")
        return rename(src, dst, *args, **kwargs)

    def bad() -> object:
        if failure == "datetime":
            return datetime.datetime.now(tz=datetime.UTC)
        if failure == "commit":
            monkeypatch.setattr(os, "rename", failing_commit)
            return np.zeros(3, np.float32)
        donated = jnp.ones(3)
        jax.jit(lambda a: a + 1, donate_argnums=0)(donated)
        return donated  # deleted by the donation

    old = {"model": {"w": np.arange(3, dtype=np.float32)}}
    with OrbaxCheckpointStore(store_dir, max_to_keep=None, async_save=async_save) as store:
        store.save(1, old, metrics={"loss": 0.5})
        store.save(2, old, metrics={"loss": 0.4})
        store.wait()

        def overwrite() -> None:
            store.save(2, {"model": {"w": bad()}}, metrics={"loss": 0.1}, overwrite=True)
            store.wait()  # an asynchronous write fails here

        with pytest.raises(Exception) as raised:  # noqa: PT011 - a refusal, or the write's error
            overwrite()
        if failure == "datetime" and not async_save:  # orbax refused the leaf: its own error
            assert raised.type is ValueError
            assert "TypeHandler" in str(raised.value)
        if failure == "commit":  # blocking or not, it is the failed write's error
            assert raised.type is CheckpointWriteError
            assert "step 2 in" in str(raised.value)
            assert "OSError: [Errno 28] injected: no space left on device" in str(raised.value)
        monkeypatch.setattr(os, "rename", rename)
        assert store.list_steps() == [1, 2]
        assert store.best_step("loss") == 2
        kept = store.restore(2)
        np.testing.assert_array_equal(kept.items["model"]["w"], old["model"]["w"])
        assert kept.metadata.metrics == {"loss": 0.4}
        assert kept.verified
        store.save(
            2, {"model": {"w": np.ones(3, np.float32)}}, metrics={"loss": 0.9}, overwrite=True
        )
        store.wait()
        assert store.restore(2).metadata.metrics == {"loss": 0.9}
        assert store.best_step("loss") == 1
    assert not list((store_dir / ".substrax-replaced").iterdir()), "the replaced step is gone"
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1, 2]
        assert reader.best_step("loss") == 1


def test_a_save_onto_a_folder_that_is_not_a_step_is_refused(store_dir):
    (store_dir / "7").mkdir(parents=True)
    (store_dir / "7" / "notes.txt").write_text("mine")
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        for overwrite in (False, True):
            with pytest.raises(CheckpointNotWrittenError, match="not a checkpoint step") as error:
                store.save(7, {"model": {"w": np.zeros(2)}}, overwrite=overwrite)
            assert error.value.reason is NotWrittenReason.OCCUPIED
        assert store.list_steps() == []
    assert (store_dir / "7" / "notes.txt").read_text() == "mine"


def test_an_overwrite_whose_old_step_cannot_be_moved_aside_changes_nothing(store_dir, monkeypatch):
    rename = os.rename

    def refused(src, dst, *args, **kwargs):
        if ".substrax-replaced" in str(dst):
            raise PermissionError(13, "injected: permission denied", str(dst))
        return rename(src, dst, *args, **kwargs)

    old = {"model": {"w": np.arange(3, dtype=np.float32)}}
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(2, old, metrics={"loss": 0.4})
        monkeypatch.setattr(os, "rename", refused)
        with pytest.raises(CheckpointWriteError, match="could not be moved aside") as error:
            store.save(2, {"model": {"w": np.ones(3)}}, metrics={"loss": 0.1}, overwrite=True)
        assert "injected: permission denied" in str(error.value)
        monkeypatch.setattr(os, "rename", rename)
        assert store.list_steps() == [2]
        assert store.best_step("loss") == 2
        assert store.read_metadata(2).metrics == {"loss": 0.4}
        np.testing.assert_array_equal(store.restore(2).items["model"]["w"], old["model"]["w"])
