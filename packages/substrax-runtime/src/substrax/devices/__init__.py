"""substrax.devices: one reading of the hardware, placement, and the batch-size table.

Importing this package imports nothing else, not even jax: each name is loaded from its module
when first used (PEP 562), and jax starts when a function reads or moves devices.

Example:
    >>> from substrax.devices import DeviceKind, detect_devices, get_batch_size_recommendation, HardwareType
    >>> info = detect_devices()
    >>> info.kind in set(DeviceKind)
    True
    >>> get_batch_size_recommendation(HardwareType.H100).critical_batch_size
    295
"""

from typing import TYPE_CHECKING

from substrax.support import lazy_exports


if TYPE_CHECKING:
    from ._batch import (
        distribute_batch as distribute_batch,
        replicate_across_devices as replicate_across_devices,
        shard_batch_dim as shard_batch_dim,
    )
    from ._errors import (
        BatchDimensionError as BatchDimensionError,
        BatchDtypeError as BatchDtypeError,
        BatchSizeMismatchError as BatchSizeMismatchError,
        UnknownHardwareError as UnknownHardwareError,
    )
    from ._flops import (
        FlopCount as FlopCount,
        count_flops as count_flops,
        jaxpr_flops as jaxpr_flops,
    )
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
    from ._placement import DevicePlacement as DevicePlacement
    from ._verdict import (
        BatchSizeVerdict as BatchSizeVerdict,
        batch_size_verdict as batch_size_verdict,
    )


# Each public name and the private module that defines it.
_HOMES: dict[str, str] = {
    **dict.fromkeys(("distribute_batch", "replicate_across_devices", "shard_batch_dim"), "_batch"),
    **dict.fromkeys(
        (
            "BatchDimensionError",
            "BatchDtypeError",
            "BatchSizeMismatchError",
            "UnknownHardwareError",
        ),
        "_errors",
    ),
    **dict.fromkeys(("FlopCount", "count_flops", "jaxpr_flops"), "_flops"),
    **dict.fromkeys(
        (
            "BATCH_SIZE_TABLE",
            "DENSE_PEAK_TFLOPS",
            "BatchSizeRecommendation",
            "HardwareType",
            "dense_peak_flops",
            "detect_hardware_type",
            "get_batch_size_recommendation",
        ),
        "_hardware",
    ),
    **dict.fromkeys(
        (
            "DeviceInfo",
            "DeviceKind",
            "DeviceLike",
            "detect_devices",
            "place_on_device",
            "visible_devices",
        ),
        "_info",
    ),
    "DevicePlacement": "_placement",
    **dict.fromkeys(("BatchSizeVerdict", "batch_size_verdict"), "_verdict"),
}

__all__ = [
    "BATCH_SIZE_TABLE",
    "DENSE_PEAK_TFLOPS",
    "BatchDimensionError",
    "BatchDtypeError",
    "BatchSizeMismatchError",
    "BatchSizeRecommendation",
    "BatchSizeVerdict",
    "DeviceInfo",
    "DeviceKind",
    "DeviceLike",
    "DevicePlacement",
    "FlopCount",
    "HardwareType",
    "UnknownHardwareError",
    "batch_size_verdict",
    "count_flops",
    "dense_peak_flops",
    "detect_devices",
    "detect_hardware_type",
    "distribute_batch",
    "get_batch_size_recommendation",
    "jaxpr_flops",
    "place_on_device",
    "replicate_across_devices",
    "shard_batch_dim",
    "visible_devices",
]


# Each name is loaded from its module on first use (PEP 562), then kept here.
lazy_exports(__name__, _HOMES, __all__)
