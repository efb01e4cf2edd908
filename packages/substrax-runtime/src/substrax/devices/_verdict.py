"""Judging a global batch size against the device count and the batch-size table."""

from dataclasses import dataclass

from ._hardware import BATCH_SIZE_TABLE, HardwareType, as_hardware_type, detect_hardware_type
from ._info import visible_devices
from ._numbers import check_index


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSizeVerdict:
    """Whether a global batch size suits the devices, and why; truthy when it does.

    Attributes:
        ok: The batch splits evenly over the devices (and, where the table knows a memory
            ceiling, stays under it).
        reason: One sentence saying what was found and, when something is off, what to do.
        batch_size: The global batch size judged.
        num_devices: The device count it was judged against.
        per_device_batch_size: Rows per device; None when the batch does not split evenly.
        suboptimal: The batch splits, but each device gets fewer rows than the table's
            critical batch size for the hardware (the step stays memory-bound).
        hardware_type: The hardware the table was read for.

    Example:
        >>> from substrax.devices import BatchSizeVerdict, HardwareType
        >>> verdict = BatchSizeVerdict(ok=False, reason="12 rows over 8 devices", batch_size=12,
        ...                            num_devices=8, per_device_batch_size=None,
        ...                            hardware_type=HardwareType.CPU)
        >>> bool(verdict)
        False
    """

    ok: bool
    reason: str
    batch_size: int
    num_devices: int
    per_device_batch_size: int | None
    suboptimal: bool = False
    hardware_type: HardwareType = HardwareType.UNKNOWN

    def __bool__(self) -> bool:
        """``ok``: ``if batch_size_verdict(n):`` reads as the check it is."""
        return self.ok


def _uneven(batch_size: int, num_devices: int) -> str:
    below = batch_size - batch_size % num_devices
    above = below + num_devices
    choices = f"{below} or {above}" if below else f"{above}"
    return (
        f"{batch_size} rows do not split evenly over {num_devices} devices "
        f"({batch_size % num_devices} left over); use a multiple of {num_devices}, e.g. {choices}"
    )


def batch_size_verdict(
    batch_size: int,
    num_devices: int | None = None,
    *,
    hardware_type: HardwareType | str | None = None,
) -> BatchSizeVerdict:
    """Judge a global batch size against the device count and the hardware's table entry.

    A batch that does not split evenly is not ok. One that splits but leaves each device fewer
    rows than the hardware's critical batch size is ok and ``suboptimal``; hardware the table
    does not know (``UNKNOWN``) is judged on the split alone.

    Args:
        batch_size: The global batch size (every process's rows together); an int or a
            NumPy integer.
        num_devices: The devices it is split over; every visible device when None.
        hardware_type: The hardware whose table entry applies, or its name in any case
            (``"h100"``); detected from the first visible device when None.

    Returns:
        The verdict, truthy when ok, with the reason.

    Raises:
        TypeError: ``batch_size`` or ``num_devices`` is not an integer (or is a bool), or
            ``hardware_type`` is neither a ``HardwareType`` nor a string.
        ValueError: Either number is below 1, or ``hardware_type`` names no ``HardwareType``.

    Example:
        >>> from substrax.devices import HardwareType, batch_size_verdict
        >>> verdict = batch_size_verdict(12, 8, hardware_type=HardwareType.H100)
        >>> bool(verdict), verdict.reason
        (False, '12 rows do not split evenly over 8 devices (4 left over); use a multiple of 8, e.g. 8 or 16')
        >>> batch_size_verdict(4096, 8, hardware_type=HardwareType.H100).per_device_batch_size
        512
    """
    rows = check_index("batch_size", batch_size, minimum=1)
    count = check_index(
        "num_devices", len(visible_devices()) if num_devices is None else num_devices, minimum=1
    )
    hardware = detect_hardware_type() if hardware_type is None else as_hardware_type(hardware_type)
    ok, reason, suboptimal = _judge(rows, count, hardware)
    return BatchSizeVerdict(
        ok=ok,
        reason=reason,
        batch_size=rows,
        num_devices=count,
        per_device_batch_size=None if rows % count else rows // count,
        suboptimal=suboptimal,
        hardware_type=hardware,
    )


def _judge(batch_size: int, count: int, hardware: HardwareType) -> tuple[bool, str, bool]:
    """``(ok, reason, suboptimal)`` for ``batch_size`` rows over ``count`` devices."""
    if batch_size % count:
        return False, _uneven(batch_size, count), False
    per_device = batch_size // count
    split = f"{batch_size} rows split {per_device} per device over {count} devices"
    entry = BATCH_SIZE_TABLE.get(hardware)
    if entry is None:
        return True, f"{split}; the batch-size table has no entry for {hardware.name}", False
    ceiling = entry.max_memory_batch_size
    if ceiling is not None and per_device > ceiling:
        return (
            False,
            f"{split}, above {hardware.name}'s memory ceiling of {ceiling} per device; use at "
            f"most {ceiling * count} rows, or more devices",
            False,
        )
    critical = entry.critical_batch_size
    if per_device < critical:
        return (
            True,
            f"{split}, below {hardware.name}'s critical batch size of {critical} per device, "
            f"so the step stays memory-bound; {entry.optimal_batch_size * count} rows "
            f"({entry.optimal_batch_size} per device) is the table's starting point",
            True,
        )
    return True, f"{split}, at or above {hardware.name}'s critical batch size of {critical}", False
