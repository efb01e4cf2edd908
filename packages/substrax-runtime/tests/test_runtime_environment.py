import pickle
from pathlib import Path

import pytest

from substrax.runtime import (
    EnvironmentConflictError,
    JaxRuntime,
    RuntimeConfigurationError,
    XlaFlagConflictError,
    apply_runtime,
    child_environment,
    default_compilation_cache_dir,
    runtime_environment,
)


# what every runtime renders unless told otherwise: the persistent compilation cache, on
CACHE = {"JAX_COMPILATION_CACHE_DIR": str(default_compilation_cache_dir())}


def test_a_cache_directory_the_environment_already_sets_is_left_alone(tmp_path):
    mine = {"JAX_COMPILATION_CACHE_DIR": "/srv/jax-cache"}
    assert runtime_environment(JaxRuntime(), mine) == {}
    assert runtime_environment(JaxRuntime(), {"JAX_COMPILATION_CACHE_DIR": ""}) == CACHE
    explicit = JaxRuntime(compilation_cache_dir=tmp_path)
    assert runtime_environment(explicit, mine) == {"JAX_COMPILATION_CACHE_DIR": str(tmp_path)}
    # a child inherits no JAX_* variable from its parent, but keeps one passed in env=
    child = child_environment(JaxRuntime(), mine, parent={"HOME": "/h"})
    assert child["JAX_COMPILATION_CACHE_DIR"] == "/srv/jax-cache"
    assert child_environment(JaxRuntime(), parent=mine)["JAX_COMPILATION_CACHE_DIR"] == str(
        default_compilation_cache_dir()
    )


def test_apply_runtime_keeps_the_cache_directory_jax_was_started_with():
    import jax

    before = jax.config.jax_compilation_cache_dir
    apply_runtime(JaxRuntime(), environ={"JAX_COMPILATION_CACHE_DIR": "/srv/jax-cache"})
    assert jax.config.jax_compilation_cache_dir == before


def test_every_field_maps_to_its_variable(tmp_path):
    runtime = JaxRuntime(
        platforms=("cuda", "cpu"),
        cpu_devices=4,
        enable_x64=True,
        matmul_precision="highest",
        compilation_cache_dir=tmp_path,
        xla_flags=("--xla_a=1",),
        preallocate=False,
        memory_fraction=0.75,
        debug_nans=True,
        log_compiles=False,
        persistent_cache_min_compile_time_secs=0.5,
    )
    assert runtime_environment(runtime, {}) == {
        "JAX_PLATFORMS": "cuda,cpu",
        "JAX_NUM_CPU_DEVICES": "4",
        "JAX_ENABLE_X64": "true",
        "JAX_DEFAULT_MATMUL_PRECISION": "highest",
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path),
        "JAX_DEBUG_NANS": "true",
        "JAX_LOG_COMPILES": "false",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5",
        "XLA_FLAGS": "--xla_a=1",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_CLIENT_MEM_FRACTION": "0.75",
    }


def test_the_compilation_cache_is_on_by_default_overridable_and_off_when_told(tmp_path):
    assert default_compilation_cache_dir().is_absolute()
    assert runtime_environment(JaxRuntime(), {}) == CACHE
    assert runtime_environment(JaxRuntime(compilation_cache_dir=tmp_path), {}) == {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path)
    }
    assert runtime_environment(JaxRuntime(compilation_cache=False), {}) == {
        "JAX_ENABLE_COMPILATION_CACHE": "false"
    }
    with pytest.raises(ValueError, match="drop one of the two"):
        JaxRuntime(compilation_cache=False, compilation_cache_dir=tmp_path)
    with pytest.raises(TypeError, match="compilation_cache must be a bool"):
        JaxRuntime(compilation_cache="yes")  # type: ignore[arg-type]


def test_a_cache_turned_off_before_is_turned_on_by_a_runtime_naming_its_directory(tmp_path):
    """Hostile finding: after JaxRuntime(compilation_cache=False), or under the environment's
    JAX_ENABLE_COMPILATION_CACHE=false, a runtime naming its cache directory left it off."""
    env: dict[str, str] = {}
    for runtime in (JaxRuntime(compilation_cache=False), JaxRuntime()):  # as apply_runtime does
        env.update(runtime_environment(runtime, env))
    assert env == {"JAX_ENABLE_COMPILATION_CACHE": "false", **CACHE}  # the default: left off
    off = {"JAX_ENABLE_COMPILATION_CACHE": "0"}
    assert runtime_environment(JaxRuntime(compilation_cache_dir=tmp_path), off) == {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path),
        "JAX_ENABLE_COMPILATION_CACHE": "true",
    }
    with pytest.raises(EnvironmentConflictError, match="JAX_ENABLE_COMPILATION_CACHE"):
        child_environment(JaxRuntime(compilation_cache_dir=tmp_path), off)


