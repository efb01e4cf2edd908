"""Device kinds, one reading of the visible devices, and placing a pytree on one device.

jax is imported by the functions that read or move devices, not by this module: the kinds, the
protocol and the reading's record cost nothing to import.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, cast, runtime_checkable

from substrax.support import check_type

from ._numbers import check_index


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


@dataclass(frozen=True, slots=True)  # by position too, in 0.1.22's order
class DeviceInfo:
    """One reading of the devices jax sees.

    Attributes:
        platform: The default backend's platform name.
        kind: Its ``DeviceKind``.
        count: How many devices (across all processes), at least 1.
        device_kinds: The distinct hardware names, in device order (at least one).

    Raises:
        TypeError: A field has the wrong type (``count="8"``, ``kind="cpu"``, a list of names).
        ValueError: ``platform`` is empty, ``count`` is below 1 or ``device_kinds`` is empty.

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

    def __post_init__(self) -> None:
        platform = check_type("platform", self.platform, str, "a jax platform name (a str)")
        if not platform.strip():
            raise ValueError(f"platform={platform!r} must name a jax platform, e.g. 'cpu'")
        check_type("kind", self.kind, DeviceKind, "a DeviceKind, e.g. DeviceKind.CPU")
        check_index("count", self.count, minimum=1)
        wanted = "a tuple of hardware names (str), e.g. ('cpu',)"
        names = check_type("device_kinds", self.device_kinds, tuple, wanted)
        for i, name in enumerate(cast("tuple[object, ...]", names)):
            check_type(f"device_kinds[{i}]", name, str, "a hardware name (a str)")
        if not names:
            raise ValueError(f"device_kinds=() must name at least one device kind: {wanted}")

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


def _no_backend_error() -> Exception | None:
    """The error to raise when jax started no backend at all, or ``None`` if it is not that.

    With ``JAX_PLATFORMS=cuda`` and no visible NVIDIA GPU, jax skips the one platform it was
    asked for and fails on a bare ``AssertionError``.
    """
    import jax  # noqa: PLC0415  (see visible_devices)

    from substrax.runtime import RuntimeConfigurationError  # noqa: PLC0415

    platforms = str(jax.config.jax_platforms or "")
    if not platforms:
        return None
    return RuntimeConfigurationError(
        f"jax started none of the platforms JAX_PLATFORMS={platforms!r} (jax_platforms) names: "
        "for cuda it needs a visible NVIDIA GPU and jax's CUDA plugin (install jax[cuda12], the "
        "substrax-runtime[cuda12] extra); on a machine without one, set JAX_PLATFORMS=cpu, or "
        "unset it to let jax choose"
    )


def _no_cpu_devices_error() -> Exception | None:
    """The error to raise when jax's CPU backend failed for ``JAX_NUM_CPU_DEVICES=0``, or ``None``.

    jax takes 0 emulated CPU devices and fails as its backend starts, on "Could not determine
    process_index", which names neither the setting nor its fix.
    """
    import jax  # noqa: PLC0415  (see visible_devices)

    from substrax.runtime import RuntimeConfigurationError  # noqa: PLC0415

    if jax.config.jax_num_cpu_devices != 0:
        return None
    return RuntimeConfigurationError(
        "jax could not start its CPU backend with JAX_NUM_CPU_DEVICES=0 (jax_num_cpu_devices): "
        "it needs at least 1 emulated CPU device; set it to a whole number >= 1, unset it, or "
        "pass JaxRuntime(cpu_devices=...)"
    )


