"""``python -m substrax.checkpoint``: this module's path is an interface; it runs the CLI quietly."""

import sys

from ._cli import main
from ._logging import quiet_orbax_notices


if __name__ == "__main__":
    quiet_orbax_notices()
    sys.exit(main())