def test_a_child_keeps_the_cache_its_parent_turned_off(tmp_path):
    """A spec review: child_environment dropped the parent's JAX_ENABLE_COMPILATION_CACHE=false
    (a test session's), and JaxRuntime()'s default turned the user's cache on in the child."""
    parent = {"JAX_ENABLE_COMPILATION_CACHE": "false", "HOME": "/h"}
    off = {"HOME": "/h", "JAX_ENABLE_COMPILATION_CACHE": "false"}
    assert child_environment(JaxRuntime(), parent=parent) == off
    assert child_environment(JaxRuntime(cpu_devices=8), parent=parent) == {
        **off,
        "JAX_NUM_CPU_DEVICES": "8",
    }
    # the runtime's own directory turns it on, as env does; without a runtime nothing is inherited
    own = child_environment(JaxRuntime(compilation_cache_dir=tmp_path), parent=parent)
    assert own == {"HOME": "/h", "JAX_COMPILATION_CACHE_DIR": str(tmp_path)}
    on = {"JAX_ENABLE_COMPILATION_CACHE": "1"}
    assert child_environment(JaxRuntime(), on, parent=parent) == {"HOME": "/h", **on, **CACHE}
    assert child_environment(None, parent=parent) == {"HOME": "/h"}


def test_only_set_variables_are_returned():
    base = {"JAX_PLATFORMS": "tpu", "HOME": "/home/x"}
    assert runtime_environment(JaxRuntime(enable_x64=False), base) == {
        "JAX_ENABLE_X64": "false",
        **CACHE,
    }
    assert runtime_environment(JaxRuntime(), base) == CACHE


def test_xla_flags_merge_with_base():
    env = runtime_environment(JaxRuntime(xla_flags=("--b=2",)), {"XLA_FLAGS": "--a=1 --b=2"})
    assert env == {"XLA_FLAGS": "--a=1 --b=2", **CACHE}
    env = runtime_environment(JaxRuntime(xla_flags=("--c",)), {"XLA_FLAGS": "--a=1"})
    assert env == {"XLA_FLAGS": "--a=1 --c", **CACHE}


def test_xla_flag_conflict_with_base():
    with pytest.raises(XlaFlagConflictError) as info:
        runtime_environment(JaxRuntime(xla_flags=("--a=2",)), {"XLA_FLAGS": "--a=1"})
    assert (info.value.existing, info.value.requested) == ("1", "2")


def test_deprecated_memory_fraction_variable_is_refused():
    base = {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"}
    with pytest.raises(RuntimeConfigurationError, match="XLA_PYTHON_CLIENT_MEM_FRACTION"):
        runtime_environment(JaxRuntime(memory_fraction=0.5), base)
    assert runtime_environment(JaxRuntime(preallocate=True), base) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
        **CACHE,
    }


@pytest.mark.parametrize("raw", ["0", "eight", "-2", "2.5", ""])
def test_a_cpu_device_count_jax_would_fail_on_is_refused_naming_it(raw):
    # "0" made jax fail only at its first device call, with "Could not determine process_index"
    with pytest.raises(RuntimeConfigurationError, match=rf"JAX_NUM_CPU_DEVICES={raw!r} is not"):
        runtime_environment(JaxRuntime(), {"JAX_NUM_CPU_DEVICES": raw})
    with pytest.raises(RuntimeConfigurationError, match="JAX_NUM_CPU_DEVICES"):
        child_environment(JaxRuntime(), {"JAX_NUM_CPU_DEVICES": raw}, parent={})
    # cpu_devices replaces it, so nothing is wrong
    assert (
        runtime_environment(JaxRuntime(cpu_devices=2), {"JAX_NUM_CPU_DEVICES": raw})[
            "JAX_NUM_CPU_DEVICES"
        ]
        == "2"
    )


@pytest.mark.parametrize("count", ["0", "abc"])
def test_a_device_count_flag_in_the_environment_that_is_no_count_is_refused(count):
    base = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}"}
    match = rf"count={count} \(the environment's XLA_FLAGS\) is not a number of emulated CPU"
    with pytest.raises(RuntimeConfigurationError, match=match):
        runtime_environment(JaxRuntime(), base)
    with pytest.raises(RuntimeConfigurationError, match=match):
        child_environment(JaxRuntime(), base, parent={})


