import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.checkpoint import (
    FORMAT_NAME,
    Checkpoint,
    CheckpointMetadata,
    CheckpointNotFoundError,
    CheckpointStore,
    OrbaxCheckpointStore,
    Producer,
    UnsupportedCheckpointError,
)


def test_spec_checkpoint_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
    with OrbaxCheckpointStore("checkpoints/demo", max_to_keep=3) as store:
        store.save(100, {"model": nnx.state(model)}, epoch=2, metrics={"loss": 0.25})
        store.save(200, {"model": nnx.state(model)}, metrics={"loss": 0.20})

        assert store.list_steps() == [100, 200]
        assert store.best_step("loss") == 200
        fresh = nnx.Linear(4, 4, rngs=nnx.Rngs(1))
        checkpoint = store.restore(100, templates={"model": nnx.state(fresh)})
        nnx.update(fresh, checkpoint.items["model"])
        assert checkpoint.metadata.epoch == 2

        as_stored = store.restore(200).items["model"]
    np.testing.assert_array_equal(fresh.kernel[...], model.kernel[...])
    np.testing.assert_array_equal(as_stored["kernel"]["value"], model.kernel[...])
    assert isinstance(store, CheckpointStore)


def test_quick_start_shape(tmp_path, monkeypatch):
    """The spec's quick start without the parts other packages own (mesh, spmd, callbacks)."""
    monkeypatch.chdir(tmp_path)
    model = nnx.Linear(8, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    batch = {"x": jnp.ones((32, 8)), "y": jnp.zeros((32, 1))}

    @nnx.jit
    def train_step(model, optimizer, batch):
        def loss_fn(model):
            return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    with OrbaxCheckpointStore("checkpoints/quick-start", max_to_keep=2) as store:
        for step in range(5):
            loss = train_step(model, optimizer, batch)
            store.save(step, {"model": nnx.state(model)}, metrics={"loss": float(loss)})
        latest = store.latest_step()
        checkpoint = store.restore(latest, templates={"model": nnx.state(model)})
        nnx.update(model, checkpoint.items["model"])
        assert checkpoint.metadata.metrics["loss"] == float(loss)
        assert store.list_steps() == [3, 4]


def test_every_item_kind_round_trips(store_dir):
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    items = {
        "model": nnx.state(model),
        "optimizer": nnx.state(optimizer),
        "rng": jax.random.key(3),
        "data_iterator": {"position": 17, "name": "shard-3", "fraction": 0.5, "order": [3, 1]},
        "extensions": {"ema": jnp.arange(4.0), "counts": np.arange(3, dtype=np.int32)},
    }
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, items, producer=Producer(name="artifex", version="1.0"), extra={"run": "a"})
        bare = store.restore(1)
        templated = store.restore(
            1, templates={"model": nnx.state(model), "rng": jax.random.key(0)}
        )
    assert bare.items["data_iterator"] == {
        "position": 17,
        "name": "shard-3",
        "fraction": 0.5,
        "order": [3, 1],
    }
    np.testing.assert_array_equal(bare.items["extensions"]["counts"], np.arange(3))
    key = templated.items["rng"]
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    assert jax.random.key_data(key).tolist() == jax.random.key_data(jax.random.key(3)).tolist()
    assert isinstance(templated.items["model"], nnx.State)
    assert templated.metadata.producer == Producer(name="artifex", version="1.0")
    assert templated.metadata.extra == {"run": "a"}
    assert isinstance(templated, Checkpoint)


def test_layout_is_format_version_1(store_dir):
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, {"model": {"w": np.ones(2, np.float32)}, "rng": jax.random.key(0)})
    step = store_dir / "1"
    record = json.loads((step / "metadata" / "metadata").read_text())
    assert record["format"] == FORMAT_NAME
    assert record["format_version"] == 1
    assert record["items"] == ["model", "rng"]
    assert json.loads((step / "dtypes" / "metadata").read_text()) == {
        "model": {"w": "float32"},
        "rng": {"": "key<fry>"},
        "host_leaves": {"model": {"w": "ndarray"}},
        "shapes": {"model": {"w": [2]}, "rng": {"": []}},
    }
    assert (step / "_CHECKPOINT_METADATA").is_file()


