"""Checked reads straight from the shard files: the same values TensorStore reads, any sharding."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts

from substrax.checkpoint import CheckpointCorruptError, OrbaxCheckpointStore, _checksums
from substrax.checkpoint._chunk_reads import chunk_layout, read_region


def _opened(path):
    return ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}).result()


def _layout_of(path):
    store = _opened(path)
    return chunk_layout(store.spec(retain_context=False).to_json(), store.dtype.numpy_dtype)


@pytest.mark.parametrize(
    ("saved", "restored"),
    [
        (jax.P("x"), jax.P(None, "x")),
        (jax.P(None, "x"), jax.P("x")),
        (None, jax.P("x", None)),
        (jax.P("x"), None),
    ],
)
def test_any_sharding_reads_back_the_saved_values_across_chunks(store_dir, saved, restored):
    mesh = jax.make_mesh((8,), ("x",))
    # 4224 x 1032 float32 is more than 16 MiB: a whole-array shard is written in two chunks
    values = np.arange(4224 * 1032, dtype=np.float32).reshape(4224, 1032)
    placed = (
        jnp.asarray(values)
        if saved is None
        else jax.device_put(values, jax.NamedSharding(mesh, saved))
    )
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": {"w": placed}})
    assert _layout_of(store_dir / "1" / "model" / "tree.w") is not None
    target = jax.ShapeDtypeStruct(
        values.shape,
        values.dtype,
        sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])
        if restored is None
        else jax.NamedSharding(mesh, restored),
    )
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        w = store.restore(1, templates={"model": {"w": target}}).items["model"]["w"]
    assert w.sharding == target.sharding
    np.testing.assert_array_equal(np.asarray(w), values)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((), np.float32), ((7,), np.int8), ((5, 3), np.bool_), ((33, 9), ml_dtypes.bfloat16)],
)
def test_small_and_odd_arrays_read_directly(store_dir, shape, dtype):
    rng = np.random.default_rng(0)
    values = (rng.random(shape) * 100).astype(dtype)
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": {"v": jnp.asarray(values)}})
    layout = _layout_of(store_dir / "1" / "model" / "tree.v")
    assert layout is not None
    out = np.empty(shape, dtype)
    assert read_region(layout, tuple((0, size) for size in shape), out)
    np.testing.assert_array_equal(out, values)
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        restored = store.restore(1, templates={"model": {"v": jnp.asarray(values)}})
    np.testing.assert_array_equal(np.asarray(restored.items["model"]["v"]), values)


@pytest.mark.parametrize(
    "options",
    [
        {"use_ocdbt": True},
        {"use_compression": True},
        {"use_checksums": False},
        {"use_zarr3": False},
    ],
    ids=["ocdbt", "zstd", "unchecked", "zarr2"],
)
def test_other_layouts_are_left_to_tensorstore(store_dir, options):
    with OrbaxCheckpointStore(store_dir, async_save=False, **options) as store:
        store.save(1, {"model": {"w": jnp.ones((4, 4))}})
    array = store_dir / "1" / "model" / "tree.w"
    if array.is_dir() and (array / "zarr.json").exists():
        assert _layout_of(array) is None


def test_a_chunk_not_stored_is_left_to_tensorstore(tmp_path):
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(tmp_path / "a")},
        "metadata": {
            "shape": [4, 4],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [2, 4],
                        "codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "crc32c"},
                        ],
                        "index_codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "crc32c"},
                        ],
                    },
                }
            ],
        },
        "dtype": "float32",
        "create": True,
    }
    array = ts.open(spec).result()
    array[2:, :].write(np.ones((2, 4), np.float32)).result()  # the first chunk stays fill values
    layout = _layout_of(tmp_path / "a")
    assert layout is not None
    assert not read_region(layout, ((0, 4), (0, 4)), np.empty((4, 4), np.float32))
    out = np.full((2, 4), 7.0, np.float32)
    assert read_region(layout, ((2, 4), (0, 4)), out)
    np.testing.assert_array_equal(out, np.ones((2, 4)))


def test_a_flipped_bit_in_a_shard_index_is_refused(store_dir):
    values = jnp.arange(64.0).reshape(8, 8)
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": {"w": values}})
    chunk = store_dir / "1" / "model" / "tree.w" / "c.0.0"
    data = bytearray(chunk.read_bytes())
    data[-10] ^= 0x01  # inside the index at the file's end
    chunk.write_bytes(bytes(data))
    with (
        OrbaxCheckpointStore(store_dir, read_only=True) as store,
        pytest.raises(CheckpointCorruptError, match="shard index"),
    ):
        store.restore(1, templates={"model": {"w": values}})


def test_arrays_are_written_with_flat_chunk_keys_one_directory_each(store_dir):
    values = {"m": jnp.arange(12.0).reshape(3, 4), "v": jnp.arange(5.0), "s": jnp.float32(2)}
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": values})
    item = store_dir / "1" / "model"
    for name, chunk in (("m", "c.0.0"), ("v", "c.0"), ("s", "c")):
        array = item / f"tree.{name}"
        assert sorted(p.name for p in array.iterdir()) == [chunk, "zarr.json"]
        layout = _layout_of(array)
        assert layout is not None
        assert layout.separator == "."


def test_steps_written_with_nested_chunk_keys_still_read_directly(store_dir, monkeypatch):
    """Steps saved before the flat keys (``c/0/0``) keep the direct checked reads."""
    monkeypatch.setattr(_checksums, "with_flat_keys", lambda spec: spec)
    values = np.arange(4224 * 1032, dtype=np.float32).reshape(4224, 1032)  # two chunks
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": {"w": jnp.asarray(values), "v": jnp.arange(3.0)}})
    array = store_dir / "1" / "model" / "tree.w"
    assert (array / "c" / "0" / "0").is_file()
    layout = _layout_of(array)
    assert layout is not None
    assert layout.separator == "/"
    out = np.empty_like(values)
    assert read_region(layout, ((0, 4224), (0, 1032)), out)
    np.testing.assert_array_equal(out, values)
    monkeypatch.undo()
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        restored = store.restore(1).items["model"]
    np.testing.assert_array_equal(np.asarray(restored["w"]), values)
    np.testing.assert_array_equal(np.asarray(restored["v"]), np.arange(3.0))
