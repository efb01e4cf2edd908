"""A checkpoint written on one topology restores onto others, each in a fresh process."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from substrax.testing import free_port


ROWS, COLS = 8, 16

SAVE_8 = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from substrax.checkpoint import OrbaxCheckpointStore
assert jax.device_count() == 8
mesh = jax.make_mesh((8,), ("data",))
w = jax.device_put(jnp.arange(ROWS * COLS, dtype=jnp.float32).reshape(ROWS, COLS),
                   NamedSharding(mesh, P("data", None)))
v = jax.device_put(jnp.arange(COLS * ROWS, dtype=jnp.int32).reshape(COLS, ROWS),
                   NamedSharding(mesh, P(None, "data")))
with OrbaxCheckpointStore(DIR) as store:
    store.save(3, {"model": {"w": w, "v": v}, "rng": jax.random.key(11)}, metrics={"loss": 0.5})
"""

# The module-scoped fixture is costly: keep these tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("checkpoint_topology")
RESTORE = """
import json, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding
from substrax.checkpoint import OrbaxCheckpointStore
layout = LAYOUT
n = jax.device_count()
if layout == "single":
    ws = vs = SingleDeviceSharding(jax.devices()[0])
elif layout == "two":
    mesh = jax.make_mesh((2,), ("model",))
    ws, vs = NamedSharding(mesh, P(None, "model")), NamedSharding(mesh, P("model", None))
else:
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    ws, vs = NamedSharding(mesh, P("b", "a")), NamedSharding(mesh, P(None, ("a", "b")))
template = {"model": {"w": jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32, sharding=ws),
                      "v": jax.ShapeDtypeStruct((COLS, ROWS), jnp.int32, sharding=vs)}}
with OrbaxCheckpointStore(DIR) as store:
    if "seed" in str(store.restore(3).items["rng"]):
        template["rng"] = {"seed": np.zeros(2, np.uint32)}
    else:
        template["rng"] = jax.random.key(0)
    checkpoint = store.restore(3, templates=template)
model = checkpoint.items["model"]
assert model["w"].sharding == ws, (model["w"].sharding, ws)
assert model["v"].sharding == vs, (model["v"].sharding, vs)
np.testing.assert_array_equal(np.asarray(model["w"]), np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS))
np.testing.assert_array_equal(np.asarray(model["v"]), np.arange(COLS * ROWS, dtype=np.int32).reshape(COLS, ROWS))
rng = checkpoint.items["rng"]
rng = rng["seed"] if isinstance(rng, dict) else jax.random.key_data(rng)
assert np.asarray(rng).tolist() == jax.random.key_data(jax.random.key(11)).tolist()
print(json.dumps({"devices": n, "loss": checkpoint.metadata.metrics["loss"]}))
"""

ABSTRACT = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from substrax.checkpoint import OrbaxCheckpointStore
mesh = jax.make_mesh((2,), ("model",))
def build():
    init = nnx.with_partitioning(nnx.initializers.zeros_init(), (None, "model"))
    return nnx.Linear(4, 8, kernel_init=init, rngs=nnx.Rngs(0))
with OrbaxCheckpointStore(DIR) as store:
    store.save(1, {"model": nnx.state(nnx.Linear(4, 8, rngs=nnx.Rngs(5)))})
    with jax.set_mesh(mesh):
        abstract = nnx.state(nnx.eval_shape(build))
    try:
        store.restore(1, templates={"model": abstract})
    except ValueError as error:
        assert "abstract mesh" in str(error), error
    else:
        raise AssertionError("an abstract mesh without a concrete one was accepted")
    explicit = store.restore(1, templates={"model": abstract}, mesh=mesh).items["model"]
    with jax.set_mesh(mesh):
        ambient = store.restore(1, templates={"model": abstract}).items["model"]
kernel = explicit["kernel"][...]
assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "model"), kernel.sharding
np.testing.assert_array_equal(np.asarray(kernel), np.asarray(nnx.Linear(4, 8, rngs=nnx.Rngs(5)).kernel[...]))
np.testing.assert_array_equal(np.asarray(ambient["kernel"][...]), np.asarray(kernel))
print("ok")
"""

TWO_PROCESS_SAVE = """
import sys, jax, jax.numpy as jnp, numpy as np
jax.distributed.initialize(coordinator_address=ADDRESS, num_processes=2, process_id=int(sys.argv[1]))
from jax.sharding import NamedSharding, PartitionSpec as P
from substrax.checkpoint import CheckpointNotWrittenError, OrbaxCheckpointStore
assert jax.device_count() == 8 and jax.local_device_count() == 4
mesh = jax.make_mesh((8,), ("data",))
full_w = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
full_v = np.arange(COLS * ROWS, dtype=np.int32).reshape(COLS, ROWS)
w = jax.make_array_from_callback(full_w.shape, NamedSharding(mesh, P("data", None)), lambda i: full_w[i])
v = jax.make_array_from_callback(full_v.shape, NamedSharding(mesh, P(None, "data")), lambda i: full_v[i])
with OrbaxCheckpointStore(DIR) as store:
    # every jax.Array in a multi-process save is a global array; process-local values go as numpy
    rng = np.asarray(jax.random.key_data(jax.random.key(11)))
    store.save(3, {"model": {"w": w, "v": v}, "rng": {"seed": rng}}, metrics={"loss": 0.5})
    store.wait()
    try:
        store.save(3, {"model": {"w": w, "v": v}})
    except CheckpointNotWrittenError as error:
        print("refused", error.reason)
"""


def _run(code: str, devices: int, **names: object) -> subprocess.CompletedProcess[str]:
    prelude = "".join(f"{name} = {value!r}\n" for name, value in names.items())
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices)}
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


@pytest.fixture(scope="module")
def saved_on_8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("topology") / "store"
    _ok(_run(SAVE_8, 8, DIR=str(directory), ROWS=ROWS, COLS=COLS))
    return directory


@pytest.mark.parametrize(("layout", "devices"), [("single", 1), ("two", 2), ("eight", 8)])
def test_restore_onto_other_topologies(saved_on_8: Path, layout: str, devices: int) -> None:
    out = _ok(_run(RESTORE, devices, DIR=str(saved_on_8), ROWS=ROWS, COLS=COLS, LAYOUT=layout))
    assert json.loads(out.strip().splitlines()[-1]) == {"devices": devices, "loss": 0.5}


def test_abstract_mesh_templates(tmp_path: Path) -> None:
    assert _ok(_run(ABSTRACT, 2, DIR=str(tmp_path / "store"))).strip().endswith("ok")


def test_two_processes_save_one_restores(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    prelude = "".join(
        f"{name} = {value!r}\n"
        for name, value in {
            "ADDRESS": f"127.0.0.1:{free_port()}",
            "DIR": str(directory),
            "ROWS": ROWS,
            "COLS": COLS,
        }.items()
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", prelude + TWO_PROCESS_SAVE, str(rank)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for child in children:
            out, err = child.communicate(timeout=240)
            assert child.returncode == 0, err[-4000:]
            outputs.append(out)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert all("refused exists" in out for out in outputs), outputs
    out = _ok(_run(RESTORE, 1, DIR=str(directory), ROWS=ROWS, COLS=COLS, LAYOUT="single"))
    assert json.loads(out.strip().splitlines()[-1]) == {"devices": 1, "loss": 0.5}
