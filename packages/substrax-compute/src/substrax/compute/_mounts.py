"""MountSources: a backend setting that gives each job mount its source (Modal's volumes, SkyPilot's buckets)."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._errors import MountNotConfiguredError


if TYPE_CHECKING:
    from ._spec import Mount


@dataclass(frozen=True, slots=True)
class MountSources:
    """A backend setting that gives each job mount its source: Modal's volumes, SkyPilot's buckets.

    ``setting`` is its TOML path (``backends.modal.volumes``), ``what`` names a source and
    ``example`` shows one, for the error that names a missing one.

    Example:
        >>> from substrax.compute import Mount
        >>> from substrax.compute._mounts import MountSources
        >>> disks = MountSources("backends.b.disks", "disk", "<disk>")
        >>> disks.of([Mount(name="data", path="/data")], {})
        Traceback (most recent call last):
        ...
        substrax.compute.MountNotConfiguredError: mount 'data' has no disk: set backends.b.disks.data = "<disk>"
    """

    setting: str
    what: str
    example: str

    def of(
        self, mounts: Iterable["Mount"], sources: Mapping[str, str]
    ) -> list[tuple["Mount", str]]:
        """Each of ``mounts`` with its source in ``sources`` (the setting's table).

        Raises:
            MountNotConfiguredError: A mount without a source; the message names the setting.
        """
        found: list[tuple[Mount, str]] = []
        for mount in mounts:
            setting = f"{self.setting}.{mount.name}"
            if mount.name not in sources:
                message = (
                    f'mount {mount.name!r} has no {self.what}: set {setting} = "{self.example}"'
                )
                raise MountNotConfiguredError(mount.name, message, setting)
            found.append((mount, sources[mount.name]))
        return found
