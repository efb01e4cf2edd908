# The public names of substrax.support, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._array_variables import check_array_variables as check_array_variables
from ._atomic import write_atomically as write_atomically
from ._cli import (
    EXIT_BROKEN_PIPE as EXIT_BROKEN_PIPE,
    EXIT_FAILED as EXIT_FAILED,
    EXIT_INTERRUPTED as EXIT_INTERRUPTED,
    EXIT_OK as EXIT_OK,
    EXIT_USAGE as EXIT_USAGE,
    CommandFailedError as CommandFailedError,
    UsageError as UsageError,
    add_json_flag as add_json_flag,
    describe_error as describe_error,
    emit as emit,
    error_line as error_line,
    escape_unshowable_output as escape_unshowable_output,
    int_argument as int_argument,
    run_command as run_command,
)
from ._closeable import Closeable as Closeable
from ._device_values import is_device_array as is_device_array
from ._env_values import env_values_agree as env_values_agree, reads_false as reads_false
from ._lazy import lazy_exports as lazy_exports
from ._mode import Mode as Mode, check_mode as check_mode
from ._moved import moved_modules as moved_modules
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
from ._types import check_type as check_type