@pytest.mark.parametrize("raw", ["8", " 8", "-1"])
def test_a_cpu_device_count_jax_takes_is_kept(raw):
    runtime = JaxRuntime(compilation_cache=False)
    environ = child_environment(runtime, {"JAX_NUM_CPU_DEVICES": raw}, parent={})
    assert environ["JAX_NUM_CPU_DEVICES"] == raw


def test_child_environment_drops_inherited_jax_settings():
    parent = {"JAX_PLATFORMS": "cuda", "XLA_FLAGS": "--a=1", "PATH": "/bin", "JAXLIKE": "kept"}
    child = child_environment(JaxRuntime(cpu_devices=2), parent=parent)
    assert child == {"PATH": "/bin", "JAXLIKE": "kept", "JAX_NUM_CPU_DEVICES": "2", **CACHE}


def test_child_environment_env_then_runtime():
    child = child_environment(
        JaxRuntime(xla_flags=("--b",), platforms=("cpu",)),
        {"XLA_FLAGS": "--a=1", "JAX_PLATFORMS": " cpu", "EXTRA": "1"},
        parent={"HOME": "/h"},
    )
    assert child == {
        "HOME": "/h",
        "XLA_FLAGS": "--a=1 --b",
        "JAX_PLATFORMS": "cpu",
        "EXTRA": "1",
        **CACHE,
    }


@pytest.mark.parametrize(
    ("runtime", "variable", "given", "required"),
    [
        (JaxRuntime(platforms=("tpu",)), "JAX_PLATFORMS", "cpu", "tpu"),
        (JaxRuntime(enable_x64=False), "JAX_ENABLE_X64", "1", "false"),
        (JaxRuntime(cpu_devices=4), "JAX_NUM_CPU_DEVICES", "8", "4"),
        (JaxRuntime(memory_fraction=0.5), "XLA_CLIENT_MEM_FRACTION", "0.9", "0.5"),
        (JaxRuntime(compilation_cache=False), "JAX_ENABLE_COMPILATION_CACHE", "true", "false"),
        (JaxRuntime(compilation_cache_dir=Path("/a")), "JAX_COMPILATION_CACHE_DIR", "/b", "/a"),
    ],
)
def test_an_env_value_the_runtime_sets_otherwise_is_refused_naming_both(
    runtime, variable, given, required
):
    # the runtime's value replaced env's without a word, while an XLA flag conflict was refused
    with pytest.raises(EnvironmentConflictError) as info:
        child_environment(runtime, {variable: given}, parent={})
    error = info.value
    assert (error.variable, error.given, error.required) == (variable, given, required)
    assert isinstance(error, ValueError)
    assert isinstance(error, RuntimeConfigurationError)
    message = str(error)
    assert f"{variable}={given!r}" in message
    assert repr(required) in message
    assert "JaxRuntime." in message
    assert f"drop {variable} from env" in message
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own error, round-tripped
    assert str(copy) == message


@pytest.mark.parametrize(
    ("runtime", "variable", "given"),
    [
        (JaxRuntime(enable_x64=True), "JAX_ENABLE_X64", "1"),
        (JaxRuntime(enable_x64=False), "JAX_ENABLE_X64", "False"),
        (JaxRuntime(cpu_devices=8), "JAX_NUM_CPU_DEVICES", " 8"),
        (JaxRuntime(platforms=("cuda", "cpu")), "JAX_PLATFORMS", "cuda, cpu"),
        (JaxRuntime(memory_fraction=0.5), "XLA_CLIENT_MEM_FRACTION", ".50"),
        (JaxRuntime(compilation_cache_dir=Path("/a")), "JAX_COMPILATION_CACHE_DIR", "/a/"),
    ],
)
def test_an_env_value_that_means_what_the_runtime_sets_is_accepted(runtime, variable, given):
    child = child_environment(runtime, {variable: given}, parent={})
    assert child[variable] == runtime_environment(runtime, {})[variable]


