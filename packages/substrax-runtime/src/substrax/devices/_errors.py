"""The errors of ``substrax.devices``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from substrax.support import StructuredError


if TYPE_CHECKING:
    from ._hardware import HardwareType


class UnknownHardwareError(StructuredError, LookupError):
    """The batch-size table has no entry for this hardware.

    Attributes:
        hardware_type: The type asked for (``UNKNOWN`` for an unrecognised accelerator).
        device_kind: The device's own name, when it was detected.

    Example:
        >>> from substrax.devices import HardwareType, UnknownHardwareError
        >>> str(UnknownHardwareError(HardwareType.UNKNOWN, "NVIDIA L40S")).startswith("no batch")
        True
    """

    __module__ = "substrax.devices"

    hardware_type: HardwareType
    device_kind: str | None = None

    def _message(self) -> str:
        from ._hardware import BATCH_SIZE_TABLE  # noqa: PLC0415  (the table imports this module)

        seen = f" (device_kind {self.device_kind!r})" if self.device_kind else ""
        return (
            f"no batch-size recommendation for {self.hardware_type.name}{seen}; the table knows "
            f"{', '.join(h.name for h in BATCH_SIZE_TABLE)}. Pass hardware_type= for the "
            "closest match, or measure (calibrax owns hardware specs)"
        )
