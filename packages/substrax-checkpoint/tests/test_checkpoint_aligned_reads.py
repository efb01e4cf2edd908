import asyncio

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest

from substrax.checkpoint import OrbaxCheckpointStore
from substrax.checkpoint._aligned_reads import (
    ALIGNMENT,
    AlignedArrayHandler,
    AlignedRegistry,
    aligned_empty,
)
from substrax.checkpoint._checksums import ChecksummedNumpyHandler, ChecksummedScalarHandler


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((), np.float32), ((7,), np.int8), ((3, 1000), ml_dtypes.bfloat16), ((1 << 20,), np.int64)],
)
def test_aligned_empty_starts_on_the_boundary(shape, dtype):
    for _ in range(8):  # several allocations, so a lucky malloc cannot pass the test
        buffer = aligned_empty(shape, np.dtype(dtype))
        assert buffer.shape == shape
        assert buffer.dtype == dtype
        assert buffer.flags.c_contiguous
        assert buffer.ctypes.data % ALIGNMENT == 0


def test_an_empty_shape_is_an_empty_array():
    assert aligned_empty((0, 4), np.dtype(np.float32)).shape == (0, 4)


def test_a_cpu_device_adopts_an_aligned_buffer_without_copying():
    buffer = aligned_empty((1 << 20,), np.dtype(np.float32))
    buffer[:] = 1.5
    placed = jax.device_put(buffer, jax.devices("cpu")[0])
    assert placed.unsafe_buffer_pointer() == buffer.ctypes.data


def test_the_registry_replaces_only_orbax_array_handlers():
    registry = AlignedRegistry(checksums=True)
    handler = registry.get(jax.Array)
    assert isinstance(handler, AlignedArrayHandler)
    assert registry.get(jax.Array) is handler
    assert handler.typestr() == ocp.type_handlers.get_type_handler(jax.Array).typestr()
    assert isinstance(registry.get(np.ndarray), ChecksummedNumpyHandler)
    assert isinstance(registry.get(int), ChecksummedScalarHandler)
    assert registry.get(str) is ocp.type_handlers.get_type_handler(str)
    assert registry.has(np.ndarray)
    assert not registry.has(object)


class _Recording(ocp.type_handlers.ArrayHandler):
    """Orbax's own handler, noting which parameters reach it."""

    def __init__(self) -> None:
        default = ocp.type_handlers.get_type_handler(jax.Array)
        super().__init__(array_metadata_store=default._array_metadata_store)
        self.names: list[str] = []

    async def deserialize(self, infos, args=None):
        self.names += [info.name for info in infos]
        return await super().deserialize(infos, args)


def test_plain_reads_skip_orbax_and_key_data_goes_through_it(tmp_path):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    sharded = jax.device_put(
        jnp.arange(64.0).reshape(8, 8), jax.NamedSharding(mesh, jax.P("data", "model"))
    )
    state = {"w": sharded, "counts": jnp.arange(5, dtype=jnp.uint32), "key": jax.random.key(1)}
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(1, {"model": state})
    recording = _Recording()
    handler = AlignedArrayHandler(recording)
    registry = ocp.type_handlers.create_type_handler_registry((jax.Array, handler))
    pytree = ocp.PyTreeCheckpointHandler(type_handler_registry=registry, use_ocdbt=False)
    with ocp.Checkpointer(pytree) as checkpointer:
        target = {"tree": state}
        restored = checkpointer.restore(
            tmp_path / "1" / "model",
            args=ocp.args.PyTreeRestore(
                item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)
            ),
        )["tree"]
    assert sorted(recording.names) == ["tree.counts", "tree.key"]
    assert restored["w"].sharding == sharded.sharding
    np.testing.assert_array_equal(restored["w"], sharded)
    np.testing.assert_array_equal(restored["counts"], np.arange(5))
    assert jax.dtypes.issubdtype(restored["key"].dtype, jax.dtypes.prng_key)


@pytest.mark.parametrize(
    "spec",
    [jax.P(), jax.P("data"), jax.P(None, "model"), jax.P("data", "model"), jax.P("model")],
    ids=["replicated", "rows", "columns", "both", "partly-replicated"],
)
def test_every_placement_restores_exactly(tmp_path, spec):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    sharding = jax.NamedSharding(mesh, spec)
    value = jax.device_put(jnp.arange(96.0).reshape(8, 12), sharding)
    scalar = jax.device_put(jnp.float32(2.5), jax.NamedSharding(mesh, jax.P()))
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(3, {"model": {"w": value, "s": scalar}})
        template = {"w": value, "s": scalar}
        restored = store.restore(3, templates={"model": template}).items["model"]
    assert restored["w"].sharding == sharding
    np.testing.assert_array_equal(restored["w"], value)
    for shard in restored["w"].addressable_shards:
        np.testing.assert_array_equal(shard.data, np.asarray(value)[shard.index])
    assert float(restored["s"]) == 2.5


def test_a_cast_read_lands_in_the_template_dtype(tmp_path):
    value = jnp.linspace(0.0, 1.0, 17, dtype=jnp.float32)
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(1, {"model": {"w": value}})
        template = {"w": jax.ShapeDtypeStruct((17,), jnp.bfloat16, sharding=value.sharding)}
        restored = store.restore(1, templates={"model": template}, cast_dtypes=True)
    w = restored.items["model"]["w"]
    assert w.dtype == jnp.bfloat16
    np.testing.assert_array_equal(w, value.astype(jnp.bfloat16))


def test_a_missing_array_file_is_an_error_not_a_hang(tmp_path):
    handler = AlignedArrayHandler(ocp.type_handlers.ArrayHandler())
    info = ocp.type_handlers.ParamInfo(
        name="absent",
        parent_dir=tmp_path,
        is_ocdbt_checkpoint=False,
        use_zarr3=True,
        ts_context=ocp.type_handlers.get_ts_context(use_ocdbt=False),
    )
    args = ocp.type_handlers.ArrayRestoreArgs(
        sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]),
        global_shape=(3,),
        dtype=np.float32,
    )
    with pytest.raises(ValueError, match="absent"):
        asyncio.run(handler.deserialize([info], [args]))
