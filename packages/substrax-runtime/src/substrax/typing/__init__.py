"""substrax.typing: the shared type aliases and protocols. Imports no jax.

Example:
    >>> from substrax.typing import JsonValue
    >>> value: JsonValue = {"loss": [0.5, 0.25], "done": True}
    >>> value["done"]
    True
"""

from ._aliases import (
    Checkpointable as Checkpointable,
    CheckpointState as CheckpointState,
    JsonValue as JsonValue,
    PyTree as PyTree,
)


__all__ = ["CheckpointState", "Checkpointable", "JsonValue", "PyTree"]
