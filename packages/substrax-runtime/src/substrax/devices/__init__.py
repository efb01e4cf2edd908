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

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read);
# each loads from its module on first use (PEP 562), then is kept here.
lazy_exports(__name__)
