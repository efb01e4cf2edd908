"""Steps the store writes itself from the files orbax wrote for the same tree."""

import json
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from substrax.checkpoint import CheckpointWriteError, OrbaxCheckpointStore
from substrax.checkpoint._manager import DELETED, TMP_MARK
from substrax.checkpoint._step_templates import _CONTEXT, capture, signature, write_step
from substrax.checkpoint._trees import for_saving


def _state(value: float) -> dict[str, object]:
    """A training state of every kind of leaf the store writes itself, filled with ``value``."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    return {
        "model": {
            "sharded": jax.device_put(
                jnp.full((16, 6), value), jax.NamedSharding(mesh, jax.P("data", "model"))
            ),
            "replicated": jax.device_put(jnp.full(5, value), jax.NamedSharding(mesh, jax.P())),
            "zeros": jnp.zeros((3, 3)),  # equal to the fill value: its chunk is written anyway
            "layers": [jnp.full(2, value, jnp.bfloat16), jnp.full((), int(value), jnp.int32)],
        },
        "rng": jax.random.key(int(value)),
        "data_iterator": {"order": np.full(4, value), "seed": np.int64(value)},
    }


def _files(step_dir: Path) -> dict[str, bytes]:
    return {
        path.relative_to(step_dir).as_posix(): path.read_bytes()
        for path in sorted(step_dir.rglob("*"))
        if path.is_file()
    }


def _assert_restores(store: OrbaxCheckpointStore, step: int, value: float) -> None:
    items = store.restore(step, templates={"rng": jax.random.key(0)}).items
    expected = _state(value)
    for got, want in zip(
        jax.tree.leaves(items["model"]), jax.tree.leaves(expected["model"]), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert jax.random.key_data(items["rng"]).tolist() == [0, int(value)]
    np.testing.assert_array_equal(items["data_iterator"]["order"], np.full(4, value))
    assert int(items["data_iterator"]["seed"]) == int(value)


@pytest.mark.parametrize(
    "layout",
    [{}, {"use_checksums": False}, {"use_compression": True}],
    ids=["default", "orbax-chunks", "compressed"],
)
def test_a_step_written_from_the_template_has_the_files_orbax_wrote(store_dir, layout):
    with OrbaxCheckpointStore(store_dir, **layout) as store:
        store.save(1, _state(3.0))  # orbax writes the tree's first step
        store.save(2, _state(3.0))  # the store writes the same values from step 1's files
        store.wait()
    orbax_files, own_files = _files(store_dir / "1"), _files(store_dir / "2")
    assert sorted(orbax_files) == sorted(own_files)
    differing = {path for path in orbax_files if orbax_files[path] != own_files[path]}
    # the record names its step, orbax's step metadata its timestamps, the markers their paths
    assert differing == {
        "_CHECKPOINT_METADATA",
        "metadata/metadata",
        *(path for path in orbax_files if path.endswith("commit_success.txt")),
    }
    assert json.loads(own_files["metadata/metadata"])["step"] == 2
    step_metadata = json.loads(own_files["_CHECKPOINT_METADATA"])
    assert (
        step_metadata["item_handlers"]
        == json.loads(orbax_files["_CHECKPOINT_METADATA"])["item_handlers"]
    )
    assert step_metadata["init_timestamp_nsecs"] <= step_metadata["commit_timestamp_nsecs"]
    assert str(store_dir / "2") in own_files["commit_success.txt"].decode()
    template = capture(store_dir / "1", *for_saving(_state(3.0)), ())
    assert template is not None
    arrays = [directory for found in template.arrays.values() for directory, _ in found]
    assert len(arrays) == 8
    assert not [path for path in template.files if path.startswith(tuple(arrays))]  # no chunks


def test_steps_written_from_templates_restore_in_the_store_and_in_plain_orbax(store_dir):
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        for step in range(1, 5):
            store.save(step, _state(float(step)))
        store.wait()
        for step in range(1, 5):
            _assert_restores(store, step, float(step))
    with ocp.CheckpointManager(store_dir) as manager:
        restored = manager.restore(4, args=ocp.args.Composite(model=ocp.args.PyTreeRestore()))
    np.testing.assert_array_equal(restored["model"]["tree"]["sharded"], np.full((16, 6), 4.0))
    np.testing.assert_array_equal(restored["model"]["tree"]["layers"][1], 4)


def test_a_changed_tree_goes_to_orbax_again_and_each_tree_restores(store_dir):
    small = {"model": {"w": jnp.full(3, 1.0)}}
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        store.save(1, _state(1.0))
        store.save(2, _state(2.0))
        store.save(3, small)  # another tree: orbax writes it
        store.save(4, _state(4.0))  # and this one orbax again: the template follows the tree
        store.save(5, _state(5.0))
        store.save(6, {"model": {"w": jnp.full(3, 6.0)}})
        store.save(7, {"model": {"w": jnp.full(4, 7.0)}})  # another shape
        store.wait()
        for step in (1, 2, 4, 5):
            _assert_restores(store, step, float(step))
        for step, value in ((3, [1.0] * 3), (6, [6.0] * 3), (7, [7.0] * 4)):
            assert store.restore(step).items["model"]["w"].tolist() == value


def test_python_scalar_leaves_leave_every_step_to_orbax(store_dir):
    with OrbaxCheckpointStore(store_dir) as store:
        for step in range(1, 4):
            store.save(step, {"model": {"w": jnp.full(2, float(step))}, "extensions": {"n": step}})
        store.wait()
        items = store.restore(3).items
    assert items["extensions"]["n"] == 3
    assert items["model"]["w"].tolist() == [3.0, 3.0]
    assert signature({"extensions": {"n": 3}}, {}) is None


def test_retention_drops_steps_written_from_templates(store_dir):
    with OrbaxCheckpointStore(store_dir, max_to_keep=2, keep_best=1, best_metric="loss") as store:
        for step, loss in zip(range(1, 7), (0.9, 0.1, 0.8, 0.7, 0.6, 0.5), strict=True):
            store.save(step, _state(float(step)), metrics={"loss": loss})
            assert store.list_steps()[-1] == step  # the step being written is listed
        store.wait()
        assert store.list_steps() == [2, 5, 6]
        assert store.best_step("loss") == 2
        _assert_restores(store, 6, 6.0)
        store.delete(5)
        assert store.list_steps() == [2, 6]
        assert store.prune() == []
    assert sorted(p.name for p in store_dir.iterdir() if p.name.isdigit()) == ["2", "6"]
    assert not list((store_dir / DELETED).iterdir())
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [2, 6]
        assert reader.best_step("loss") == 2


def test_a_failed_write_from_a_template_raises_names_its_step_and_the_store_goes_on(store_dir):
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, _state(1.0))
        store.save(2, _state(2.0))
        store.wait()
        (store_dir / f"3{TMP_MARK}").write_text("not a directory")  # in the temporary's place
        store.save(3, _state(3.0))
        with pytest.raises(CheckpointWriteError, match=r"step 3") as failed:
            store.wait()
        assert "NotADirectoryError" in str(failed.value)
        assert store.list_steps() == [1, 2]
        (store_dir / f"3{TMP_MARK}").unlink()
        store.save(3, _state(3.0))
        store.save(4, _state(4.0))
        store.wait()
        assert store.list_steps() == [1, 2, 3, 4]
        _assert_restores(store, 4, 4.0)


def test_a_write_that_fails_midway_leaves_no_temporary_directory(store_dir, monkeypatch):
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, _state(1.0))
        store.wait()

    def failing(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    template = capture(store_dir / "1", *for_saving(_state(1.0)), ("any",))
    assert template is not None
    monkeypatch.setattr(Path, "write_text", failing)
    with pytest.raises(OSError, match="No space left"):
        write_step(template, store_dir / "2", store_dir / f"2{TMP_MARK}", _state(2.0), {})
    assert sorted(p.name for p in store_dir.iterdir() if p.is_dir() and p.name[0] != ".") == ["1"]


def test_capture_refuses_a_step_of_another_tree(store_dir):
    def capturing(items, step=1):
        return capture(store_dir / str(step), *for_saving(items), ())

    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, {"model": {"w": jnp.zeros(3), "b": jnp.zeros(2)}})
    assert capturing({"model": {"w": jnp.zeros(3), "b": jnp.zeros(2)}}) is not None
    assert capturing({"model": {"w": jnp.zeros(4), "b": jnp.zeros(2)}}) is None
    assert capturing({"model": {"w": jnp.zeros(3)}}) is None  # b names no leaf
    assert capturing({"model": {"v": jnp.zeros(3), "b": jnp.zeros(2)}}) is None
    assert capturing({"model": {"w": np.zeros(3), "b": jnp.zeros(2)}}) is None  # dtypes record
    assert capturing({"model": {"w": jnp.zeros(3)}}, step=9) is None


def test_a_step_rewritten_with_another_tree_is_never_the_template_of_its_first_tree(store_dir):
    def a(value: int) -> dict[str, object]:
        return {"model": {"w": jnp.full(3, value)}, "rng": jax.random.PRNGKey(value)}

    def b(value: int) -> dict[str, object]:
        return {"model": {"w": np.full(3, value)}, "rng": jax.random.key(value)}

    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        store.save(1, a(1))
        store.save(2, a(2))  # from a's template
        store.save(3, b(3))  # orbax writes b
        store.save(3, a(33), overwrite=True)  # step 3 holds a's files now
        store.save(4, b(4))  # so b goes to orbax again, not to a template read from step 3
        store.save(5, b(5))
        store.wait()
        restored = {step: store.restore(step).items for step in (3, 4, 5)}
    assert isinstance(restored[3]["model"]["w"], jax.Array)
    for step in (4, 5):
        assert isinstance(restored[step]["model"]["w"], np.ndarray)
        assert restored[step]["model"]["w"].tolist() == [step] * 3
        assert jax.dtypes.issubdtype(restored[step]["rng"].dtype, jax.dtypes.prng_key)


def test_a_tree_whose_node_metadata_cannot_be_compared_is_saved_by_orbax(store_dir):
    @jax.tree_util.register_pytree_node_class
    class Box:
        def __init__(self, x: jax.Array, meta: np.ndarray) -> None:
            self.x, self.meta = x, meta

        def tree_flatten(self) -> tuple[tuple[jax.Array], np.ndarray]:
            return (self.x,), self.meta

        @classmethod
        def tree_unflatten(cls, meta: np.ndarray, children: tuple[jax.Array]) -> "Box":
            return cls(children[0], meta)

    with OrbaxCheckpointStore(store_dir) as store:
        for step in range(1, 5):
            store.save(step, {"model": {"box": Box(jnp.full(2, step), np.arange(3))}})
        store.wait()
        assert store.list_steps() == [1, 2, 3, 4]


def test_a_step_retention_drops_is_unlisted_from_the_save_on_as_with_orbax(store_dir):
    with OrbaxCheckpointStore(store_dir, max_to_keep=2) as store:
        for step in range(1, 6):
            store.save(step, {"model": {"w": jnp.full(4, float(step))}})
            oldest = store.list_steps()[0]
            assert store.restore(oldest).items["model"]["w"].tolist() == [float(oldest)] * 4
        assert store.list_steps() == [4, 5]


def test_a_store_removed_during_a_write_gets_no_step(store_dir, monkeypatch):
    import shutil

    from substrax.checkpoint import _save

    original = _save.write_step

    def removing(template, final, temporary, items, record, **kwargs):
        shutil.rmtree(store_dir)
        return original(template, final, temporary, items, record, **kwargs)

    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, _state(1.0))
        store.wait()
        monkeypatch.setattr(_save, "write_step", removing)
        store.save(2, _state(2.0))
        with pytest.raises(CheckpointWriteError, match="CheckpointStoreRemovedError"):
            store.wait()
        assert not (store_dir / "2").exists()
        assert not (store_dir / f"2{TMP_MARK}").exists()


def test_the_step_being_written_is_listed_while_the_writer_writes_it(store_dir, monkeypatch):
    from substrax.checkpoint import _save

    started, release = threading.Event(), threading.Event()
    original = _save.write_step

    def held(*args: object, **kwargs: object) -> None:
        started.set()
        assert release.wait(60)
        original(*args, **kwargs)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(_save, "write_step", held)
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, _state(1.0))
        store.save(2, _state(2.0))
        assert started.wait(60)
        assert store.list_steps() == [1, 2]
        assert store.latest_step() == 2
        release.set()
        store.wait()
        assert store.list_steps() == [1, 2]
        _assert_restores(store, 2, 2.0)


def test_arrays_written_from_templates_are_not_synced():
    assert _CONTEXT.spec.to_json() == {"file_io_sync": False}


def test_a_damaged_first_step_is_no_template_and_later_steps_go_to_orbax(store_dir):
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        store.save(1, _state(1.0))
        store.wait()
        (store_dir / "1" / "_CHECKPOINT_METADATA").write_text("{not json")  # a damaged disk
        store.save(2, _state(2.0))  # no template from step 1: orbax writes it
        store.save(3, _state(3.0))  # and step 2 is the template
        store.wait()
        assert store.list_steps() == [1, 2, 3]
        _assert_restores(store, 2, 2.0)
        _assert_restores(store, 3, 3.0)
    assert json.loads((store_dir / "2" / "_CHECKPOINT_METADATA").read_text())["item_handlers"]


_WRITER = """
import sys
import jax.numpy as jnp
from substrax.checkpoint import OrbaxCheckpointStore

with OrbaxCheckpointStore(sys.argv[1], max_to_keep=3) as store:
    for step in range(1, 81):  # every step after the first from the template
        store.save(step, {"model": {"w": jnp.full(1 << 18, step, jnp.float32)}})
"""


def test_a_reader_in_another_process_reads_only_whole_steps_the_writer_wrote_itself(store_dir):
    import subprocess
    import sys

    from substrax.checkpoint import CheckpointNotFoundError

    store_dir.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(store_dir)])
    read, unexpected = set[int](), list[str]()
    try:
        with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
            while writer.poll() is None:
                for step in reader.list_steps():
                    try:
                        w = np.asarray(reader.restore(step).items["model"]["w"])
                    except CheckpointNotFoundError:
                        continue  # retention dropped it before or while it was read
                    except Exception as error:  # every other error is a failure
                        unexpected.append(f"step {step}: {type(error).__name__}: {error}")
                        continue
                    if not (w == step).all():
                        unexpected.append(f"step {step} holds {w[:3]}")
                    read.add(step)
    finally:
        writer.wait(timeout=120)
    assert writer.returncode == 0
    assert unexpected == []
    assert len(read) > 1, "the reader read steps while the writer wrote them"
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [78, 79, 80]
