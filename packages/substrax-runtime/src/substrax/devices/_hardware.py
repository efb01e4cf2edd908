"""Per-hardware batch-size starting points, as frozen data.

The numbers are a roofline heuristic, not a measurement: ``critical_batch_size`` is the
accelerator's dense bf16 peak divided by its memory bandwidth (FLOPs per byte), the batch
size at which a dense layer's weights are read once per that many FLOPs and the step turns
compute-bound. ``optimal_batch_size`` rounds it up to a multiple of 8. Hardware spec tables
proper belong to calibrax; an accelerator this table does not know is reported as
``HardwareType.UNKNOWN`` and never guessed.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from substrax.support import check_int

from ._info import DeviceKind, DeviceLike, visible_devices


class HardwareType(Enum):
    """Hardware the batch-size table knows, plus ``CPU`` and ``UNKNOWN``.

    ``HardwareType(text)`` takes a member's name or value in any case, so ``"H100"``,
    ``"h100"`` and ``"tpu_v5e"`` all name one; wherever substrax takes a ``hardware_type``, such
    a string works too.

    Example:
        >>> from substrax.devices import HardwareType
        >>> HardwareType.from_device_kind("NVIDIA H100 80GB HBM3")
        <HardwareType.H100: 'h100'>
        >>> HardwareType.from_device_kind("NVIDIA L40S")
        <HardwareType.UNKNOWN: 'unknown'>
        >>> HardwareType("TPU_V5E")
        <HardwareType.TPU_V5E: 'tpu_v5e'>
    """

    H100 = "h100"
    H200 = "h200"
    B200 = "b200"
    L4 = "l4"
    A100 = "a100"
    V100 = "v100"
    TPU_V4 = "tpu_v4"
    TPU_V5E = "tpu_v5e"
    TPU_V5P = "tpu_v5p"
    TPU_V6E = "tpu_v6e"
    CPU = "cpu"
    UNKNOWN = "unknown"

    @classmethod
    def _missing_(cls, value: object) -> "HardwareType | None":
        """A name or value in any case (``"H100"``, ``" tpu_v4 "``); None for anything else."""
        if isinstance(value, str):
            text = value.strip().lower()
            for member in cls:
                if text in {member.value, member.name.lower()}:
                    return member
        return None

    @classmethod
    def from_device_kind(cls, device_kind: str, platform: str | None = None) -> "HardwareType":
        """Recognise a device's ``device_kind`` string; anything unrecognised is ``UNKNOWN``.

        Args:
            device_kind: e.g. ``"NVIDIA A100-SXM4-80GB"``, ``"TPU v5 lite"``, ``"cpu"``.
            platform: The device's platform; a ``cpu`` platform is always ``CPU``.

        Returns:
            The hardware type.

        Example:
            >>> from substrax.devices import HardwareType
            >>> HardwareType.from_device_kind("TPU v6 lite")
            <HardwareType.TPU_V6E: 'tpu_v6e'>
        """
        if platform is not None and DeviceKind.from_platform(platform) is DeviceKind.CPU:
            return cls.CPU
        text = device_kind.strip()
        for pattern, hardware in _DEVICE_KIND_PATTERNS.items():
            if re.search(pattern, text, re.IGNORECASE):
                return hardware
        return cls.UNKNOWN


# Word boundaries keep L40S off L4 and GH200 off H200; TPU v5p reports itself as "TPU v5".
# A card whose peak differs from the part named here is unknown rather than given that part's
# peak, which would read its MFU wrong: the H100 and H200 are the SXM parts (a PCIe or NVL card
# has 756 or 835 TFLOP/s, not 989), the V100 the SXM2 part (PCIe 112, V100S 130, not 125), and
# a MIG slice of any card ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") has a fraction of its compute.
# The patterns are tried in order, ignoring case; the first that matches names the hardware.
_DEVICE_KIND_PATTERNS: Mapping[str, HardwareType] = MappingProxyType(
    {
        r"^cpu$": HardwareType.CPU,
        r"\bMIG\b": HardwareType.UNKNOWN,
        r"\bH[12]00\b.*\b(PCIe|NVL)\b": HardwareType.UNKNOWN,
        r"\bH100\b": HardwareType.H100,
        r"\bH200\b": HardwareType.H200,
        r"\bB200\b": HardwareType.B200,
        r"\bL4\b": HardwareType.L4,
        r"\bA100\b": HardwareType.A100,
        r"\bV100-SXM": HardwareType.V100,
        r"^TPU v4$": HardwareType.TPU_V4,
        r"^TPU v5( lite|e)$": HardwareType.TPU_V5E,
        r"^TPU v5p?$": HardwareType.TPU_V5P,
        r"^TPU v6( lite|e)$": HardwareType.TPU_V6E,
    }
)


@dataclass(frozen=True, slots=True)  # by position too, in 0.1.22's order
class BatchSizeRecommendation:
    """Per-device batch-size starting points for one kind of hardware.

    Attributes:
        min_batch_size: Below this the device mostly idles.
        optimal_batch_size: A tile-friendly starting point at or above the critical size.
        critical_batch_size: Where a dense step turns compute-bound (peak FLOPs / bandwidth).
        max_memory_batch_size: A memory ceiling, when one is known (it depends on the model).
        notes: Where the numbers come from.

    Raises:
        TypeError: A size is not an int.
        ValueError: A size is below 1, or ``min_batch_size > optimal_batch_size``.

    Example:
        >>> from substrax.devices import BatchSizeRecommendation
        >>> BatchSizeRecommendation(min_batch_size=1, optimal_batch_size=8, critical_batch_size=8)
        BatchSizeRecommendation(min_batch_size=1, optimal_batch_size=8, critical_batch_size=8, max_memory_batch_size=None, notes='')
    """

    min_batch_size: int
    optimal_batch_size: int
    critical_batch_size: int
    max_memory_batch_size: int | None = None
    notes: str = ""

    def __post_init__(self) -> None:
        sizes = {
            "min_batch_size": self.min_batch_size,
            "optimal_batch_size": self.optimal_batch_size,
            "critical_batch_size": self.critical_batch_size,
        }
        if self.max_memory_batch_size is not None:
            sizes["max_memory_batch_size"] = self.max_memory_batch_size
        for name, value in sizes.items():
            check_int(name, value, minimum=1)
        if self.min_batch_size > self.optimal_batch_size:
            raise ValueError(
                f"min_batch_size {self.min_batch_size} exceeds optimal_batch_size "
                f"{self.optimal_batch_size}"
            )


def _roofline(
    tflops: float, tbps: float, memory: str, precision: str = "bf16"
) -> BatchSizeRecommendation:
    critical = round(tflops / tbps)
    return BatchSizeRecommendation(
        min_batch_size=8,
        optimal_batch_size=-(-critical // 8) * 8,
        critical_batch_size=critical,
        notes=f"dense {precision} {tflops:g} TFLOP/s over {tbps:g} TB/s; {memory}",
    )


DENSE_PEAK_TFLOPS: Mapping[HardwareType, float] = MappingProxyType(
    {
        HardwareType.H100: 989.0,
        HardwareType.H200: 989.0,
        HardwareType.B200: 2250.0,
        HardwareType.L4: 121.0,
        HardwareType.A100: 312.0,
        # NVIDIA V100 datasheet (SXM2): 125 TFLOP/s dense fp16 on tensor cores; Volta has no
        # bf16, so its fp16 tensor peak stands in.
        HardwareType.V100: 125.0,
        # Google Cloud TPU v4 documentation (system architecture): 275 TFLOP/s bf16 per chip.
        HardwareType.TPU_V4: 275.0,
        HardwareType.TPU_V5E: 197.0,
        HardwareType.TPU_V5P: 459.0,
        HardwareType.TPU_V6E: 918.0,
    }
)
"""Each accelerator's dense bf16 peak per device, in TFLOP/s (read-only; V100, which lacks bf16:
fp16); no CPU or UNKNOWN entry."""

_PEAK = DENSE_PEAK_TFLOPS

BATCH_SIZE_TABLE: Mapping[HardwareType, BatchSizeRecommendation] = MappingProxyType(
    {
        HardwareType.H100: _roofline(_PEAK[HardwareType.H100], 3.35, "80 GB HBM3 (SXM)"),
        HardwareType.H200: _roofline(_PEAK[HardwareType.H200], 4.8, "141 GB HBM3e"),
        HardwareType.B200: _roofline(_PEAK[HardwareType.B200], 8.0, "180 GB HBM3e"),
        HardwareType.L4: _roofline(_PEAK[HardwareType.L4], 0.3, "24 GB GDDR6"),
        HardwareType.A100: _roofline(_PEAK[HardwareType.A100], 2.039, "80 GB HBM2e (SXM)"),
        # the same datasheets: V100 SXM2 900 GB/s HBM2; TPU v4 1200 GB/s HBM2 per chip
        HardwareType.V100: _roofline(
            _PEAK[HardwareType.V100], 0.9, "16 or 32 GB HBM2 (SXM2)", precision="fp16"
        ),
        HardwareType.TPU_V4: _roofline(_PEAK[HardwareType.TPU_V4], 1.2, "32 GB HBM2"),
        HardwareType.TPU_V5E: _roofline(_PEAK[HardwareType.TPU_V5E], 0.819, "16 GB HBM2"),
        HardwareType.TPU_V5P: _roofline(_PEAK[HardwareType.TPU_V5P], 2.765, "95 GB HBM2e"),
        HardwareType.TPU_V6E: _roofline(_PEAK[HardwareType.TPU_V6E], 1.64, "32 GB HBM"),
        HardwareType.CPU: BatchSizeRecommendation(
            min_batch_size=1,
            optimal_batch_size=32,
            critical_batch_size=32,
            notes="no roofline: CPU runs are for tests and debugging; keep batches small",
        ),
    }
)
"""The recommendations by hardware (read-only). ``UNKNOWN`` has no entry by design."""


def as_hardware_type(value: object) -> HardwareType:
    """``value`` as a ``HardwareType``: a member, or a member's name or value in any case.

    Raises:
        TypeError: ``value`` is neither a ``HardwareType`` nor a string.
        ValueError: The string names no ``HardwareType``.
    """
    if isinstance(value, HardwareType):
        return value
    names = ", ".join(member.name for member in HardwareType)
    if not isinstance(value, str):
        msg = (
            f"hardware_type={value!r} must be a HardwareType or one of its names ({names}), "
            f"not {type(value).__name__}"
        )
        raise TypeError(msg)
    try:
        return HardwareType(value)
    except ValueError:
        msg = f"hardware_type={value!r} names no HardwareType; use one of {names} (any case)"
        raise ValueError(msg) from None


def detect_hardware_type(devices: Sequence[DeviceLike] | None = None) -> HardwareType:
    """The hardware type of the first visible device (``UNKNOWN`` when unrecognised).

    Example:
        >>> import jax
        >>> from substrax.devices import detect_hardware_type
        >>> detect_hardware_type(jax.devices("cpu"))
        <HardwareType.CPU: 'cpu'>
    """
    first = (visible_devices() if devices is None else devices)[0]
    return HardwareType.from_device_kind(first.device_kind, first.platform)


def get_batch_size_recommendation(
    hardware_type: HardwareType | str | None = None,
) -> BatchSizeRecommendation:
    """Look up the batch-size starting points for ``hardware_type`` (detected when ``None``).

    Args:
        hardware_type: The hardware, or its name in any case (``"h100"``); ``None`` detects it
            from the first visible device.

    Returns:
        The table's entry.

    Raises:
        UnknownHardwareError: The hardware is ``UNKNOWN`` (a ``LookupError``): an unrecognised
            accelerator is never given another one's numbers.
        TypeError: ``hardware_type`` is neither a ``HardwareType`` nor a string.
        ValueError: The string names no ``HardwareType``.

    Example:
        >>> from substrax.devices import HardwareType, get_batch_size_recommendation
        >>> get_batch_size_recommendation(HardwareType.TPU_V5E).critical_batch_size
        241
    """
    device_kind: str | None = None
    if hardware_type is None:
        first = visible_devices()[0]
        device_kind = first.device_kind
        hardware = HardwareType.from_device_kind(device_kind, first.platform)
    else:
        hardware = as_hardware_type(hardware_type)
    try:
        return BATCH_SIZE_TABLE[hardware]
    except KeyError:
        from ._errors import UnknownHardwareError  # noqa: PLC0415 - _errors imports this module

        raise UnknownHardwareError(hardware, device_kind) from None


def dense_peak_flops(hardware_type: HardwareType | str | None = None) -> float | None:
    """One device's dense bf16 peak in FLOP/s, or None where it is unknown (CPU, ``UNKNOWN``).

    The denominator of model FLOPs utilisation (MFU). An unrecognised accelerator is never
    given another one's peak.

    Args:
        hardware_type: The hardware, or its name in any case; ``None`` detects it from the
            first visible device.

    Example:
        >>> from substrax.devices import HardwareType, dense_peak_flops
        >>> dense_peak_flops(HardwareType.H100)
        989000000000000.0
        >>> dense_peak_flops(HardwareType.CPU) is None
        True
    """
    hardware = detect_hardware_type() if hardware_type is None else as_hardware_type(hardware_type)
    tflops = DENSE_PEAK_TFLOPS.get(hardware)
    return None if tflops is None else tflops * 1e12
