"""The local backend (this machine, a process per node), at the import path 0.1.22 gave it.

This module's path is an interface: ``substrax.compute.local`` is where 0.1.22 users, docs and
entry-point registrations import the local backend (this machine, a process per node) from. It holds no logic; ``LocalBackend`` is also
in :mod:`substrax.compute`, and the implementation lives in ``substrax.compute._local``.

Example:
    >>> from substrax.compute.local import LocalBackend
    >>> LocalBackend.name
    'local'
"""

from ._local import LocalBackend, LocalSettings


__all__ = ["LocalBackend", "LocalSettings"]
