"""Batch placement and batch-size verdicts of substrax.devices, on the 8 emulated CPU devices."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from substrax.devices import (
    BatchDimensionError,
    BatchDtypeError,
    BatchSizeMismatchError,
    BatchSizeVerdict,
    DevicePlacement,
    HardwareType,
    UnknownHardwareError,
    batch_size_verdict,
    distribute_batch,
    get_batch_size_recommendation,
    place_on_device,
    replicate_across_devices,
    shard_batch_dim,
)


def _mesh(shape: dict[str, int]) -> Mesh:
    count = int(np.prod(list(shape.values())))
    return Mesh(np.array(jax.devices()[:count]).reshape(tuple(shape.values())), tuple(shape))


def test_distribute_batch_gives_each_local_device_its_rows():
    batch = {"x": np.arange(32.0).reshape(16, 2), "y": np.arange(16), "name": "b0", "n": 3}
    placed = distribute_batch(batch)
    assert placed["name"] == "b0"
    assert placed["n"] == 3
    for key in ("x", "y"):
        array = placed[key]
        assert isinstance(array, jax.Array)
        assert array.devices() == set(jax.local_devices())
        np.testing.assert_array_equal(np.asarray(array), batch[key])
        for shard in array.addressable_shards:
            assert shard.data.shape[0] == 2
            np.testing.assert_array_equal(np.asarray(shard.data), batch[key][shard.index])


def test_distribute_batch_over_chosen_devices_and_dimension():
    chosen = jax.devices()[2:6]
    placed = distribute_batch({"x": np.ones((3, 8))}, chosen, batch_axis=1)
    assert placed["x"].devices() == set(chosen)
    assert {shard.data.shape for shard in placed["x"].addressable_shards} == {(3, 2)}


def test_shard_batch_dim_splits_the_chosen_dimension_over_one_mesh_axis():
    mesh = _mesh({"data": 4, "model": 2})
    batch = {"tokens": np.arange(2 * 8 * 3).reshape(2, 8, 3), "lengths": jnp.arange(8.0)}
    placed = shard_batch_dim({"tokens": batch["tokens"]}, mesh, batch_axis=1)
    tokens = placed["tokens"]
    assert tokens.sharding == NamedSharding(mesh, PartitionSpec(None, "data"))
    assert tokens.addressable_shards[0].data.shape == (2, 2, 3)  # replicated over "model"
    np.testing.assert_array_equal(np.asarray(tokens), batch["tokens"])
    lengths = shard_batch_dim(batch["lengths"], mesh, mesh_axis="model")
    assert lengths.sharding.spec == PartitionSpec("model")
    np.testing.assert_array_equal(np.asarray(lengths), np.arange(8.0))


def test_an_uneven_batch_is_refused_naming_the_leaf_and_the_fix():
    mesh = _mesh({"data": 8})
    with pytest.raises(BatchDimensionError) as info:
        shard_batch_dim({"rows": {"x": np.ones((12, 2))}}, mesh)
    error = info.value
    assert isinstance(error, ValueError)
    assert (error.path, error.shape, error.batch_axis, error.parts) == (
        "['rows']['x']",
        (12, 2),
        0,
        8,
    )
    assert "12 rows" in str(error)
    assert "multiple of 8" in str(error)
    with pytest.raises(BatchDimensionError, match=r"^the batch has shape \(12, 2\)"):
        shard_batch_dim(np.ones((12, 2)), mesh)  # one array: no leaf path to name


def test_a_leaf_without_the_batch_dimension_is_refused_with_the_replicate_hint():
    with pytest.raises(BatchDimensionError, match="no dimension 1") as info:
        distribute_batch({"x": np.ones((8, 2)), "scale": np.float32(2.0)}, batch_axis=1)
    assert info.value.path == "['scale']"
    assert "replicate_across_devices" in str(info.value)


def test_bad_arguments_are_value_errors():
    mesh = _mesh({"data": 2})
    with pytest.raises(ValueError, match="mesh_axis 'batch'"):
        shard_batch_dim(np.ones((2,)), mesh, mesh_axis="batch")
    with pytest.raises(ValueError, match="batch_axis"):
        shard_batch_dim(np.ones((2,)), mesh, batch_axis=-1)
    with pytest.raises(ValueError, match="devices is empty"):
        replicate_across_devices(np.ones(2), [])


def test_numpy_strings_bytes_and_objects_pass_through_like_python_strings():
    names, raw = np.array(["a", "bc"] * 4), np.array([b"x"] * 8)
    blobs = np.array([{}] * 8, dtype=object)
    batch = {"x": np.ones((8, 2)), "names": names, "raw": raw, "blobs": blobs, "s": np.str_("t")}
    placed = distribute_batch(batch)
    for key in ("names", "raw", "blobs", "s"):
        assert placed[key] is batch[key]
    assert placed["x"].sharding.spec == PartitionSpec("data")
    replicated = replicate_across_devices({"names": names, "w": np.ones(2)})
    assert replicated["names"] is names
    assert replicated["w"].sharding.is_fully_replicated


def test_a_big_endian_array_is_placed_in_native_byte_order():
    rows = np.arange(16, dtype=">f4").reshape(8, 2)
    placed = distribute_batch({"x": rows, "i": np.arange(8, dtype=">i8")})
    assert placed["x"].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(placed["x"]), rows)
    np.testing.assert_array_equal(np.asarray(placed["i"]), np.arange(8))
    mesh = _mesh({"data": 4})
    assert shard_batch_dim(rows, mesh).dtype == np.float32
    assert float(replicate_across_devices(np.array(2.5, dtype=">f8"))) == 2.5


@pytest.mark.parametrize(
    ("leaf", "dtype", "words"),
    [
        (np.ma.masked_array(np.ones((8, 2)), mask=np.zeros((8, 2))), "float64", "masked array"),
        (np.arange(8).astype("datetime64[s]"), "datetime64[s]", "convert it"),
        (np.zeros(8, dtype=[("a", "f4")]), "[('a', '<f4')]", "convert it"),
    ],
)
def test_a_numpy_leaf_jax_cannot_hold_is_refused_naming_its_path_and_dtype(leaf, dtype, words):
    for place in (distribute_batch, replicate_across_devices):
        with pytest.raises(BatchDtypeError) as info:
            place({"rows": {"x": np.ones((8, 2)), "bad": leaf}})
        error = info.value
        assert isinstance(error, TypeError)
        assert (error.path, error.dtype) == ("['rows']['bad']", dtype)
        assert error.masked == isinstance(leaf, np.ma.MaskedArray)
        assert "['rows']['bad']" in str(error)
        assert words in str(error)


@pytest.mark.parametrize(
    ("leaf", "narrow"),
    [
        (np.array([2**40 + i for i in range(8)], np.int64), "int32"),
        (np.array([2**63] * 8, np.uint64), "uint32"),
        (np.array([1e300, np.nan] * 4), "float32"),
    ],
)
def test_a_64_bit_leaf_jax_would_narrow_out_of_range_is_refused(leaf, narrow):
    assert not jax.config.jax_enable_x64  # jax's default: 64-bit leaves are cut to 32 bits
    for place in (distribute_batch, replicate_across_devices, place_on_device):
        with pytest.raises(BatchDtypeError) as info:
            place({"ids": leaf})
        error = info.value
        assert (error.path, error.dtype, error.narrow) == ("['ids']", str(leaf.dtype), narrow)
        assert (error.low, error.high) == (np.nanmin(leaf).item(), np.nanmax(leaf).item())
        assert "jax_enable_x64" in str(error)
        assert "cast the leaf" in str(error)


def test_64_bit_leaves_whose_values_fit_32_bits_are_placed_as_before():
    batch = {
        "ids": np.arange(2**31 - 8, 2**31, dtype=np.int64),
        "x": np.array([np.nan, np.inf, -np.inf, 3.5] * 2),
        "empty": np.zeros((8, 0), np.uint64),
    }
    placed = distribute_batch(batch)
    assert placed["ids"].dtype == jnp.int32
    assert np.asarray(placed["ids"]).tolist() == batch["ids"].tolist()
    np.testing.assert_array_equal(np.asarray(placed["x"]), batch["x"])


def test_leaves_with_different_batch_sizes_are_refused_naming_both():
    with pytest.raises(BatchSizeMismatchError) as info:
        distribute_batch({"x": np.ones((16, 2)), "y": np.ones((8,))})
    error = info.value
    assert isinstance(error, ValueError)
    assert (error.path, error.size, error.other_path, error.other_size, error.batch_axis) == (
        "['x']",
        16,
        "['y']",
        8,
        0,
    )
    assert "['x'] and ['y']" in str(error)
    assert "16 rows against 8" in str(error)
    with pytest.raises(BatchSizeMismatchError, match="dimension 1: 8 rows against 16"):
        distribute_batch({"a": np.ones((3, 8)), "b": np.ones((3, 16))}, batch_axis=1)


@pytest.mark.parametrize("axis", [np.int64(1), np.int32(1), np.uint8(1)])
def test_a_numpy_integer_batch_axis_is_an_axis(axis):
    placed = distribute_batch({"x": np.ones((3, 8))}, batch_axis=axis)
    assert placed["x"].sharding.spec == PartitionSpec(None, "data")
    on_mesh = shard_batch_dim(np.ones((3, 8)), _mesh({"data": 4}), batch_axis=axis)
    assert on_mesh.sharding.spec == PartitionSpec(None, "data")
    with pytest.raises(TypeError, match="not bool"):
        distribute_batch({"x": np.ones((8, 2))}, batch_axis=True)
    with pytest.raises(TypeError, match="not float64"):
        distribute_batch({"x": np.ones((8, 2))}, batch_axis=np.float64(0))
    with pytest.raises(ValueError, match=">= 0"):
        distribute_batch({"x": np.ones((8, 2))}, batch_axis=np.int64(-1))


@pytest.mark.parametrize("place", [distribute_batch, replicate_across_devices])
def test_devices_must_be_distinct_jax_devices(place):
    first = jax.devices()[0]
    with pytest.raises(ValueError, match=r"names CpuDevice\(id=0\) more than once") as info:
        place({"x": np.ones((8, 2))}, [first, jax.devices()[1], first])
    assert "3 entries, 2 distinct" in str(info.value)
    with pytest.raises(TypeError, match=r"devices\[1\]=1 \(int\) is not a jax device"):
        place({"x": np.ones((8, 2))}, [first, 1])
    with pytest.raises(TypeError, match="is one device; pass a sequence"):
        place({"x": np.ones((8, 2))}, first)
    chosen = place({"x": np.ones((8, 2))}, iter(jax.devices()[:2]))
    assert chosen["x"].devices() == set(jax.devices()[:2])


def test_replicate_gives_every_device_the_whole_array():
    params = {"w": np.arange(6.0).reshape(2, 3), "key": jax.random.key(0), "tag": "p"}
    placed = replicate_across_devices(params)
    w = placed["w"]
    assert w.sharding.is_fully_replicated
    assert len(w.addressable_shards) == jax.local_device_count()
    for shard in w.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), params["w"])
    assert placed["key"].devices() == set(jax.local_devices())
    assert (
        jax.random.key_data(placed["key"]).tolist() == jax.random.key_data(params["key"]).tolist()
    )
    assert placed["tag"] == "p"
    # a replicated array feeds a computation with a sharded batch
    batch = distribute_batch({"x": np.ones((8, 2))})
    assert float(jnp.sum(batch["x"] @ w)) == pytest.approx(8 * np.sum(params["w"]))


def test_the_verdict_refuses_an_uneven_split_with_the_nearest_multiples():
    verdict = batch_size_verdict(12, 8, hardware_type=HardwareType.TPU_V4)
    assert isinstance(verdict, BatchSizeVerdict)
    assert not verdict
    assert verdict.per_device_batch_size is None
    assert verdict.reason == (
        "12 rows do not split evenly over 8 devices (4 left over); use a multiple of 8, e.g. 8 or 16"
    )
    small = batch_size_verdict(3, 8, hardware_type=HardwareType.CPU)
    assert not small
    assert small.reason.endswith("e.g. 8")


def test_the_verdict_marks_a_batch_below_the_critical_size_suboptimal():
    tpu = get_batch_size_recommendation(HardwareType.TPU_V4)
    verdict = batch_size_verdict(64, 8, hardware_type=HardwareType.TPU_V4)
    assert verdict
    assert verdict.suboptimal
    assert verdict.per_device_batch_size == 8
    assert f"critical batch size of {tpu.critical_batch_size}" in verdict.reason
    assert f"{tpu.optimal_batch_size * 8} rows" in verdict.reason
    big = batch_size_verdict(tpu.critical_batch_size * 8, 8, hardware_type=HardwareType.TPU_V4)
    assert big
    assert not big.suboptimal


def test_the_verdict_on_unknown_hardware_judges_the_split_alone():
    with pytest.raises(UnknownHardwareError):
        get_batch_size_recommendation(HardwareType.UNKNOWN)
    verdict = batch_size_verdict(16, 8, hardware_type=HardwareType.UNKNOWN)
    assert verdict
    assert not verdict.suboptimal
    assert "no entry for UNKNOWN" in verdict.reason


def test_the_verdict_reads_the_visible_devices_by_default():
    verdict = batch_size_verdict(256)
    assert (verdict.num_devices, verdict.hardware_type) == (8, HardwareType.CPU)
    assert verdict.per_device_batch_size == 32
    assert verdict
    assert not verdict.suboptimal  # the CPU entry's critical size is 32


@pytest.mark.parametrize(
    ("args", "error"),
    [((0, 8), ValueError), ((8, 0), ValueError), ((True, 8), TypeError), ((8.0, 8), TypeError)],
)
def test_the_verdict_checks_its_numbers(args, error):
    with pytest.raises(error):
        batch_size_verdict(*args, hardware_type=HardwareType.CPU)


def test_the_verdict_takes_numpy_integers_and_hardware_names():
    verdict = batch_size_verdict(np.int64(64), np.int32(8), hardware_type="h100")
    assert verdict == batch_size_verdict(64, 8, hardware_type=HardwareType.H100)
    assert type(verdict.batch_size) is int
    assert type(verdict.num_devices) is int
    assert batch_size_verdict(64, 8, hardware_type="TPU_V4").hardware_type is HardwareType.TPU_V4
    with pytest.raises(TypeError, match="not bool"):
        batch_size_verdict(np.True_, 8, hardware_type=HardwareType.CPU)
    with pytest.raises(ValueError, match=r"hardware_type='a6000' names no HardwareType.*H100"):
        batch_size_verdict(64, 8, hardware_type="a6000")
    with pytest.raises(TypeError, match=r"hardware_type=1\.0 must be a HardwareType"):
        batch_size_verdict(64, 8, hardware_type=1.0)  # type: ignore[arg-type]
    ok, _ = DevicePlacement().validate_batch_size(np.int64(256), warn_suboptimal=False)
    assert ok
    assert DevicePlacement().get_batch_size_recommendation("v100").critical_batch_size == 139


def test_device_placement_keeps_the_0_1_22_names_over_the_functions(caplog):
    placement = DevicePlacement()
    assert placement.default_device == jax.devices()[0]
    assert placement.hardware_type is HardwareType.CPU
    assert placement.num_devices == 8
    moved = placement.place_on_device({"a": np.ones(2)})
    assert moved["a"].devices() == {jax.devices()[0]}
    with pytest.raises(TypeError, match=r"default_device=5 \(int\) is not a jax device"):
        DevicePlacement(5)  # type: ignore[arg-type]
    elsewhere = DevicePlacement(jax.devices()[5])
    assert elsewhere.place_on_device(np.ones(2)).devices() == {jax.devices()[5]}
    assert placement.place_on_device(np.ones(2), jax.devices()[1]).devices() == {jax.devices()[1]}
    assert placement.replicate_across_devices(np.ones(2)).sharding.is_fully_replicated
    mesh = _mesh({"data": 8})
    assert placement.shard_batch_dim(np.ones((8, 2)), mesh).sharding.spec == PartitionSpec("data")
    assert placement.get_batch_size_recommendation().critical_batch_size == 32
    assert placement.get_batch_size_recommendation(HardwareType.V100).critical_batch_size == 139
    ok, reason = placement.validate_batch_size(12)
    assert (ok, reason) == (False, batch_size_verdict(12).reason)
    with caplog.at_level(logging.WARNING, logger="substrax.devices"):
        assert placement.validate_batch_size(64, warn_suboptimal=False)[0]
        assert not caplog.records
        assert placement.validate_batch_size(64)[0]
    assert [r.getMessage() for r in caplog.records] == [
        f"batch size 64: {batch_size_verdict(64).reason}"
    ]
