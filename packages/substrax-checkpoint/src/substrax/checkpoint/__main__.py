"""``python -m substrax.checkpoint``: this module's path is an interface; it runs the CLI quietly.

The process's own settings, which ``main`` called in-process leaves alone, are made here: jax
reads on the CPU whatever ``JAX_PLATFORMS`` says (no accelerator is started beside a training
job, and a platform the machine lacks fails no step), orbax's notices and the per-folder
warnings of folders named like steps are hidden (``main`` sums the latter up in one line), and
a path the terminal's encoding cannot show is escaped rather than failing the command.
"""

import logging
import sys

import jax

from substrax.support import escape_unshowable_output

from ._cli import main
from ._logging import quiet_orbax_notices
from ._steps import NOT_A_STEP


def _keep(record: logging.LogRecord) -> bool:
    """Every record but the per-folder warnings that ``main`` sums up in one line."""
    return not hasattr(record, NOT_A_STEP)


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")  # before any backend starts
    quiet_orbax_notices()
    logging.getLogger("substrax.checkpoint._steps").addFilter(_keep)
    escape_unshowable_output()
    sys.exit(main())
