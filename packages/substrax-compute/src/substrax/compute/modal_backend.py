"""The Modal backend, at the import path 0.1.22 gave it.

This module's path is an interface: ``substrax.compute.modal_backend`` is where 0.1.22 users, docs and
entry-point registrations import the Modal backend from. It holds no logic; ``ModalBackend`` is also
in :mod:`substrax.compute`, and the implementation lives in ``substrax.compute._modal_backend``.

Example:
    >>> from substrax.compute.modal_backend import ModalBackend
    >>> ModalBackend.name
    'modal'
"""

from ._modal_backend import ModalBackend, ModalSettings


__all__ = ["ModalBackend", "ModalSettings"]
