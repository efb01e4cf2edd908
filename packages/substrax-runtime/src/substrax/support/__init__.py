"""substrax.support: the building blocks every part shares, so each thing is done one way.

Atomic file writes, optional SDK imports that name their extra, the command-line convention
(exit codes, error lines, ``--json``, tables), validated numbers and the min/max mode. Imports
no jax. Parts and plugins may rely on these names; they follow substrax-runtime's version.

Example:
    >>> from substrax.support import Mode, check_int, format_table
    >>> check_int("max_to_keep", 3, minimum=1)
    3
    >>> Mode("min").better(0.1, 0.2)
    True
"""

from ._atomic import write_atomically as write_atomically
from ._cli import (
    EXIT_FAILED as EXIT_FAILED,
    EXIT_OK as EXIT_OK,
    EXIT_USAGE as EXIT_USAGE,
    CommandFailedError as CommandFailedError,
    UsageError as UsageError,
    add_json_flag as add_json_flag,
    emit as emit,
    error_line as error_line,
    run_command as run_command,
)
from ._mode import Mode as Mode
from ._numbers import (
    check_float as check_float,
    check_int as check_int,
    check_seconds as check_seconds,
)
from ._optional import (
    MissingExtraError as MissingExtraError,
    install_hint as install_hint,
    optional as optional,
    require as require,
)
from ._tables import format_table as format_table, print_table as print_table


__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CommandFailedError",
    "MissingExtraError",
    "Mode",
    "UsageError",
    "add_json_flag",
    "check_float",
    "check_int",
    "check_seconds",
    "emit",
    "error_line",
    "format_table",
    "install_hint",
    "optional",
    "print_table",
    "require",
    "run_command",
    "write_atomically",
]
