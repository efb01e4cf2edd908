"""``python -m substrax.compute``: the ``substrax-compute`` command (``--help`` says how).

This module's path is an interface: ``python -m substrax.compute`` runs it.
"""

import sys

from ._cli import main


if __name__ == "__main__":
    sys.exit(main())
