import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from substrax.devices import (
    BATCH_SIZE_TABLE,
    DENSE_PEAK_TFLOPS,
    BatchSizeRecommendation,
    DeviceInfo,
    DeviceKind,
    DeviceLike,
    HardwareType,
    UnknownHardwareError,
    dense_peak_flops,
    detect_devices,
    detect_hardware_type,
    get_batch_size_recommendation,
    place_on_device,
    visible_devices,
)
from substrax.runtime import RuntimeConfigurationError


@pytest.mark.parametrize(
    ("kind", "platforms"),
    [
        (DeviceKind.CPU, ["cpu", "CPU"]),
        (DeviceKind.GPU, ["cuda", "rocm", "gpu"]),
        (DeviceKind.TPU, ["TPU"]),
        (DeviceKind.METAL, ["METAL"]),
        (DeviceKind.OTHER, ["neuron"]),
    ],
)
def test_kind_from_platform(kind, platforms):
    for platform in platforms:
        assert DeviceKind.from_platform(platform) is kind, platform


def test_detect_devices_names_jax_platforms_when_jax_started_no_backend(monkeypatch):
    # JAX_PLATFORMS=cuda without a GPU or the CUDA plugin: jax's bare AssertionError came through
    from substrax.devices import _info

    def no_backend(backend=None):
        raise AssertionError

    monkeypatch.setattr(_info, "visible_devices", no_backend)
    platforms = jax.config.jax_platforms
    if not platforms:
        with pytest.raises(AssertionError):
            detect_devices()
        return
    with pytest.raises(RuntimeConfigurationError, match=r"JAX_PLATFORMS=.*jax\[cuda12\]") as info:
        detect_devices()
    assert f"JAX_PLATFORMS={platforms!r}" in str(info.value)
    assert "set JAX_PLATFORMS=cpu" in str(info.value)
    assert isinstance(info.value.__cause__, AssertionError)


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("platforms", ["CPU", "rocm"])
def test_detect_devices_with_platforms_jax_cannot_start_names_the_setting(child, platforms):
    message, cause = child(_DETECT, env={"JAX_PLATFORMS": platforms})
    assert message.startswith(f"jax could not start the platforms JAX_PLATFORMS={platforms!r}")
    assert cause == "RuntimeError"


# Run in a child: detect_devices' error (its message and cause's type), or null when none is raised
_DETECT = (
    "import json\n"
    "from substrax.devices import detect_devices\n"
    "from substrax.runtime import RuntimeConfigurationError\n"
    "try:\n"
    "    detect_devices()\n"
    "except RuntimeConfigurationError as error:\n"
    "    print(json.dumps([str(error), type(error.__cause__).__name__]))\n"
    "else:\n"
    "    print('null')\n"
)


@pytest.mark.usefixtures("child_processes")
def test_detect_devices_with_cuda_and_no_gpu_raises_the_project_error(child):
    from substrax.runtime.managed_env import nvidia_gpu_visible

    if nvidia_gpu_visible():
        pytest.skip("a GPU is visible: jax may start cuda here")
    message, _ = child(_DETECT, env={"JAX_PLATFORMS": "cuda"})
    assert message.startswith("jax started none of the platforms JAX_PLATFORMS='cuda'")


@pytest.mark.usefixtures("child_processes")
def test_detect_devices_with_no_cpu_devices_names_the_setting(child):
    # jax failed on "Could not determine process_index for this process", naming no setting
    message, cause = child(_DETECT, env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "0"})
    assert message.startswith("jax could not start its CPU backend with JAX_NUM_CPU_DEVICES=0")
    assert "set it to a whole number >= 1" in message
    assert cause == "RuntimeError"


def test_detect_devices_reads_the_emulated_cpus():
    info = detect_devices()
    assert info == DeviceInfo(
        platform="cpu", kind=DeviceKind.CPU, count=jax.device_count(), device_kinds=("cpu",)
    )
    assert info.count == 8
    assert not info.has_accelerator
    assert dataclasses.replace(info, kind=DeviceKind.TPU).has_accelerator


