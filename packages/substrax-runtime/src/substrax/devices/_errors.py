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


class BatchDimensionError(StructuredError, ValueError, kw_only=True):
    """A batch leaf whose batch dimension cannot be split evenly over the devices.

    Attributes:
        path: The leaf's key path, e.g. ``"['x']"``.
        shape: The leaf's shape.
        batch_axis: The dimension asked to be split.
        parts: How many devices it was to be split over.

    Example:
        >>> from substrax.devices import BatchDimensionError
        >>> error = BatchDimensionError(path="['x']", shape=(12, 3), batch_axis=0, parts=8)
        >>> error.parts, "multiple of 8" in str(error)
        (8, True)
    """

    __module__ = "substrax.devices"

    path: str
    shape: tuple[int, ...]
    batch_axis: int
    parts: int

    def _message(self) -> str:
        where = f"batch leaf {self.path} has shape {self.shape}"
        if self.batch_axis >= len(self.shape):
            return (
                f"{where}: no dimension {self.batch_axis} to split over {self.parts} devices; "
                "pass batch_axis= naming its batch dimension, or replicate it "
                "(replicate_across_devices)"
            )
        rows = self.shape[self.batch_axis]
        return (
            f"{where}: its {rows} rows on dimension {self.batch_axis} do not split evenly over "
            f"{self.parts} devices; make the batch size a multiple of {self.parts} (drop or pad "
            "the last rows)"
        )