def _backend_failed_error(error: RuntimeError) -> Exception:
    """The error to raise when jax could not start a backend: jax's own words, and the setting.

    ``JAX_PLATFORMS=gpu`` on a machine without one, ``JAX_PLATFORMS=CPU``, a failing plugin.
    """
    import jax  # noqa: PLC0415  (see visible_devices)

    from substrax.runtime import RuntimeConfigurationError  # noqa: PLC0415

    platforms = str(jax.config.jax_platforms or "")
    if not platforms:
        return RuntimeConfigurationError(
            f"jax could not start a backend ({error}); JAX_PLATFORMS is unset, so a failing "
            "plugin is the likely cause: set JAX_PLATFORMS=cpu to skip it, or uninstall it"
        )
    return RuntimeConfigurationError(
        f"jax could not start the platforms JAX_PLATFORMS={platforms!r} (jax_platforms) names "
        f"({error}); name platforms this machine has, in jax's spelling (case-sensitive: cpu, "
        "cuda, rocm, gpu, tpu), install their plugin (jax[cuda12], the substrax-runtime[cuda12] "
        "extra), or unset JAX_PLATFORMS to let jax choose"
    )


def detect_devices() -> DeviceInfo:
    """Read the default backend's devices once; errors propagate, never a silent CPU fallback.

    Returns:
        The platform, kind, count and hardware names.

    Raises:
        RuntimeConfigurationError: jax could not start a backend: ``JAX_PLATFORMS`` names
            platforms this machine lacks (``cuda`` or ``gpu`` without a GPU or its plugin,
            ``tpu`` without a TPU) or jax does not know (``CPU``: names are case-sensitive), a
            plugin failed, or ``JAX_NUM_CPU_DEVICES=0`` left jax's CPU backend no device. The
            message holds jax's own and names the setting.

    Example:
        >>> from substrax.devices import detect_devices
        >>> info = detect_devices()
        >>> info.platform in {"cpu", "gpu", "tpu", "metal"} and info.count >= 1
        True
    """
    try:
        devices = visible_devices()
    except AssertionError as error:  # jax's own, when it started no backend
        replacement = _no_backend_error()
        if replacement is None:
            raise
        raise replacement from error
    except RuntimeError as error:  # jax's "Unable to initialize backend '...'"
        raise (_no_cpu_devices_error() or _backend_failed_error(error)) from error
    platform = devices[0].platform
    return DeviceInfo(
        platform=platform,
        kind=DeviceKind.from_platform(platform),
        count=len(devices),
        device_kinds=tuple(dict.fromkeys(d.device_kind for d in devices)),
    )


def place_on_device[T](data: T, device: DeviceLike | None = None) -> T:
    """Put every leaf of ``data`` on one device (the first visible device by default).

    Args:
        data: Arrays or array-likes in any pytree (0.1.22's name for it).
        device: The target device, e.g. ``jax.devices()[1]``.

    Returns:
        The same structure with each leaf committed to ``device``.

    Raises:
        TypeError: ``device`` is not a jax device (a device id, a platform name).
        BatchDtypeError: A 64-bit NumPy leaf (int64, uint64, float64) holds values the 32-bit
            type jax gives it cannot, while ``jax_enable_x64`` is off.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from substrax.devices import place_on_device
        >>> tree = place_on_device({"w": jnp.ones(2)}, jax.devices()[0])
        >>> tree["w"].devices() == {jax.devices()[0]}
        True
    """
    import jax  # noqa: PLC0415  (see visible_devices)
    import numpy as np  # noqa: PLC0415
    from jax.sharding import SingleDeviceSharding  # noqa: PLC0415

    if device is not None and not isinstance(cast("object", device), DeviceLike):
        raise TypeError(
            f"device={device!r:.80} ({type(device).__name__}) is not a jax device; pass one "
            "from jax.devices() (jax.devices()[i], not i), or None for the first"
        )
    from ._narrowing import check_fits_32_bits  # noqa: PLC0415  (it imports numpy)

    for key_path, leaf in jax.tree_util.tree_flatten_with_path(data)[0]:
        if isinstance(leaf, np.ndarray | np.generic):
            check_fits_32_bits(jax.tree_util.keystr(key_path), leaf)
    target = visible_devices()[0] if device is None else device
    return jax.device_put(data, SingleDeviceSharding(cast("Any", target)))
