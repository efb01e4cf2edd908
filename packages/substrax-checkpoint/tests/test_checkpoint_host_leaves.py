"""Host-side leaves (NumPy arrays and scalars, Python scalars) restore as they were saved.

Data iterators, NumPy RNG states and counters are saved beside the model; restored without a
template they come back with their stored dtypes and exact values whatever jax's x64 setting,
instead of being routed through jax arrays and narrowed to 32 bits.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from substrax.checkpoint import CheckpointDtypeMismatchError, OrbaxCheckpointStore


def host_state() -> dict[str, Any]:
    """One leaf of every host kind, each holding values a 32-bit round trip would change."""
    return {
        "arrays": {
            "int8": np.array([-128, 127], np.int8),
            "int16": np.array([-(2**15), 2**15 - 1], np.int16),
            "int32": np.array([-(2**31), 2**31 - 1], np.int32),
            "int64": np.array([-(2**63), 2**63 - 1, 2**40 + 1], np.int64),
            "uint8": np.array([0, 255], np.uint8),
            "uint16": np.array([0, 2**16 - 1], np.uint16),
            "uint32": np.array([0, 2**32 - 1], np.uint32),
            "uint64": np.array([0, 2**64 - 1, 2**53 + 1], np.uint64),
            "float16": np.array([0.1, -65504.0], np.float16),
            "bfloat16": np.array([0.1, 3.0e38], jnp.bfloat16),
            "float32": np.array([0.1, np.inf, -np.inf], np.float32),
            "float64": np.array([0.1, 1e300, np.nan, -0.0, 5e-324], np.float64),
            "complex64": np.array([1 + 2j, -0.5j], np.complex64),
            "complex128": np.array([1e300 + 1e-300j], np.complex128),
            "bool": np.array([True, False, True]),
            "matrix": np.arange(12, dtype=np.int64).reshape(3, 4) * 2**33,
            "zero_d": np.array(2**62 + 3, np.int64),
        },
        "numpy_scalars": {
            "int64": np.int64(2**62 + 1),
            "uint64": np.uint64(2**64 - 1),
            "int8": np.int8(-5),
            "float64": np.float64(0.1),
            "float32": np.float32(0.1),
            "complex128": np.complex128(1e300 + 2j),
            "bool": np.bool_(True),
        },
        "python": {
            "position": 2**40 + 7,
            "negative": -(2**63),
            "fraction": 0.1,
            "tiny": 5e-324,
            "flag": True,
            "off": False,
            "name": "shard-3",
        },
    }


def assert_same(restored: Any, saved: Any, path: str = "") -> None:
    """``restored`` is ``saved``: same containers, leaf types, dtypes, shapes and bytes."""
    if isinstance(saved, dict):
        assert isinstance(restored, dict), path
        assert sorted(restored) == sorted(saved), path
        for key, value in saved.items():
            assert_same(restored[key], value, f"{path}/{key}")
        return
    assert type(restored) is type(saved), (path, type(restored), type(saved))
    if isinstance(saved, np.ndarray | np.generic):
        assert restored.dtype == saved.dtype, (path, restored.dtype, saved.dtype)
        assert restored.shape == saved.shape, path
        assert np.asarray(restored).tobytes() == np.asarray(saved).tobytes(), path
    else:
        assert restored == saved, path


def test_host_leaves_restore_as_saved_without_templates(store_dir):
    saved = host_state()
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(0, {"data_iterator": saved, "extensions": saved["arrays"]["int64"]})
        restored = store.restore(0).items
    assert_same(restored["data_iterator"], saved)
    assert_same(restored["extensions"], saved["arrays"]["int64"])


@pytest.mark.x64
def test_host_leaves_restore_as_saved_with_x64_on(store_dir):
    saved = host_state()
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(0, {"data_iterator": saved})
        assert_same(store.restore(0).items["data_iterator"], saved)


@pytest.mark.usefixtures("child_processes")
def test_host_leaves_cross_x64_settings_between_processes(store_dir):
    """Saved with x64 off, restored by a process with x64 on, and back."""
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(0, {"data_iterator": host_state()})
    child = f"""
import jax, numpy as np
assert jax.config.jax_enable_x64
from substrax.checkpoint import OrbaxCheckpointStore
from test_checkpoint_host_leaves import assert_same, host_state
with OrbaxCheckpointStore({str(store_dir)!r}) as store:
    restored = store.restore(0).items["data_iterator"]
    assert_same(restored, host_state())
    store.save(1, {{"data_iterator": restored, "model": {{"w": jax.numpy.arange(3.0)}}}})
