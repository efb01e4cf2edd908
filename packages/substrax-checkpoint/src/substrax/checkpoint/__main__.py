"""``python -m substrax.checkpoint``: inspect and maintain a store (see ``substrax.checkpoint._cli``).

This module's path is an interface: ``python -m substrax.checkpoint`` runs it. As the process's
entry point it opts into :func:`~substrax.checkpoint.quiet_orbax_notices`, then calls ``main()``.
"""

import sys

from ._cli import main
from ._logging import quiet_orbax_notices


if __name__ == "__main__":
    quiet_orbax_notices()
    sys.exit(main())
