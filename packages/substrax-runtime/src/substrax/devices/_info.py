"""Device kinds, one reading of the visible devices, and placing a pytree on one device.

jax is imported by the functions that read or move devices, not by this module: the kinds, the
protocol and the reading's record cost nothing to import.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, cast, runtime_checkable


class DeviceKind(StrEnum):
    """The family of a jax platform.

    Example:
        >>> from substrax.devices import DeviceKind
        >>> DeviceKind.from_platform("CUDA")
        <DeviceKind.GPU: 'gpu'>
    """

    CPU = "cpu"
    GPU = "gpu"
    TPU = "tpu"
    METAL = "metal"
    OTHER = "other"

    @classmethod
    def from_platform(cls, platform: str) -> "DeviceKind":
        """Map a platform name (any case) to its kind; cuda, rocm and gpu are all GPU.

        Args:
            platform: A jax platform name, e.g. ``jax.devices()[0].platform``.

        Returns:
            The kind; ``OTHER`` for a platform this table does not know.

        Example:
            >>> from substrax.devices import DeviceKind
            >>> DeviceKind.from_platform("rocm"), DeviceKind.from_platform("weird")
            (<DeviceKind.GPU: 'gpu'>, <DeviceKind.OTHER: 'other'>)
        """
        name = platform.strip().lower()
        if name in {"cuda", "rocm", "gpu"}:
            return cls.GPU
        try:
            return cls(name)
        except ValueError:
            return cls.OTHER


@runtime_checkable
class DeviceLike(Protocol):
    """What substrax reads from a jax device (jaxlib ships no stubs for ``jax.Device``).

    Example:
        >>> import jax
        >>> from substrax.devices import DeviceLike
        >>> isinstance(jax.devices()[0], DeviceLike)
        True
    """

    @property
    def id(self) -> int:
        """The device's global id."""
        ...

    @property
    def platform(self) -> str:
        """The platform, e.g. ``"cpu"``, ``"gpu"``, ``"tpu"``."""
        ...

    @property
    def device_kind(self) -> str:
        """The hardware name, e.g. ``"NVIDIA H100 80GB HBM3"`` or ``"TPU v5 lite"``."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    """One reading of the devices jax sees.

    Attributes:
        platform: The default backend's platform name.
        kind: Its ``DeviceKind``.
        count: How many devices (across all processes).
        device_kinds: The distinct hardware names, in device order.

    Example:
        >>> from substrax.devices import DeviceInfo, DeviceKind
        >>> info = DeviceInfo(platform="cpu", kind=DeviceKind.CPU, count=8, device_kinds=("cpu",))
        >>> info.has_accelerator
        False
    """

    platform: str
    kind: DeviceKind
    count: int
    device_kinds: tuple[str, ...]

    @property
    def has_accelerator(self) -> bool:
        """Whether the devices are anything but CPUs."""
        return self.kind is not DeviceKind.CPU


def visible_devices(backend: str | None = None) -> Sequence[DeviceLike]:
    """The devices jax sees (``jax.devices(backend)``), typed as ``DeviceLike``.

    Example:
        >>> from substrax.devices import visible_devices
        >>> len(visible_devices()) >= 1
        True
    """
    import jax  # noqa: PLC0415  (reading the devices starts jax; importing this module does not)

    return cast("Sequence[DeviceLike]", jax.devices(backend))


def detect_devices() -> DeviceInfo:
    """Read the default backend's devices once; errors propagate, never a silent CPU fallback.

    Returns:
        The platform, kind, count and hardware names.

    Example:
        >>> from substrax.devices import detect_devices
        >>> info = detect_devices()
        >>> info.platform in {"cpu", "gpu", "tpu", "metal"} and info.count >= 1
        True
    """
    devices = visible_devices()
    platform = devices[0].platform
    return DeviceInfo(
        platform=platform,
        kind=DeviceKind.from_platform(platform),
        count=len(devices),
        device_kinds=tuple(dict.fromkeys(d.device_kind for d in devices)),
    )


def place_on_device[T](pytree: T, device: DeviceLike | None = None) -> T:
    """Put every leaf of ``pytree`` on one device (the first visible device by default).

    Args:
        pytree: Arrays or array-likes in any pytree.
        device: The target device, e.g. ``jax.devices()[1]``.

    Returns:
        The same structure with each leaf committed to ``device``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from substrax.devices import place_on_device
        >>> tree = place_on_device({"w": jnp.ones(2)}, jax.devices()[0])
        >>> tree["w"].devices() == {jax.devices()[0]}
        True
    """
    import jax  # noqa: PLC0415  (see visible_devices)
    from jax.sharding import SingleDeviceSharding  # noqa: PLC0415

    target = visible_devices()[0] if device is None else device
    return jax.device_put(pytree, SingleDeviceSharding(cast("Any", target)))
