"""The store's batched array writes write what orbax's per-array writes do, within the byte limit."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from orbax.checkpoint._src.serialization import limits, replica_slices

from substrax.checkpoint import OrbaxCheckpointStore, _array_writes


def _on_host(*arrays: jax.Array) -> list[replica_slices.ReplicaSlices]:
    return list(replica_slices.transfer_arrays_to_host(arrays, 0, use_replica_parallel=False))


def _spec(path: str, shape: tuple[int, ...]) -> _array_writes.Spec:
    return {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": path},
        "metadata": {"shape": list(shape), "data_type": "float32"},
    }


def test_one_batch_without_a_limit_and_batches_under_a_limit() -> None:
    slices = _on_host(
        jnp.ones(100), jnp.ones(100), jnp.ones(300), jnp.ones(100)
    )  # bytes: 400, 400, 1200, 400
    writes = [(s, {}, ts.Context()) for s in slices]
    [(nbytes, batch)] = _array_writes.batches(writes, limits.UnlimitedInFlightBytes())
    assert nbytes == 2400
    assert batch == writes
    batched = _array_writes.batches(writes, limits.LimitInFlightBytes(1000))
    assert [(n, len(b)) for n, b in batched] == [(800, 2), (1200, 1), (400, 1)]  # 1200: alone
    assert [w for _, b in batched for w in b] == writes, "every write, in order"


def test_every_array_is_written_with_its_values(tmp_path) -> None:
    values = [np.arange(12, dtype=np.float32).reshape(3, 4), np.full(5, 2.5, np.float32)]
    slices = _on_host(*(jnp.asarray(v) for v in values))
    writes = [
        (s, _spec(str(tmp_path / f"a{i}"), v.shape), ts.Context())
        for i, (s, v) in enumerate(zip(slices, values, strict=True))
    ]
    _array_writes.write_arrays(writes, transaction=None, primary=True)
    for i, value in enumerate(values):
        stored = ts.open(
            {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / f"a{i}")}}
        ).result()
        np.testing.assert_array_equal(stored.read().result(), value)


def test_a_failed_open_raises_before_anything_is_left_waiting(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    [slices] = _on_host(jnp.ones(4))
    writes = [(slices, _spec(str(blocker / "array"), (4,)), ts.Context())]
    with pytest.raises(ValueError, match="array"):
        _array_writes.write_arrays(writes, transaction=None, primary=True)


def test_the_sharding_file_is_the_one_orbax_writes(tmp_path) -> None:
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    tree = {
        "w": jax.device_put(jnp.ones((16, 4)), jax.NamedSharding(mesh, jax.P("x"))),
        "b": jax.device_put(jnp.ones(4), jax.NamedSharding(mesh, jax.P())),
        "s": jnp.ones(3),
    }
    with OrbaxCheckpointStore(tmp_path / "store", async_save=False) as store:
        store.save(1, {"model": tree})
    with ocp.CheckpointManager(tmp_path / "orbax") as manager:
        manager.save(1, args=ocp.args.Composite(model=ocp.args.PyTreeSave({"tree": tree})))
        manager.wait_until_finished()
    ours = json.loads((tmp_path / "store" / "1" / "model" / "_sharding").read_text())
    theirs = json.loads((tmp_path / "orbax" / "1" / "model" / "_sharding").read_text())
    assert ours == theirs
    assert len(ours) == 3