@pytest.mark.parametrize(
    ("field", "bad", "error", "match"),
    [
        ("platform", 3, TypeError, r"platform must be a jax platform name \(a str\), not int 3"),
        ("platform", " ", ValueError, r"platform=' ' must name a jax platform"),
        ("kind", "cpu", TypeError, r"kind must be a DeviceKind.*not str 'cpu'"),
        ("count", 0, ValueError, r"count=0 must be an integer >= 1"),
        ("count", -2, ValueError, r"count=-2 must be an integer >= 1"),
        ("count", "8", TypeError, r"count='8' must be an integer >= 1, not str"),
        ("count", True, TypeError, r"count=True must be an integer >= 1, not bool"),
        ("device_kinds", "cpu", TypeError, r"device_kinds must be a tuple .*not str 'cpu'"),
        ("device_kinds", ["cpu"], TypeError, r"device_kinds must be a tuple .*not list"),
        ("device_kinds", ("cpu", 1), TypeError, r"device_kinds\[1\] must be a hardware name"),
        ("device_kinds", (), ValueError, r"device_kinds=\(\) must name at least one"),
    ],
)
def test_device_info_refuses_nonsense_fields_naming_them(field, bad, error, match):
    fields = {"platform": "cpu", "kind": DeviceKind.CPU, "count": 8, "device_kinds": ("cpu",)}
    with pytest.raises(error, match=match):
        DeviceInfo(**{**fields, field: bad})
    assert DeviceInfo(**{**fields, "count": np.int64(2)}).count == 2  # a numpy count is an int


def test_visible_devices_are_device_like():
    devices = visible_devices()
    assert len(devices) == jax.device_count()
    assert all(isinstance(d, DeviceLike) for d in devices)
    assert [d.id for d in devices] == [d.id for d in jax.devices()]


def test_place_on_device_defaults_to_the_first_device():
    tree = place_on_device({"a": np.arange(3), "b": [jnp.ones(2)]})
    assert tree["a"].devices() == {jax.devices()[0]}
    assert tree["b"][0].devices() == {jax.devices()[0]}


def test_place_on_a_chosen_device():
    target = jax.devices()[3]
    moved = place_on_device(jnp.arange(4), target)
    assert moved.devices() == {target}
    assert moved.tolist() == [0, 1, 2, 3]


def test_place_on_device_takes_0_1_22s_keyword():
    assert place_on_device(data=jnp.arange(2), device=jax.devices()[1]).devices() == {
        jax.devices()[1]
    }


def test_a_bare_array_jax_cannot_hold_is_named_as_the_batch():
    from substrax.devices import BatchDtypeError

    with pytest.raises(BatchDtypeError, match=r"^the batch \(one array\) is int64 with values"):
        place_on_device(np.array([2**40]))


@pytest.mark.parametrize("bad", ["cpu", 3, jax.devices])
def test_place_on_device_refuses_what_is_not_a_device_naming_it(bad):
    with pytest.raises(TypeError, match=r"device=.* is not a jax device; pass one from jax"):
        place_on_device(jnp.arange(4), bad)


