"""Bit rot on disk: one bit flipped in the middle of an array's chunk file after the save.

The reproduction from the issue, end to end in real processes: one process saves, the test flips
a bit in the file, ``python -m substrax.checkpoint verify`` (another process) names the step,
item and leaf and exits 1, and a restore in a fresh process raises ``CheckpointCorruptError``
instead of returning the wrong values.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}

SAVE = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from substrax.checkpoint import OrbaxCheckpointStore
    mesh = jax.make_mesh((4,), ("x",))
    state = {
        "kernel": jax.device_put(jnp.arange(1 << 16, dtype=jnp.float32).reshape(256, 256),
                                 jax.NamedSharding(mesh, jax.P("x"))),
        "bias": jnp.ones(256, jnp.float32),
    }
    # one directory per array (use_ocdbt=False), whose damaged files are named by array
    with OrbaxCheckpointStore(sys.argv[1], max_to_keep=None, use_ocdbt=False) as store:
        for step in (10, 20):
            store.save(step, {"model": state, "data_iterator": {"seen": np.arange(64)}})
    """
)

RESTORE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from substrax.checkpoint import CheckpointCorruptError, OrbaxCheckpointStore
    with OrbaxCheckpointStore(sys.argv[1], read_only=True) as store:
        try:
            kernel = store.restore(int(sys.argv[2])).items["model"]["kernel"]
        except CheckpointCorruptError as error:
            print(json.dumps({"raised": type(error).__name__, "step": error.step,
                              "item": error.item, "leaf": error.leaf, "message": str(error)}))
        else:
            wrong = int((np.asarray(kernel).ravel() != np.arange(1 << 16)).sum())
            print(json.dumps({"raised": None, "wrong_values": wrong}))
    """
)


def _run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _flip_a_bit_in_the_middle(array_dir: Path) -> Path:
    chunks = sorted(p for p in array_dir.rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk = chunks[len(chunks) // 2]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    return chunk


@pytest.fixture
def corrupted_store(tmp_path: Path) -> Path:
    store = tmp_path / "run"
    saved = _run("-c", SAVE, str(store))
    assert saved.returncode == 0, saved.stderr[-3000:]
    _flip_a_bit_in_the_middle(store / "20" / "model" / "tree.kernel")
    return store


def test_verify_names_the_corrupted_leaf_and_exits_1(corrupted_store):
    result = _run("-m", "substrax.checkpoint", "verify", "--json", str(corrupted_store))
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    rows = {row["step"]: row for row in json.loads(result.stdout)}
    assert rows[10]["ok"]
    assert not rows[20]["ok"]
    assert (rows[20]["item"], rows[20]["leaf"]) == ("model", "kernel")
    text = _run("-m", "substrax.checkpoint", "verify", str(corrupted_store))
    assert text.returncode == 1
    assert any(
        line.split()[:4] == ["20", "FAILED", "model", "kernel"] for line in text.stdout.splitlines()
    ), text.stdout


def test_a_fresh_process_refuses_to_restore_the_corrupted_step(corrupted_store):
    result = _run("-c", RESTORE, str(corrupted_store), "20")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["raised"] == "CheckpointCorruptError", report
    assert (report["step"], report["item"], report["leaf"]) == (20, "model", "kernel")
    assert "restore an earlier step" in report["message"]
    earlier = json.loads(_run("-c", RESTORE, str(corrupted_store), "10").stdout)
    assert earlier == {"raised": None, "wrong_values": 0}


def test_a_clean_store_verifies(tmp_path):
    store = tmp_path / "run"
    assert _run("-c", SAVE, str(store)).returncode == 0
    result = _run("-m", "substrax.checkpoint", "verify", str(store))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
