"""The SkyPilot backend, at the import path 0.1.22 gave it.

This module's path is an interface: ``substrax.compute.skypilot_backend`` is where 0.1.22 users, docs and
entry-point registrations import the SkyPilot backend from. It holds no logic; ``SkyPilotBackend`` is also
in :mod:`substrax.compute`, and the implementation lives in ``substrax.compute._skypilot_backend``.

Example:
    >>> from substrax.compute.skypilot_backend import SkyPilotBackend
    >>> SkyPilotBackend.name
    'skypilot'
"""

from ._skypilot_backend import SkyPilotBackend, SkyPilotSettings


__all__ = ["SkyPilotBackend", "SkyPilotSettings"]