"""
    env = {**os.environ, "JAX_ENABLE_X64": "1", "PYTHONPATH": str(Path(__file__).parent)}
    subprocess.run([sys.executable, "-c", child], check=True, timeout=120, env=env)
    assert not jax.config.jax_enable_x64
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        assert_same(store.restore(1, items=("data_iterator",)).items["data_iterator"], host_state())
        # a jax.Array still narrows, and says so, and that a cast would wrap a large integer
        with pytest.raises(CheckpointDtypeMismatchError, match=r"x64 is off.*a cast wraps"):
            store.restore(1, items=("model",))


def test_numpy_items_in_every_item_and_async_or_not(store_dir):
    counts = np.array([2**41, -3], np.int64)
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(0, {"model": {"counts": counts}, "rng": np.uint64(2**64 - 2)})
        restored = store.restore(0).items
    assert_same(restored["model"], {"counts": counts})
    assert_same(restored["rng"], np.uint64(2**64 - 2))


def test_jax_arrays_stay_jax_arrays(store_dir):
    state = {"w": jnp.arange(4.0), "key": jax.random.key(1), "host": np.arange(2, dtype=np.int64)}
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(0, {"model": state})
        restored = store.restore(0).items["model"]
    assert isinstance(restored["w"], jax.Array)
    assert restored["w"].dtype == jnp.float32
    assert restored["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert isinstance(restored["key"], jax.Array)
    assert_same(restored["host"], state["host"])


def test_dtypes_record_names_the_host_leaves(store_dir):
    items = {
        "data_iterator": {"order": np.arange(2, dtype=np.int64), "seed": np.uint64(7), "n": 3},
        "model": {"w": jnp.zeros(2)},
    }
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(0, items)
    record = json.loads((store_dir / "0" / "dtypes" / "metadata").read_text())
    assert record == {
        "data_iterator": {"order": "int64", "seed": "uint64"},
        "model": {"w": "float32"},
        "host_leaves": {"data_iterator": {"order": "ndarray", "seed": "numpy_scalar"}},
        "shapes": {"data_iterator": {"order": [2], "seed": []}, "model": {"w": [2]}},
    }


def test_templates_decide_the_leaf_kinds(store_dir):
    saved = {
        "order": np.arange(3, dtype=np.int32),
        "seed": np.int64(2**40),
        "step": jnp.arange(2),
        "position": 11,
    }
    template = {
        "order": np.zeros(3, np.int32),
        "seed": np.int64(0),
        "step": jnp.zeros(2, jnp.int32),
        "position": 0,
    }
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(0, {"data_iterator": saved})
        restored = store.restore(0, templates={"data_iterator": template}).items["data_iterator"]
        as_jax = store.restore(
            0, templates={"data_iterator": {**template, "order": jnp.zeros(3, jnp.int32)}}
        )
    assert_same(restored["order"], saved["order"])
    assert_same(restored["seed"], saved["seed"])
    assert isinstance(restored["step"], jax.Array)
    assert restored["step"].tolist() == [0, 1]
    assert restored["position"] == 11
    order = as_jax.items["data_iterator"]["order"]
    assert isinstance(order, jax.Array)
    assert order.tolist() == [0, 1, 2]


def _forget_host_leaves(step_dir: Path) -> None:
    """Rewrite a step's dtypes record as a writer before host leaves were recorded wrote it."""
    path = step_dir / "dtypes" / "metadata"
    record = json.loads(path.read_text())
    del record["host_leaves"]
    path.write_text(json.dumps(record))


def test_steps_without_the_host_record_restore_as_before(store_dir):
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(0, {"data_iterator": {"order": np.arange(3, dtype=np.int32)}})
        store.save(1, {"data_iterator": {"order": np.arange(3, dtype=np.int64)}})
    for step in ("0", "1"):  # as written before the host record (and manifests) existed
        _forget_host_leaves(store_dir / step)
        (store_dir / step / "substrax_manifest.json").unlink()
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        order = store.restore(0).items["data_iterator"]["order"]
        assert isinstance(order, jax.Array)
        assert order.dtype == jnp.int32
        assert order.tolist() == [0, 1, 2]
        with pytest.raises(CheckpointDtypeMismatchError, match="int64 -> int32"):
            store.restore(1)


def test_python_ints_fill_64_bits_and_larger_ones_are_refused_before_writing(store_dir):
    edges = {"low": -(2**63), "high": 2**64 - 1, "signed_high": 2**63}
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(0, {"data_iterator": edges})
        assert_same(store.restore(0).items["data_iterator"], edges)
        for value in (2**64, -(2**63) - 1):
            with pytest.raises(ValueError, match=r"'data_iterator' leaf 'seen/1' .* string"):
                store.save(1, {"data_iterator": {"seen": [0, value]}})
        store.wait()
        assert store.list_steps() == [0]


@pytest.mark.parametrize(
    "empty", [np.zeros((0,), np.int64), np.zeros((3, 0), np.float32), jnp.zeros((0, 2))]
)
@pytest.mark.parametrize("item", ["model", "data_iterator"])
def test_empty_arrays_are_refused_before_writing(store_dir, empty, item):
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(1, {item: {"w": np.ones(2)}})
        with pytest.raises(ValueError, match=rf"item '{item}' leaf 'pending' is an empty array"):
            store.save(2, {item: {"w": np.ones(2), "pending": empty}})
        store.save(3, {item: {"w": np.ones(2)}})  # the refused save cost no other save
        store.wait()
        assert store.list_steps() == [1, 3]
