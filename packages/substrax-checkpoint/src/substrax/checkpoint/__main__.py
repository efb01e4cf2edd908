"""``python -m substrax.checkpoint``: inspect and maintain a store (see ``substrax.checkpoint._cli``).

This module's path is an interface: ``python -m substrax.checkpoint`` runs it. It only calls
``main()``.
"""

import sys

from ._cli import main


if __name__ == "__main__":
    sys.exit(main())
