import jax
import jax.numpy as jnp
import numpy as np

from substrax.checkpoint import OrbaxCheckpointStore
from substrax.checkpoint._manager import snapshot


def _donating_step():
    return jax.jit(lambda key, w: (jax.random.split(key)[0], w * 2), donate_argnums=(0, 1))


def test_numpy_leaves_and_containers_are_copied():
    counts = np.arange(4)
    tree = {"counts": counts, "order": [3, 1]}
    frozen = snapshot({"data_iterator": tree})
    assert frozen is not None
    counts[:] = 0
    tree["order"].append(9)
    assert frozen.items["data_iterator"]["counts"].tolist() == [0, 1, 2, 3]
    assert frozen.items["data_iterator"]["order"] == [3, 1]


def test_pinned_buffers_are_not_donated_until_the_snapshot_is_dropped():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    weights = jax.device_put(jnp.arange(64.0), jax.NamedSharding(mesh, jax.P("data")))
    key = jax.random.key(0)
    frozen = snapshot({"model": {"w": weights}, "rng": key})
    assert frozen is not None
    assert len(frozen.pins) == 8 + 1  # one view per shard, one for the key's data
    step = _donating_step()
    key_2, weights_2 = step(key, weights)
    assert not weights.is_deleted()
    assert not key.is_deleted()
    np.testing.assert_array_equal(weights, np.arange(64.0))
    del frozen
    step(key_2, weights_2)
    assert weights_2.is_deleted()
    assert key_2.is_deleted()


def test_a_donating_step_right_after_an_async_save_leaves_the_checkpoint_intact(tmp_path):
    weights = jnp.arange(1 << 16, dtype=jnp.float32)
    key = jax.random.key(7)
    with OrbaxCheckpointStore(tmp_path) as store:
        store.save(1, {"model": {"w": weights}, "rng": key})
        step = _donating_step()
        for _ in range(3):  # the training loop goes on while the write runs
            key, weights = step(key, weights)
        store.wait()
        restored = store.restore(1, templates={"rng": jax.random.key(0)}).items
    np.testing.assert_array_equal(restored["model"]["w"], np.arange(1 << 16, dtype=np.float32))
    assert jax.random.key_data(restored["rng"]).tolist() == [0, 7]


def test_arrays_off_the_cpu_are_copied_on_their_device_with_their_sharding(monkeypatch):
    """An accelerator's arrays (CPU devices standing in for one) are copied, not viewed."""
    from substrax.checkpoint import _manager

    monkeypatch.setattr(_manager, "_on_host", lambda _leaf: False)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    weights = jax.device_put(jnp.arange(64.0), jax.NamedSharding(mesh, jax.P("data")))
    key = jax.random.key(3)
    frozen = snapshot({"model": {"w": weights}, "rng": key})
    assert frozen is not None
    assert frozen.pins == ()
    copied, copied_key = frozen.items["model"]["w"], frozen.items["rng"]
    assert copied is not weights
    assert copied.sharding == weights.sharding
    step = _donating_step()
    step(key, weights)  # the originals donated: the copies stay
    assert weights.is_deleted()
    np.testing.assert_array_equal(copied, np.arange(64.0))
    assert jax.random.key_data(copied_key).tolist() == [0, 3]
