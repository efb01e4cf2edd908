"""The ``substrax-compute`` console script.

This module's path is an interface: the console script is registered as
``substrax.compute.cli:main``, and ``python -m substrax.compute.cli`` runs the same command. The
command's logic lives in ``substrax.compute._cli``.

Example::

    uv run substrax-compute run demo                 # submit, follow, fetch
    uv run substrax-compute status --json
"""

import sys

from ._cli import main


__all__ = ["main"]


if __name__ == "__main__":
    sys.exit(main())
