"""Import contracts, checked in fresh interpreters."""

NO_JAX = """
import json, sys
import substrax
import substrax.runtime, substrax.runtime.managed_env
import substrax.artifacts, substrax.typing, substrax.records, substrax.examples
from substrax.runtime import JaxRuntime, child_environment, resolve_test_runtime
child_environment(resolve_test_runtime({}, prefix="X_", cuda_plugin_available=False))
print(json.dumps(sorted(m for m in ("jax", "jaxlib", "flax", "numpy") if m in sys.modules)))
"""

RNG_WITHOUT_FLAX = """
import json, sys
sys.modules["flax"] = None  # flax is not installed in this interpreter
import jax
from substrax.rng import fold_in_name, key_from, rngs_from_seed
key = key_from(jax.random.key(0), streams=("params",), context="t")
try:
    rngs_from_seed(0)
except ImportError as error:
    message = str(error)
print(json.dumps({"flax_loaded": "flax.nnx" in sys.modules, "message": message}))
"""

DEVICES_WITHOUT_JAX = """
import json, sys
from substrax.devices import *
from substrax.devices import DevicePlacement, distribute_batch, shard_batch_dim
imported = "jax" in sys.modules
from substrax.runtime import JaxRuntime, apply_runtime
apply_runtime(JaxRuntime(platforms=("cpu",), cpu_devices=2))
import numpy as np
placed = distribute_batch({"x": np.ones((4, 3))})
print(json.dumps({"imported": imported, "shards": len(placed["x"].addressable_shards)}))
"""


def test_runtime_level_modules_import_no_jax(child):
    assert child(NO_JAX) == []


def test_rng_imports_flax_only_where_it_is_called(child):
    out = child(RNG_WITHOUT_FLAX, env={"JAX_PLATFORMS": "cpu"})
    assert out["flax_loaded"] is False
    assert "substrax-runtime[nnx]" in out["message"]


def test_importing_the_devices_names_leaves_jax_for_apply_runtime(child):
    assert child(DEVICES_WITHOUT_JAX) == {"imported": False, "shards": 2}
