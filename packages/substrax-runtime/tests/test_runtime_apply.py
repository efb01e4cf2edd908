"""apply_runtime in fresh interpreters: before jax is imported, and after."""

import pytest

from substrax.runtime import default_compilation_cache_dir
from substrax.runtime._apply import platforms_agree


BEFORE_IMPORT = """
import json, os, sys
from substrax.runtime import JaxRuntime, apply_runtime
target = {"XLA_FLAGS": "--xla_a=1"}
apply_runtime(JaxRuntime(cpu_devices=3, xla_flags=("--xla_b",)), environ=target)
apply_runtime(JaxRuntime(platforms=("cpu",), cpu_devices=3, enable_x64=True, debug_nans=True))
assert "jax" not in sys.modules
import jax
print(json.dumps({
    "target": target,
    "devices": jax.device_count(),
    "x64": jax.config.jax_enable_x64,
    "debug_nans": jax.config.jax_debug_nans,
}))
"""

AFTER_IMPORT = """
import json, os
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
import jax
from substrax.runtime import JaxRuntime, RuntimeConfigurationError, apply_runtime
out = {}
def refused(runtime):
    try:
        apply_runtime(runtime)
    except RuntimeConfigurationError as error:
        return str(error)
    return None
# Before the backends start, cpu_devices still goes through jax.config.
apply_runtime(JaxRuntime(cpu_devices=5, enable_x64=True, matmul_precision="highest",
                         log_compiles=False, persistent_cache_min_compile_time_secs=2.0))
out["devices"] = jax.device_count()
# Once they started, settings read at start are refused...
out["platforms"] = refused(JaxRuntime(platforms=("cuda",)))
out["xla_flags"] = refused(JaxRuntime(xla_flags=("--xla_cpu_enable_fast_math=true",)))
out["memory_fraction"] = refused(JaxRuntime(memory_fraction=0.5))
out["preallocate_other"] = refused(JaxRuntime(preallocate=True))
# ...unless they already hold.
out["preallocate_same"] = refused(JaxRuntime(preallocate=False))
out["platforms_same"] = refused(JaxRuntime(platforms=("cpu",)))
out["x64"] = jax.config.jax_enable_x64
out["precision"] = jax.config.jax_default_matmul_precision
out["min_compile"] = jax.config.jax_persistent_cache_min_compile_time_secs
out["same_count_after_start"] = refused(JaxRuntime(cpu_devices=5))
out["started"] = refused(JaxRuntime(cpu_devices=2))
print(json.dumps(out))
"""


def test_before_import_writes_the_environment(child):
    out = child(BEFORE_IMPORT, env={"JAX_PLATFORMS": "cpu"})
    assert out["target"] == {
        "XLA_FLAGS": "--xla_a=1 --xla_b",
        "JAX_NUM_CPU_DEVICES": "3",
        "JAX_COMPILATION_CACHE_DIR": str(default_compilation_cache_dir()),
    }
    assert out["devices"] == 3
    assert out["x64"] is True
    assert out["debug_nans"] is True


def test_after_import_refuses_what_jax_no_longer_reads(child):
    out = child(AFTER_IMPORT, env={"JAX_PLATFORMS": "cpu"})
    for name in ("platforms", "xla_flags", "memory_fraction", "preallocate_other"):
        assert "would no longer be read" in out[name], name
    assert "child_environment" in out["platforms"]
    assert out["preallocate_same"] is None
    assert out["platforms_same"] is None
    assert out["devices"] == 5
    assert out["x64"] is True
    assert out["precision"] == "highest"
    assert out["min_compile"] == 2.0
    assert out["same_count_after_start"] is None
    assert "cpu_devices=2 cannot be applied" in out["started"]
    assert "JAX_NUM_CPU_DEVICES" in out["started"]


IMPORTED_NOT_STARTED = """
import json, os
import jax
from substrax.runtime import JaxRuntime, RuntimeConfigurationError, apply_runtime
other = {}
try:  # jax reads os.environ: settings written elsewhere would never reach it
    apply_runtime(JaxRuntime(xla_flags=("--xla_force_host_platform_device_count=4",)), environ=other)
    elsewhere = None
except RuntimeConfigurationError as error:
    elsewhere = str(error)
apply_runtime(JaxRuntime(
    platforms=("cpu",),
    xla_flags=("--xla_force_host_platform_device_count=3",),
    preallocate=False,
    memory_fraction=0.5,
))
print(json.dumps({
    "platforms": jax.config.jax_platforms,
    "devices": [d.platform for d in jax.devices()],
    "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
    "fraction": os.environ.get("XLA_CLIENT_MEM_FRACTION"),
    "elsewhere": elsewhere,
    "other": other,
}))
"""


def test_after_import_and_before_the_backends_start_every_setting_is_applied(child):
    """A spec review: jax still reads them then, and "refusing any setting jax would no longer
    read" refused them as soon as jax was imported (a test module importing jax at its top)."""
    out = child(IMPORTED_NOT_STARTED, env={"JAX_PLATFORMS": ""})
    assert "jax is imported and reads os.environ, not the environ= given" in out.pop("elsewhere")
    assert out.pop("other") == {}  # a second-pass review: it took them, and jax never read them
    assert out == {
        "platforms": "cpu",
        "devices": ["cpu"] * 3,  # the flag jax read when its backends started
        "preallocate": "false",
        "fraction": "0.5",
    }