def test_a_device_count_flag_jax_would_ignore_is_refused_naming_both():
    # xla_flags asked for 4 devices; JAX_NUM_CPU_DEVICES=8 won, and the process had 8
    flag = "--xla_force_host_platform_device_count"
    runtime = JaxRuntime(xla_flags=(f"{flag}=4",), compilation_cache=False)
    with pytest.raises(RuntimeConfigurationError, match=rf"JAX_NUM_CPU_DEVICES=8 .* {flag}=4"):
        runtime_environment(runtime, {"JAX_NUM_CPU_DEVICES": "8"})
    with pytest.raises(RuntimeConfigurationError, match="two CPU device counts"):
        child_environment(runtime, {"JAX_NUM_CPU_DEVICES": "8"}, parent={})
    for agreeing in ("4", "-1"):
        env = runtime_environment(runtime, {"JAX_NUM_CPU_DEVICES": agreeing})
        assert env["XLA_FLAGS"] == f"{flag}=4"
    # env's flag against the runtime's cpu_devices: jax would take cpu_devices
    with pytest.raises(
        RuntimeConfigurationError, match=r"cpu_devices\) and .*=4 \(the environment's"
    ):
        child_environment(JaxRuntime(cpu_devices=8), {"XLA_FLAGS": f"{flag}=4"}, parent={})
    kept = child_environment(JaxRuntime(cpu_devices=4), {"XLA_FLAGS": f"{flag}=4"}, parent={})
    assert kept["JAX_NUM_CPU_DEVICES"] == "4"
    # a hostile finding: runtime_environment (and so apply_runtime) overrode the user's flag
    with pytest.raises(RuntimeConfigurationError, match=r"=4 \(the environment's XLA_FLAGS\)"):
        runtime_environment(JaxRuntime(cpu_devices=8), {"XLA_FLAGS": f"{flag}=4"})
    agreeing = runtime_environment(JaxRuntime(cpu_devices=4), {"XLA_FLAGS": f"{flag}=4"})
    assert agreeing["JAX_NUM_CPU_DEVICES"] == "4"


def test_apply_runtime_keeps_a_cache_directory_set_through_jax_config(tmp_path):
    # apply_runtime(JaxRuntime(enable_x64=...)) reset it to the default directory
    import jax

    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    try:
        apply_runtime(JaxRuntime(enable_x64=jax.config.jax_enable_x64), environ={})
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_apply_runtime_after_import_refuses_a_device_count_flag_jax_ignores():
    import jax

    count = jax.config.jax_num_cpu_devices
    if count in (-1, 3):
        pytest.skip("the session's jax takes the flag's count")
    flag = "--xla_force_host_platform_device_count=3"
    with pytest.raises(RuntimeConfigurationError, match=rf"JAX_NUM_CPU_DEVICES={count} .*=3"):
        apply_runtime(JaxRuntime(xla_flags=(flag,)), environ={"XLA_FLAGS": flag})


def test_apply_runtime_after_import_refuses_cpu_devices_against_the_environments_flag():
    # accepted once jax was imported (refused before): jax took cpu_devices, the flag stayed
    flag = "--xla_force_host_platform_device_count"
    environ = {"XLA_FLAGS": f"{flag}=4"}
    match = r"JAX_NUM_CPU_DEVICES=8 \(JaxRuntime.cpu_devices\) and .*=4 \(the environment's"
    with pytest.raises(RuntimeConfigurationError, match=match):
        apply_runtime(JaxRuntime(cpu_devices=8), environ=environ)
    assert environ == {"XLA_FLAGS": f"{flag}=4"}


def test_child_environment_conflict_raises_before_the_child_starts():
    with pytest.raises(XlaFlagConflictError):
        child_environment(JaxRuntime(xla_flags=("--a=2",)), {"XLA_FLAGS": "--a=1"}, parent={})


def test_child_environment_without_runtime_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("SUBSTRAX_RUNTIME_TEST_MARKER", "yes")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    child = child_environment(None)
    assert child["SUBSTRAX_RUNTIME_TEST_MARKER"] == "yes"
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in child


@pytest.mark.usefixtures("child_processes")
def test_runtime_environment_reaches_a_child(child):
    # The spec's own example: the rendered variables give the child 8 devices.
    program = (
        "import json, os, subprocess, sys\n"
        "from substrax.runtime import JaxRuntime, runtime_environment\n"
        "runtime = JaxRuntime(platforms=('cpu',), cpu_devices=3, enable_x64=True)\n"
        "env = {**os.environ, **runtime_environment(runtime, os.environ)}\n"
        "code = 'import jax, json; print(json.dumps([jax.device_count(), jax.config.jax_enable_x64]))'\n"
        "out = subprocess.run([sys.executable, '-c', code], env=env, check=True,\n"
        "                     capture_output=True, text=True).stdout\n"
        "print(out.strip())\n"
    )
    assert child(program) == [3, True]
