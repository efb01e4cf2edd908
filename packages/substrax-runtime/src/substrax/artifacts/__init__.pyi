# The public names of substrax.artifacts, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._output_dir import (
    OUTPUT_DIR_ENV as OUTPUT_DIR_ENV,
    OutputLocation as OutputLocation,
    OutputSource as OutputSource,
    resolve_output_dir as resolve_output_dir,
)