FLAG_COUNT = """
import json
import jax
from substrax.runtime import JaxRuntime, RuntimeConfigurationError, apply_runtime
jax.devices()  # the backends start with XLA_FLAGS' 8 devices, jax's own setting unset
out = {"devices": jax.device_count()}
for count in (8, 4):
    try:
        apply_runtime(JaxRuntime(cpu_devices=count))
        out[str(count)] = None
    except RuntimeConfigurationError as error:
        out[str(count)] = str(error)
print(json.dumps(out))
"""


def test_a_device_count_that_already_holds_through_xla_flags_is_accepted(child):
    """Hostile finding: 8 devices from XLA_FLAGS were refused as cpu_devices=8 "cannot be applied"."""
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    out = child(FLAG_COUNT, env=env)
    assert out["devices"] == 8
    assert out["8"] is None
    assert "cpu_devices=4 cannot be applied" in out["4"]


DEFAULT_BACKEND = """
import json
import jax
from substrax.runtime import JaxRuntime, RuntimeConfigurationError, apply_runtime
jax.devices()  # the backends start with jax_platforms unset: jax picks them
default = jax.default_backend()
out = {"config": jax.config.jax_platforms, "default": default}
for key, name in (("holds", default), ("other", "tpu" if default != "tpu" else "cpu")):
    try:
        apply_runtime(JaxRuntime(platforms=(name,), compilation_cache=False))
        out[key] = None
    except RuntimeConfigurationError as error:
        out[key] = str(error)
print(json.dumps(out))
"""


def test_the_one_platform_jax_started_as_its_default_holds(child):
    """A spec review: with no JAX_* variable, platforms=('cpu',) on a cpu-only machine was
    refused as "(jax has '') would no longer be read", comparing with the unset config."""
    out = child(DEFAULT_BACKEND)
    assert not out["config"]
    assert out["holds"] is None
    assert "would no longer be read" in out["other"]
    assert f"jax's default backend is {out['default']!r}" in out["other"]


CACHE_OFF_THEN_ON = """
import json, os
import jax
from substrax.runtime import JaxRuntime, apply_runtime, child_environment
apply_runtime(JaxRuntime(compilation_cache=False))
off = os.environ.get("JAX_ENABLE_COMPILATION_CACHE")
apply_runtime(JaxRuntime(compilation_cache_dir=os.environ["CACHE_DIR"]))
child = child_environment(JaxRuntime())
print(json.dumps([off, os.environ.get("JAX_ENABLE_COMPILATION_CACHE"),
                  child.get("JAX_ENABLE_COMPILATION_CACHE")]))
"""


def test_a_cache_turned_on_again_after_the_import_reaches_the_children(child, tmp_path):
    """A third-pass review: the environment kept the first runtime's false, so children ran
    without the cache the process had turned on again."""
    env = {"JAX_PLATFORMS": "cpu", "CACHE_DIR": str(tmp_path)}
    assert child(CACHE_OFF_THEN_ON, env=env) == ["false", "true", None]


@pytest.mark.parametrize(
    ("wanted", "has", "agree"),
    [
        (("cuda",), ("gpu",), True),  # jax.default_backend() on a CUDA machine
        (("gpu",), ("cuda",), True),  # JAX_PLATFORMS=cuda, asked as gpu
        (("rocm",), ("gpu",), True),
        (("cuda", "cpu"), ("gpu", "cpu"), True),
        (("cpu",), ("cpu",), True),
        (("rocm",), ("cuda",), False),
        (("cpu",), ("gpu",), False),
        (("tpu",), ("gpu",), False),
        (("cpu", "cuda"), ("cuda", "cpu"), False),  # another order is another default
        (("cuda",), ("cuda", "cpu"), False),
    ],
)
def test_platforms_agree_reads_jax_s_gpu_as_either_gpu_platform(wanted, has, agree):
    """A spec review: platforms=('cuda',) was refused on a CUDA machine once jax had started,
    since jax.default_backend() says 'gpu' there."""
    assert platforms_agree(wanted, has) is agree


SEVERAL_UNSET = """
import json
import jax
from substrax.runtime import JaxRuntime, RuntimeConfigurationError, apply_runtime
jax.devices()
out = {}
for key, platforms in (("started", ("cpu", "cpu")), ("absent", ("cpu", "tpu"))):
    try:
        apply_runtime(JaxRuntime(platforms=platforms, compilation_cache=False))
        out[key] = None
    except RuntimeConfigurationError as error:
        out[key] = str(error)
print(json.dumps(out))
"""


def test_with_platforms_unset_the_default_then_platforms_jax_started_hold(child):
    """A second pass: platforms=('cuda', 'cpu') was refused against jax's own start (GPU the
    default, CPU started too), one default backend compared with two names."""
    out = child(SEVERAL_UNSET)
    assert out["started"] is None
    assert "platforms=('cpu', 'tpu')" in out["absent"]
    assert "it started no tpu backend" in out["absent"]
