"""Bit rot on disk: one bit flipped in the middle of an array's chunk file after the save.

The reproduction from the issue, end to end in real processes: one process saves, the test flips
a bit in the file, ``python -m substrax.checkpoint verify`` (another process) names the step,
item and leaf and exits 1, and a restore in a fresh process raises ``CheckpointCorruptError``
instead of returning the wrong values.
"""

import json
import os
import shutil
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

# restores the kernel of each step named, in order, printing one JSON line per step
RESTORE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from substrax.checkpoint import CheckpointCorruptError, OrbaxCheckpointStore
    with OrbaxCheckpointStore(sys.argv[1], read_only=True) as store:
        for step in sys.argv[2:]:
            try:
                kernel = store.restore(int(step)).items["model"]["kernel"]
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


@pytest.fixture(scope="module")
def saved_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store SAVE wrote, once for the module: each test works on a copy of its own."""
    store = tmp_path_factory.mktemp("saved") / "run"
    saved = _run("-c", SAVE, str(store))
    assert saved.returncode == 0, saved.stderr[-3000:]
    return store


@pytest.fixture
def clean_store(saved_store: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved_store, tmp_path / "run", symlinks=True))


@pytest.fixture
def corrupted_store(clean_store: Path) -> Path:
    _flip_a_bit_in_the_middle(clean_store / "20" / "model" / "tree.kernel")
    return clean_store


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
    # the corrupted step first, then (in the same process, as the error advises) an earlier one
    result = _run("-c", RESTORE, str(corrupted_store), "20", "10")
    assert result.returncode == 0, result.stderr[-3000:]
    report, earlier = map(json.loads, result.stdout.splitlines())
    assert report["raised"] == "CheckpointCorruptError", report
    assert (report["step"], report["item"], report["leaf"]) == (20, "model", "kernel")
    assert "restore an earlier step" in report["message"]
    assert earlier == {"raised": None, "wrong_values": 0}


def test_a_clean_store_verifies(clean_store):
    result = _run("-m", "substrax.checkpoint", "verify", str(clean_store))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
