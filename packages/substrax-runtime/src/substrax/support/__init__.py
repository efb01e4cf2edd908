"""substrax.support: the building blocks every part shares, so each thing is done one way.

Atomic file writes, ``with`` for closeable objects, optional SDK imports that name their extra,
the command-line convention (exit codes, error lines, ``--json``, tables), validated numbers,
the min/max mode, errors declared by their fields that survive pickling and a package's names
loaded on first use. Imports no jax. Parts and plugins may rely on these names; they follow
substrax-runtime's version.

Example:
    >>> from substrax.support import Mode, check_int, format_table
    >>> check_int("max_to_keep", 3, minimum=1)
    3
    >>> Mode("min").better(0.1, 0.2)
    True
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_exports as lazy_exports


if TYPE_CHECKING:
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
        int_argument as int_argument,
        run_command as run_command,
    )
    from ._closeable import Closeable as Closeable
    from ._device_values import is_device_array as is_device_array
    from ._mode import Mode as Mode, check_mode as check_mode
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
    from ._pickling import PicklableError as PicklableError
    from ._structured import StructuredError as StructuredError
    from ._tables import format_table as format_table, print_table as print_table

# Each name loads its own module on first use (PEP 562): a part that only checks a number (the
# runtime, whose import stays under 5% of jax's) never pays for argparse, json or tempfile.
_LAZY = {
    "write_atomically": "_atomic",
    "EXIT_FAILED": "_cli",
    "EXIT_OK": "_cli",
    "EXIT_USAGE": "_cli",
    "CommandFailedError": "_cli",
    "UsageError": "_cli",
    "add_json_flag": "_cli",
    "emit": "_cli",
    "error_line": "_cli",
    "int_argument": "_cli",
    "run_command": "_cli",
    "Closeable": "_closeable",
    "is_device_array": "_device_values",
    "Mode": "_mode",
    "check_mode": "_mode",
    "check_float": "_numbers",
    "check_int": "_numbers",
    "check_seconds": "_numbers",
    "MissingExtraError": "_optional",
    "install_hint": "_optional",
    "optional": "_optional",
    "require": "_optional",
    "PicklableError": "_pickling",
    "StructuredError": "_structured",
    "format_table": "_tables",
    "print_table": "_tables",
}


__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Closeable",
    "CommandFailedError",
    "MissingExtraError",
    "Mode",
    "PicklableError",
    "StructuredError",
    "UsageError",
    "add_json_flag",
    "check_float",
    "check_int",
    "check_mode",
    "check_seconds",
    "emit",
    "error_line",
    "format_table",
    "install_hint",
    "int_argument",
    "is_device_array",
    "lazy_exports",
    "optional",
    "print_table",
    "require",
    "run_command",
    "write_atomically",
]

lazy_exports(__name__, _LAZY, __all__)
