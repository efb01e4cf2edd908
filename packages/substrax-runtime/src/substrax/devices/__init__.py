"""substrax.devices: one reading of the hardware, placement, and the batch-size table.

Example:
    >>> from substrax.devices import DeviceKind, detect_devices, get_batch_size_recommendation, HardwareType
    >>> info = detect_devices()
    >>> info.kind in set(DeviceKind)
    True
    >>> get_batch_size_recommendation(HardwareType.H100).critical_batch_size
    295
"""

from ._errors import UnknownHardwareError as UnknownHardwareError
from ._hardware import (
    BATCH_SIZE_TABLE as BATCH_SIZE_TABLE,
    DENSE_PEAK_TFLOPS as DENSE_PEAK_TFLOPS,
    BatchSizeRecommendation as BatchSizeRecommendation,
    HardwareType as HardwareType,
    dense_peak_flops as dense_peak_flops,
    detect_hardware_type as detect_hardware_type,
    get_batch_size_recommendation as get_batch_size_recommendation,
)
from ._info import (
    DeviceInfo as DeviceInfo,
    DeviceKind as DeviceKind,
    DeviceLike as DeviceLike,
    detect_devices as detect_devices,
    place_on_device as place_on_device,
    visible_devices as visible_devices,
)


__all__ = [
    "BATCH_SIZE_TABLE",
    "DENSE_PEAK_TFLOPS",
    "BatchSizeRecommendation",
    "DeviceInfo",
    "DeviceKind",
    "DeviceLike",
    "HardwareType",
    "UnknownHardwareError",
    "dense_peak_flops",
    "detect_devices",
    "detect_hardware_type",
    "get_batch_size_recommendation",
    "place_on_device",
    "visible_devices",
]