def test_missing_step_and_empty_store(store_dir):
    store = OrbaxCheckpointStore(store_dir)
    assert store.list_steps() == []
    assert store.latest_step() is None
    assert store.best_step("loss") is None
    # a writer creates the directory and takes its lock at open; nothing else before a save
    assert [path.name for path in store_dir.iterdir()] == [".substrax-writer.lock"]
    with pytest.raises(CheckpointNotFoundError) as error:
        store.restore(3)
    assert error.value.step == 3
    assert error.value.directory == store_dir
    with pytest.raises(CheckpointNotFoundError):
        store.delete(3)
    store.close()


def test_empty_directory_is_refused():
    with pytest.raises(ValueError, match="directory is empty"):
        OrbaxCheckpointStore("  ")


def test_metadata_record_is_strict():
    record = CheckpointMetadata(step=1, items=("model",), metrics={"loss": 1})
    data = record.to_dict()
    assert CheckpointMetadata.from_dict(data) == record
    with pytest.raises(ValueError, match="Unexpected keyword"):
        CheckpointMetadata.from_dict({**data, "unknown": 1})
    with pytest.raises(UnsupportedCheckpointError, match="format None"):
        CheckpointMetadata.from_dict({k: v for k, v in data.items() if k != "format"})
    with pytest.raises(ValueError, match="unknown checkpoint item"):
        CheckpointMetadata(step=1, items=("weights",))
    with pytest.raises(ValueError, match="step=-1 must be an integer >= 0"):
        CheckpointMetadata(step=-1, items=("model",))
    with pytest.raises(ValueError, match="epoch=-2 must be an integer >= 0"):
        CheckpointMetadata(step=1, epoch=-2, items=("model",))
    with pytest.raises(TypeError, match="metric 'loss'=True must be a finite number, not bool"):
        CheckpointMetadata(step=1, items=("model",), metrics={"loss": True})
    with pytest.raises(ValueError, match="metric 'loss'=inf must be a finite number; records"):
        CheckpointMetadata(step=1, items=("model",), metrics={"loss": float("inf")})
    assert Producer.from_dict({"name": "a", "version": "1"}) == Producer(name="a", version="1")


@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_non_finite_metric_is_saved_aside_and_never_ranked(store_dir, mode):
    state = {"model": {"w": np.zeros(2, np.float32)}}
    policy = {"max_to_keep": 1, "keep_best": 1, "best_metric": "loss", "best_mode": mode}
    with OrbaxCheckpointStore(store_dir, **policy) as store:
        store.save(1, state, metrics={"loss": 0.5, "acc": 0.25})
        for step, value in ((2, float("inf")), (3, float("-inf")), (4, float("nan"))):
            store.save(step, state, metrics={"loss": value, "acc": 0.5})
        store.wait()
        assert store.best_step("loss", mode=mode) == 1
        assert store.list_steps() == [1, 4]  # the best finite loss and the newest step
        record = store.read_metadata(4)
        assert record.metrics == {"acc": 0.5}
        assert record.extra == {"nonfinite_metrics": {"loss": "nan"}}
        assert [*record.nonfinite_metrics] == ["loss"]
        assert np.isnan(record.nonfinite_metrics["loss"])
        assert store.read_metadata(1).nonfinite_metrics == {}
        with pytest.raises(ValueError, match="nonfinite_metrics"):  # the store's own key
            store.save(5, state, extra={"nonfinite_metrics": {}})
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.best_step("loss", mode=mode) == 1