@pytest.mark.parametrize(
    ("hardware", "device_kinds"),
    [
        (HardwareType.H100, ["NVIDIA H100 80GB HBM3"]),
        (HardwareType.H200, ["NVIDIA H200"]),
        (HardwareType.B200, ["NVIDIA B200"]),
        (HardwareType.L4, ["NVIDIA L4"]),
        (HardwareType.A100, ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB"]),  # one peak
        (HardwareType.TPU_V5E, ["TPU v5 lite", "TPU v5e"]),
        (HardwareType.TPU_V5P, ["TPU v5", "TPU v5p"]),
        (HardwareType.TPU_V6E, ["TPU v6 lite"]),
        (HardwareType.V100, ["Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"]),
        (HardwareType.TPU_V4, ["TPU v4"]),
        (HardwareType.CPU, ["cpu"]),
        # Unknown accelerators are never guessed as a neighbour.
        (
            HardwareType.UNKNOWN,
            [
                "NVIDIA L40S",
                "NVIDIA GH200 480GB",
                # not the SXM parts' 989 TFLOP/s: 756 (PCIe) and 835 (NVL) would read MFU low
                "NVIDIA H100 PCIe",
                "NVIDIA H100 NVL",
                "NVIDIA H200 NVL",
                # hostile findings: not the SXM2 V100's 125 TFLOP/s (112 and 130), and a MIG
                # slice has a fraction of its card's compute
                "Tesla V100-PCIE-32GB",
                "Tesla V100S-PCIE-32GB",
                "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
                "NVIDIA B200 MIG 1g.23gb",
                "TPU v4 lite",
                "Quadro GV100",
                "NVIDIA V1000",
                "AMD Instinct MI300X",
                "",
            ],
        ),
    ],
)
def test_hardware_from_device_kind(hardware, device_kinds):
    for device_kind in device_kinds:
        assert HardwareType.from_device_kind(device_kind) is hardware, device_kind


def test_cpu_platform_is_cpu_whatever_its_name():
    assert HardwareType.from_device_kind("Intel Xeon", "cpu") is HardwareType.CPU
    assert detect_hardware_type() is HardwareType.CPU


def test_table_covers_every_known_hardware_and_is_frozen():
    assert set(BATCH_SIZE_TABLE) == set(HardwareType) - {HardwareType.UNKNOWN}
    with pytest.raises(TypeError):
        BATCH_SIZE_TABLE[HardwareType.UNKNOWN] = BATCH_SIZE_TABLE[HardwareType.CPU]  # type: ignore[index]
    for rec in BATCH_SIZE_TABLE.values():
        assert rec.min_batch_size <= rec.critical_batch_size <= rec.optimal_batch_size
        assert rec.optimal_batch_size % 8 == 0
        assert rec.notes


def test_dense_peak_is_known_for_accelerators_and_none_on_cpu_or_unknown():
    assert dense_peak_flops(HardwareType.A100) == pytest.approx(312e12)
    assert dense_peak_flops(HardwareType.CPU) is None
    assert dense_peak_flops(HardwareType.UNKNOWN) is None
    assert dense_peak_flops() is None  # the tests run on CPU devices
    assert set(DENSE_PEAK_TFLOPS) == set(BATCH_SIZE_TABLE) - {HardwareType.CPU}


def test_recommendation_values_follow_the_roofline():
    assert get_batch_size_recommendation(HardwareType.H100).critical_batch_size == 295
    assert get_batch_size_recommendation(HardwareType.TPU_V5E).critical_batch_size == 241
    # V100 SXM2: 125 TFLOP/s fp16 over 0.9 TB/s; TPU v4: 275 TFLOP/s bf16 over 1.2 TB/s
    v100 = get_batch_size_recommendation(HardwareType.V100)
    assert (v100.critical_batch_size, v100.optimal_batch_size) == (139, 144)
    assert "fp16" in v100.notes
    assert get_batch_size_recommendation(HardwareType.TPU_V4).critical_batch_size == 229
    assert dense_peak_flops(HardwareType.V100) == pytest.approx(125e12)
    assert dense_peak_flops(HardwareType.TPU_V4) == pytest.approx(275e12)
    assert get_batch_size_recommendation().critical_batch_size == 32  # detected: cpu


def test_unknown_hardware_is_a_lookup_error():
    with pytest.raises(UnknownHardwareError) as info:
        get_batch_size_recommendation(HardwareType.UNKNOWN)
    assert isinstance(info.value, LookupError)
    assert info.value.hardware_type is HardwareType.UNKNOWN
    assert "Pass hardware_type=" in str(info.value)
    assert "H100" in str(info.value)


@pytest.mark.parametrize("name", ["h100", "H100", " H100 "])
def test_a_hardware_type_is_named_by_its_name_or_value_in_any_case(name):
    assert HardwareType(name) is HardwareType.H100
    assert get_batch_size_recommendation(name).critical_batch_size == 295
    assert dense_peak_flops(name) == pytest.approx(989e12)


def test_a_string_naming_no_hardware_type_is_refused_with_the_names():
    assert HardwareType("Tpu_V5E") is HardwareType.TPU_V5E
    with pytest.raises(ValueError, match=r"hardware_type='H800' names no HardwareType") as info:
        get_batch_size_recommendation("H800")
    assert "H100, H200" in str(info.value)
    with pytest.raises(TypeError, match=r"hardware_type=3 must be a HardwareType .*not int"):
        dense_peak_flops(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"min_batch_size": 0, "optimal_batch_size": 8, "critical_batch_size": 8}, ValueError),
        ({"min_batch_size": 16, "optimal_batch_size": 8, "critical_batch_size": 8}, ValueError),
        ({"min_batch_size": 1, "optimal_batch_size": True, "critical_batch_size": 8}, TypeError),
        (
            {
                "min_batch_size": 1,
                "optimal_batch_size": 8,
                "critical_batch_size": 8,
                "max_memory_batch_size": 0,
            },
            ValueError,
        ),
    ],
)
def test_recommendation_validation(kwargs, error):
    with pytest.raises(error, match="batch_size"):
        BatchSizeRecommendation(**kwargs)


def test_device_records_are_built_by_position_as_in_0_1_22():
    info = DeviceInfo("gpu", DeviceKind.GPU, 2, ("NVIDIA H100 80GB HBM3",) * 2)
    assert info.has_accelerator
    assert info == DeviceInfo(
        platform="gpu", kind=DeviceKind.GPU, count=2, device_kinds=("NVIDIA H100 80GB HBM3",) * 2
    )
    recommendation = BatchSizeRecommendation(8, 64, 256)
    assert (recommendation.max_memory_batch_size, recommendation.notes) == (None, "")
