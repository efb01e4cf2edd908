# The public names of substrax.typing, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._aliases import (
    Checkpointable as Checkpointable,
    CheckpointState as CheckpointState,
    JsonValue as JsonValue,
    PyTree as PyTree,
)
