import dataclasses
import math
import typing
from pathlib import Path

import pytest

from substrax.runtime import JaxRuntime, MatmulPrecision, XlaFlagConflictError


def test_defaults_leave_everything_alone_but_keep_the_compilation_cache():
    runtime = JaxRuntime()
    assert runtime.platforms is None
    assert runtime.xla_flags == ()
    assert runtime.compilation_cache is True
    assert all(
        getattr(runtime, field.name) in (None, ())
        for field in dataclasses.fields(JaxRuntime)
        if field.name != "compilation_cache"
    )


def test_frozen_slotted_keyword_only():
    runtime = JaxRuntime(cpu_devices=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.cpu_devices = 3  # type: ignore[misc]
    assert not hasattr(runtime, "__dict__")
    with pytest.raises(TypeError):
        JaxRuntime(("cpu",))  # type: ignore[misc]


@pytest.mark.parametrize(
    ("platforms", "error", "match"),
    [
        ((), ValueError, "at least one platform"),
        (("cpu", ""), ValueError, "without commas or spaces"),
        (("  ",), ValueError, "without commas or spaces"),
        (("cpu,cuda",), ValueError, "without commas"),
        ((" cpu",), ValueError, "entry ' cpu' must be a name without commas or spaces around it"),
        ("cpu", TypeError, "tuple of names"),
        (["cpu"], TypeError, "tuple of names"),
        ((1,), TypeError, "tuple of names"),
    ],
)
def test_platforms_validation(platforms, error, match):
    with pytest.raises(error, match=match):
        JaxRuntime(platforms=platforms)


@pytest.mark.parametrize(
    ("count", "error"),
    [(True, TypeError), (2.0, TypeError), ("2", TypeError), (0, ValueError), (-1, ValueError)],
)
def test_cpu_devices_validation(count, error):
    with pytest.raises(error, match="cpu_devices"):
        JaxRuntime(cpu_devices=count)


@pytest.mark.parametrize("name", ["enable_x64", "preallocate", "debug_nans", "log_compiles"])
@pytest.mark.parametrize("value", [1, "true", 0.0])
def test_bool_fields_refuse_non_bools(name, value):
    with pytest.raises(TypeError, match=name):
        JaxRuntime(**{name: value})


@pytest.mark.parametrize("name", ["enable_x64", "preallocate", "debug_nans", "log_compiles"])
def test_bool_fields_accept_bools(name):
    assert getattr(JaxRuntime(**{name: False}), name) is False


def test_matmul_precision_is_a_literal_typing_reads():
    # as 0.1.22's `MatmulPrecision = Literal[...]`: a test can list the values
    assert typing.get_args(MatmulPrecision) == (
        "default",
        "high",
        "highest",
        "bfloat16",
        "tensorfloat32",
        "float32",
    )


def test_matmul_precision_must_be_a_known_value():
    assert JaxRuntime(matmul_precision="highest").matmul_precision == "highest"
    with pytest.raises(ValueError, match="'fp8' is not one of default, high, highest"):
        JaxRuntime(matmul_precision="fp8")  # type: ignore[arg-type]


def test_compilation_cache_dir_must_be_absolute(tmp_path):
    assert JaxRuntime(compilation_cache_dir=tmp_path).compilation_cache_dir == tmp_path
    with pytest.raises(ValueError, match="must be absolute"):
        JaxRuntime(compilation_cache_dir=Path("relative/cache"))


def test_compilation_cache_dir_string_becomes_a_path(tmp_path):
    runtime = JaxRuntime(compilation_cache_dir=str(tmp_path))  # type: ignore[arg-type]
    assert runtime.compilation_cache_dir == tmp_path
    with pytest.raises(TypeError, match="must be a Path"):
        JaxRuntime(compilation_cache_dir=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01, math.nan, math.inf])
def test_memory_fraction_range(fraction):
    with pytest.raises(
        ValueError, match=r"memory_fraction=.* must be a finite number > 0 and <= 1"
    ):
        JaxRuntime(memory_fraction=fraction)


@pytest.mark.parametrize("fraction", [True, "0.5", [0.5]])
def test_memory_fraction_type(fraction):
    with pytest.raises(TypeError, match="memory_fraction"):
        JaxRuntime(memory_fraction=fraction)


def test_memory_fraction_accepts_one_and_ints():
    assert JaxRuntime(memory_fraction=1).memory_fraction == 1
    assert JaxRuntime(memory_fraction=0.75).memory_fraction == 0.75


@pytest.mark.parametrize("seconds", [-1.0, math.nan, math.inf])
def test_min_compile_time_range(seconds):
    with pytest.raises(ValueError, match="persistent_cache_min_compile_time_secs"):
        JaxRuntime(persistent_cache_min_compile_time_secs=seconds)


def test_min_compile_time_type():
    with pytest.raises(TypeError, match="persistent_cache_min_compile_time_secs"):
        JaxRuntime(persistent_cache_min_compile_time_secs=True)
    assert (
        JaxRuntime(persistent_cache_min_compile_time_secs=0).persistent_cache_min_compile_time_secs
        == 0
    )


def test_xla_flags_are_checked_at_construction():
    with pytest.raises(ValueError, match="malformed"):
        JaxRuntime(xla_flags=("xla_foo",))
    with pytest.raises(XlaFlagConflictError):
        JaxRuntime(xla_flags=("--a=1", "--a=2"))
    with pytest.raises(TypeError, match="tuple of flags"):
        JaxRuntime(xla_flags=["--a=1"])  # type: ignore[arg-type]
    assert JaxRuntime(xla_flags=("--a=1", "--a=1")).xla_flags == ("--a=1", "--a=1")


def test_cpu_devices_and_the_device_count_flag_must_agree():
    # two counts for one setting: jax took cpu_devices and dropped the flag without a word
    flag = "--xla_force_host_platform_device_count"
    with pytest.raises(ValueError, match=rf"JAX_NUM_CPU_DEVICES=4 .* {flag}=8 .* two CPU device"):
        JaxRuntime(cpu_devices=4, xla_flags=(f"{flag}=8",))
    assert JaxRuntime(cpu_devices=4, xla_flags=(f"{flag}=4",)).cpu_devices == 4


@pytest.mark.parametrize("count", ["0", "abc", "-1", "2.5"])
def test_a_device_count_flag_that_is_no_count_is_refused_like_cpu_devices(count):
    # jax then failed on "Could not determine process_index", XLA on a listing of every flag
    flag = "--xla_force_host_platform_device_count"
    match = rf"{flag}={count} \(JaxRuntime.xla_flags\) is not a number of emulated CPU devices"
    with pytest.raises(ValueError, match=match):
        JaxRuntime(xla_flags=(f"{flag}={count}",))


def test_a_quoted_xla_flag_value_is_accepted():
    runtime = JaxRuntime(xla_flags=('--xla_dump_to="/tmp/a b"',))
    assert runtime.xla_flags == ('--xla_dump_to="/tmp/a b"',)
