# The public names of substrax.nnx_typing, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._aliases import (
    KeyPath as KeyPath,
    NnxState as NnxState,
    PathEntry as PathEntry,
    path_entry_key as path_entry_key,
)
