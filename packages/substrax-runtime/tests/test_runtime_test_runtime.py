import pytest

from substrax.runtime import JaxRuntime, RuntimeConfigurationError, resolve_test_runtime


P = "SUBSTRAX_TEST_"


def resolve(env, *, cuda=False, default=8):
    return resolve_test_runtime(
        env, prefix=P, cuda_plugin_available=cuda, default_cpu_devices=default
    )


def test_default_is_cpu_with_default_devices():
    assert resolve({}) == JaxRuntime(
        platforms=("cpu",), cpu_devices=8, compilation_cache=False, preallocate=False
    )
    assert resolve({}, default=2).cpu_devices == 2
    assert resolve({}, default=0).cpu_devices is None


def test_inherited_accelerator_platforms_do_not_move_tests():
    assert resolve({"JAX_PLATFORMS": "cuda,cpu"}, cuda=True).platforms == ("cpu",)


def test_prefixed_platforms_select_accelerators():
    assert resolve({f"{P}JAX_PLATFORMS": "cuda,cpu"}, cuda=True) == JaxRuntime(
        platforms=("cuda", "cpu"), compilation_cache=False, preallocate=False
    )
    assert resolve({f"{P}JAX_PLATFORMS": "tpu"}).platforms == ("tpu",)


def test_accelerator_memory_is_not_preallocated_unless_the_environment_says():
    """A spec review: testing.md promises "no GPU memory preallocation"; preallocate was None."""
    assert resolve({}).preallocate is False
    assert resolve({f"{P}JAX_PLATFORMS": "cuda"}, cuda=True).preallocate is False
    assert resolve({"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}).preallocate is None  # kept


@pytest.mark.parametrize(
    ("given", "platforms"),
    [
        ("METAL", ("METAL",)),
        ("metal", ("METAL",)),
        ("CUDA,Cpu", ("cuda", "cpu")),
        ("Tpu", ("tpu",)),
    ],
)
def test_platform_names_are_read_as_jax_spells_them(given, platforms):
    """A spec review: METAL was lower-cased to metal, a platform jax (case-sensitive) lacks."""
    assert resolve({f"{P}JAX_PLATFORMS": given}, cuda=True).platforms == platforms
    assert resolve({f"{P}JAX_PLATFORMS": "MyPlugin"}).platforms == ("MyPlugin",)  # as written
    assert resolve({f"{P}JAX_PLATFORMS": "CPU"}).cpu_devices == 8


def test_prefixed_cpu_only_stays_emulated():
    assert resolve({f"{P}JAX_PLATFORMS": "cpu"}).cpu_devices == 8


@pytest.mark.parametrize("name", ["cuda", "gpu", "cpu,cuda"])
def test_cuda_without_plugin_is_refused(name):
    with pytest.raises(RuntimeConfigurationError, match="no jax CUDA plugin"):
        resolve({f"{P}JAX_PLATFORMS": name}, cuda=False)


def test_device_count_variable():
    assert resolve({f"{P}DEVICE_COUNT": "4"}).cpu_devices == 4
    assert resolve({f"{P}DEVICE_COUNT": " 2 "}).cpu_devices == 2
    assert resolve({f"{P}DEVICE_COUNT": "0"}).cpu_devices is None
    # The prefixed count wins over an inherited emulation.
    assert resolve({f"{P}DEVICE_COUNT": "4", "JAX_NUM_CPU_DEVICES": "2"}).cpu_devices == 4


@pytest.mark.parametrize("raw", ["-1", "two", "", "1.5"])
def test_device_count_must_be_a_non_negative_integer(raw):
    with pytest.raises(ValueError, match=f"{P}DEVICE_COUNT"):
        resolve({f"{P}DEVICE_COUNT": raw})


def test_existing_emulation_is_left_alone():
    assert resolve({"JAX_NUM_CPU_DEVICES": "2"}).cpu_devices is None
    flags = "--xla_dump_hlo_as_text --xla_force_host_platform_device_count=4"
    assert resolve({"XLA_FLAGS": flags}).cpu_devices is None


def test_default_cpu_devices_is_checked():
    with pytest.raises(TypeError, match="default_cpu_devices"):
        resolve({}, default=True)
    with pytest.raises(ValueError, match="default_cpu_devices"):
        resolve({}, default=-1)