@pytest.mark.usefixtures("child_processes")
def test_import_needs_no_flax_and_opening_initialises_no_backend(tmp_path):
    import subprocess
    import sys

    code = (
        "import jax\n"
        "from jax._src import xla_bridge\n"
        "from substrax.checkpoint import OrbaxCheckpointStore\n"
        f"store = OrbaxCheckpointStore({str(tmp_path / 's')!r})\n"
        "store.list_steps(); store.best_step('loss')\n"
        "assert not xla_bridge.backends_are_initialized(), 'backend initialised'\n"
        "import sys\n"
        "assert 'flax' not in sys.modules, 'flax imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_resolve_checkpoint_dir(tmp_path):
    from substrax.checkpoint import resolve_checkpoint_dir

    assert resolve_checkpoint_dir(None, tmp_path) == tmp_path / "checkpoints"
    assert resolve_checkpoint_dir(tmp_path / "x", tmp_path) == tmp_path / "x"
    assert not (tmp_path / "checkpoints").exists()
    with pytest.raises(ValueError, match="neither"):
        resolve_checkpoint_dir(None, None)


def test_a_step_directory_renamed_or_copied_is_not_a_step(store_dir, caplog, capsys):
    from substrax.checkpoint._cli import main

    with OrbaxCheckpointStore(store_dir, max_to_keep=None, async_save=False) as store:
        for step in (1, 2, 3):
            store.save(step, {"model": {"w": np.full(4, step, np.float32)}}, metrics={"loss": step})
    (store_dir / "3").rename(store_dir / "7")
    shutil.copytree(store_dir / "1", store_dir / "9")
    with caplog.at_level("WARNING"), OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1, 2]
        latest = reader.restore(None)
        assert (latest.step, latest.metadata.step) == (2, 2)
        np.testing.assert_array_equal(latest.items["model"]["w"], np.full(4, 2))
        for step in (7, 9):
            with pytest.raises(CheckpointNotFoundError):
                reader.restore(step)
        assert reader.best_step("loss") == 1
    assert "holds the metadata record of step 1, not of step 9" in caplog.text
    assert "holds the metadata record of step 3, not of step 7" in caplog.text
    assert "rename it back to 3, or move it out of the store" in caplog.text
    capsys.readouterr()
    assert main(["ls", "--json", str(store_dir)]) == 0
    assert [row["step"] for row in json.loads(capsys.readouterr().out)] == [1, 2]
    with OrbaxCheckpointStore(store_dir, max_to_keep=1) as writer:
        writer.save(10, {"model": {"w": np.zeros(4, np.float32)}})
        writer.wait()
        assert writer.list_steps() == [10]
    assert (store_dir / "7").is_dir(), "left in place"
    assert (store_dir / "9").is_dir(), "left in place"


def test_a_reader_s_best_step_follows_an_overwrite(store_dir):
    state = {"model": {"w": np.ones(2, np.float32)}}
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as writer:
        writer.save(1, state, metrics={"loss": 0.5})
        writer.save(2, state, metrics={"loss": 0.4})
        writer.wait()
        with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
            assert reader.best_step("loss") == 2
            writer.save(2, state, metrics={"loss": 0.9}, overwrite=True)
            writer.wait()
            assert reader.list_steps() == [1, 2]
            assert reader.best_step("loss") == 1
            assert reader.read_metadata(2).metrics == {"loss": 0.9}


@pytest.mark.parametrize("kind", ["ref", "hijax"])
def test_ref_and_hijax_variables_are_refused_by_name_and_their_plain_copy_round_trips(
    store_dir, kind
):
    with nnx.var_defaults(**{kind: True}):  # orbax has no handler for a jax.Ref or a hijax value
        model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    plain = nnx.Linear(3, 2, rngs=nnx.Rngs(1))
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        with pytest.raises(TypeError, match=r"^save \(item 'model'\) takes .*; bias holds a "):
            store.save(1, {"model": nnx.state(model)})
        assert store.list_steps() == []  # nothing written, nothing left behind
        store.save(2, {"model": nnx.with_vars(nnx.state(model), ref=False, hijax=False)})
        with pytest.raises(TypeError, match=r"^restore \(template 'model'\) takes .*with_vars"):
            store.restore(2, templates={"model": nnx.state(model)})
        nnx.update(plain, store.restore(2, templates={"model": nnx.state(plain)}).items["model"])
    np.testing.assert_array_equal(plain.kernel[...], model.kernel[...])
