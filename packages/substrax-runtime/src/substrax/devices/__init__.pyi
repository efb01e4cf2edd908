# The public names of substrax.devices, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

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
from ._flops import FlopCount as FlopCount, count_flops as count_flops, jaxpr_flops as jaxpr_flops
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
from ._narrowing import check_fits_32_bits as check_fits_32_bits
from ._placement import DevicePlacement as DevicePlacement
from ._verdict import BatchSizeVerdict as BatchSizeVerdict, batch_size_verdict as batch_size_verdict
