"""``DevicePlacement``: the 0.1.22 helper's names, each a call to a function of this package."""

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from substrax.typing import PyTree

from ._batch import replicate_across_devices, shard_batch_dim
from ._hardware import BatchSizeRecommendation, HardwareType, get_batch_size_recommendation
from ._info import DeviceLike, place_on_device, visible_devices
from ._verdict import batch_size_verdict


if TYPE_CHECKING:
    from jax.sharding import Mesh


_logger = logging.getLogger(__name__)


class DevicePlacement:
    """Placement and batch-size checks around one default device, as substrax 0.1.22 named them.

    Holds nothing but the device it was given: every property reads the devices when asked,
    and every method calls the function of the same job in :mod:`substrax.devices`
    (:func:`place_on_device`, :func:`replicate_across_devices`, :func:`shard_batch_dim`,
    :func:`get_batch_size_recommendation`, :func:`batch_size_verdict`). New code can call those
    directly. Unlike 0.1.22, an accelerator the table does not know is ``UNKNOWN``, never
    taken for an A100 or a TPU v4.

    Args:
        default_device: Where :meth:`place_on_device` puts data; the first visible device
            when None.

    Raises:
        TypeError: ``default_device`` is not a device (a device id, say).

    Example:
        >>> import jax, numpy as np
        >>> from substrax.devices import DevicePlacement, HardwareType
        >>> placement = DevicePlacement()
        >>> placement.hardware_type is HardwareType.CPU, placement.num_devices == jax.device_count()
        (True, True)
        >>> placement.validate_batch_size(12, warn_suboptimal=False)[0]
        False
    """

    __slots__ = ("_device",)

    def __init__(self, default_device: DeviceLike | None = None) -> None:
        given = cast("object", default_device)  # a caller may pass anything, e.g. a device id
        if given is not None and not isinstance(given, DeviceLike):
            msg = (
                f"default_device={default_device!r} ({type(default_device).__name__}) is not a "
                "jax device; pass one from jax.devices() (jax.devices()[i], not i)"
            )
            raise TypeError(msg)
        self._device = default_device

    @property
    def default_device(self) -> DeviceLike:
        """The device given, or the first visible device (read when asked)."""
        return visible_devices()[0] if self._device is None else self._device

    @property
    def hardware_type(self) -> HardwareType:
        """The default device's hardware (``UNKNOWN`` when the table does not know it)."""
        device = self.default_device
        return HardwareType.from_device_kind(device.device_kind, device.platform)

    @property
    def num_devices(self) -> int:
        """How many devices are visible (``substrax.devices.visible_devices()``)."""
        return len(visible_devices())

    def place_on_device[T](self, data: T, device: DeviceLike | None = None) -> T:
        """Put every leaf of ``data`` on ``device`` (the default device when None)."""
        return place_on_device(data, self.default_device if device is None else device)

    def replicate_across_devices(
        self, data: PyTree, devices: Sequence[DeviceLike] | None = None
    ) -> PyTree:
        """Copy every array leaf to each of ``devices`` (this process's devices when None)."""
        return replicate_across_devices(data, devices)

    def shard_batch_dim(
        self, data: PyTree, mesh: "Mesh", batch_axis: int = 0, mesh_axis: str = "data"
    ) -> PyTree:
        """Split dimension ``batch_axis`` of every array leaf over ``mesh_axis`` of ``mesh``."""
        return shard_batch_dim(data, mesh, batch_axis=batch_axis, mesh_axis=mesh_axis)

    def get_batch_size_recommendation(
        self, hardware_type: HardwareType | str | None = None
    ) -> BatchSizeRecommendation:
        """The table's entry for ``hardware_type`` or its name (the default device's when None).

        Raises:
            UnknownHardwareError: The hardware is ``UNKNOWN``.
        """
        return get_batch_size_recommendation(
            self.hardware_type if hardware_type is None else hardware_type
        )

    def validate_batch_size(
        self, batch_size: int, warn_suboptimal: bool = True
    ) -> tuple[bool, str]:
        """Judge a global batch size: ``(ok, reason)`` as 0.1.22 returned it.

        :func:`batch_size_verdict` gives the same judgement as a record. A batch that splits
        but is below the hardware's critical batch size is ok; with ``warn_suboptimal`` its
        reason is also logged as a warning (logger ``substrax.devices._placement``).

        Args:
            batch_size: The global batch size.
            warn_suboptimal: Log a suboptimal (but ok) batch size as a warning.

        Example:
            >>> from substrax.devices import DevicePlacement
            >>> ok, reason = DevicePlacement().validate_batch_size(256, warn_suboptimal=False)
            >>> ok, reason.split(",")[0]
            (True, '256 rows split 32 per device over 8 devices')
        """
        verdict = batch_size_verdict(batch_size, self.num_devices, hardware_type=self.hardware_type)
        if warn_suboptimal and verdict.suboptimal:
            _logger.warning("batch size %d: %s", batch_size, verdict.reason)
        return verdict.ok, verdict.reason
