"""Type aliases and protocols shared across substrax (no jax)."""

from typing import Any, Protocol, runtime_checkable


PyTree = Any  # an assignment, not a `type` statement: `PyTree is Any`, as in 0.1.22
"""Any jax pytree: arrays, scalars and nested lists, tuples, dicts and registered nodes."""

type JsonValue = str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None
"""A JSON document, recursively (pydantic validates it, e.g. in ``read_record``)."""

type CheckpointState = dict[str, Any]
"""The state a ``Checkpointable`` hands to a checkpoint and takes back."""


@runtime_checkable
class Checkpointable(Protocol):
    """Anything whose state can be saved and restored (e.g. a data iterator).

    Example:
        >>> from substrax.typing import Checkpointable
        >>> class Counter:
        ...     def __init__(self) -> None:
        ...         self.n = 0
        ...     def get_state(self) -> dict[str, int]:
        ...         return {"n": self.n}
        ...     def set_state(self, state: dict[str, int], /) -> None:
        ...         self.n = state["n"]
        >>> isinstance(Counter(), Checkpointable)
        True
    """

    def get_state(self) -> CheckpointState:
        """Return the state to save."""
        ...

    def set_state(self, state: CheckpointState, /) -> None:
        """Restore a state returned by ``get_state``."""
        ...
