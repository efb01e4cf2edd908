"""The plugin's markers: validation at collection, skip reasons at setup."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from substrax.support import check_int


if TYPE_CHECKING:
    from substrax.devices import DeviceKind

MARKERS = (
    "x64: run the test body with 64-bit types (jax.enable_x64, thread-local; global config "
    "is untouched)",
    "devices(count, kind=None): skip unless at least `count` devices (of `kind`: cpu, gpu, "
    "tpu, metal) are visible",
    "accelerator(kind=None): skip unless the default backend is an accelerator (of `kind`)",
)


@dataclass(frozen=True, slots=True)
class DeviceRequirement:
    """What a ``devices`` or ``accelerator`` marker asks for."""

    count: int | None  # None for an accelerator marker
    kind: "DeviceKind | None"


def _shown(marker: pytest.Mark) -> str:
    parts = [repr(arg) for arg in marker.args]
    parts += [f"{key}={value!r}" for key, value in marker.kwargs.items()]
    return f"@pytest.mark.{marker.name}({', '.join(parts)})"


def _signature(marker: pytest.Mark) -> str:
    """How the marker is used, from its line in ``MARKERS``: ``@pytest.mark.devices(count, ...)``."""
    for line in MARKERS:
        usage = line.partition(":")[0]
        if usage.partition("(")[0] == marker.name:
            return f"@pytest.mark.{usage}"
    return f"@pytest.mark.{marker.name}"


def _usage(nodeid: str, marker: pytest.Mark, problem: str) -> pytest.UsageError:
    return pytest.UsageError(f"{nodeid}: {_shown(marker)} {problem}")


def _arguments(
    nodeid: str, marker: pytest.Mark, names: Sequence[str], required: int
) -> dict[str, object]:
    """Bind a marker's arguments to ``names`` as a call would, refusing anything else."""
    use = f"use {_signature(marker)}"
    if len(marker.args) > len(names):
        takes = f"at most {len(names)} argument(s) ({', '.join(names)})" if names else "none"
        got = len(marker.args)
        raise _usage(nodeid, marker, f"got {got} positional argument(s) but takes {takes}; {use}")
    bound = dict(zip(names, marker.args, strict=False))
    for key, value in marker.kwargs.items():
        if key not in names:
            raise _usage(nodeid, marker, f"got an unknown argument {key!r}; {use}")
        if key in bound:
            raise _usage(nodeid, marker, f"got {key!r} twice; {use}")
        bound[key] = value
    missing = [name for name in names[:required] if name not in bound]
    if missing:
        raise _usage(nodeid, marker, f"is missing {', '.join(missing)}; {use}")
    return bound


def _kind(nodeid: str, marker: pytest.Mark, value: object) -> "DeviceKind | None":
    from substrax.devices import DeviceKind  # noqa: PLC0415 - only when a marker names a kind

    if value is None or isinstance(value, DeviceKind):
        return value
    known = ", ".join(repr(kind.value) for kind in DeviceKind if kind is not DeviceKind.OTHER)
    if isinstance(value, str):
        kind = DeviceKind.from_platform(value)
        if kind is not DeviceKind.OTHER:
            return kind
    raise _usage(nodeid, marker, f"names an unknown device kind {value!r}; use one of {known}")


def parse_marker(nodeid: str, marker: pytest.Mark) -> DeviceRequirement | None:
    """Validate one of the plugin's markers.

    Returns:
        The device requirement of a ``devices``/``accelerator`` marker, ``None`` for ``x64``.

    Raises:
        pytest.UsageError: The marker is malformed.
    """
    if marker.name == "x64":
        _arguments(nodeid, marker, (), 0)
        return None
    from substrax.devices import DeviceKind  # noqa: PLC0415 - not for x64 alone

    if marker.name == "accelerator":
        kind = _kind(nodeid, marker, _arguments(nodeid, marker, ("kind",), 0).get("kind"))
        if kind is DeviceKind.CPU:
            raise _usage(nodeid, marker, "names cpu, which is not an accelerator")
        return DeviceRequirement(count=None, kind=kind)
    bound = _arguments(nodeid, marker, ("count", "kind"), 1)
    try:
        count = check_int("count", bound["count"], minimum=1)
    except (TypeError, ValueError) as error:
        raise _usage(nodeid, marker, f"needs a device count: {error}") from None
    return DeviceRequirement(count=count, kind=_kind(nodeid, marker, bound.get("kind")))


def _visible(devices: Sequence[object]) -> str:
    counts = Counter(str(getattr(device, "platform", "?")) for device in devices)
    return ", ".join(f"{count} {platform}" for platform, count in counts.items()) or "none"


def skip_reason(requirement: DeviceRequirement) -> str | None:
    """Say why this process cannot run a test needing ``requirement``, or ``None`` if it can."""
    import jax  # noqa: PLC0415 - only for tests that carry a device marker

    from substrax.devices import DeviceKind  # noqa: PLC0415

    kind = requirement.kind
    if requirement.count is None:
        backend = jax.default_backend()
        backend_kind = DeviceKind.from_platform(backend)
        if backend_kind is DeviceKind.CPU:
            needs = f"a {kind.value} accelerator" if kind is not None else "an accelerator"
            return f"needs {needs}; default backend: {backend}"
        if kind is not None and backend_kind is not kind:
            return f"needs a {kind.value} accelerator; default backend: {backend}"
        return None
    default = list(jax.devices())
    candidates = default
    if kind is not None and all(DeviceKind.from_platform(d.platform) is not kind for d in default):
        try:
            candidates = list(jax.devices(kind.value))
        except RuntimeError:  # that backend is not available in this process
            candidates = []
    found = [d for d in candidates if kind is None or DeviceKind.from_platform(d.platform) is kind]
    if len(found) >= requirement.count:
        return None
    what = f"{kind.value} device(s)" if kind is not None else "device(s)"
    return f"needs {requirement.count} {what}; visible: {_visible(default)}"
