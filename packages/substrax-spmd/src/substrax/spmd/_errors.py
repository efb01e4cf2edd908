"""The errors of ``substrax.spmd``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from substrax.support import PicklableError


if TYPE_CHECKING:
    from jax.sharding import PartitionSpec


class BatchPlacementError(PicklableError, ValueError):
    """A batch leaf that its sharding cannot split.

    Attributes:
        path: The leaf's key path, e.g. ``"['rows']['x']"``.
        shape: The leaf's shape.
        spec: The partition spec it was given.

    Example:
        >>> from jax.sharding import PartitionSpec
        >>> from substrax.spmd import BatchPlacementError
        >>> error = BatchPlacementError("7 rows", path="['x']", shape=(7,), spec=PartitionSpec("data"))
        >>> error.path, error.shape
        ("['x']", (7,))
    """

    __module__ = "substrax.spmd"

    def __init__(
        self, message: str, *, path: str, shape: tuple[int, ...], spec: PartitionSpec
    ) -> None:
        super().__init__(message)
        self.path = path
        self.shape = shape
        self.spec = spec


class UnknownReductionError(PicklableError, ValueError):
    """A reduction name that is not mean, sum, max or min, or a name without a metric.

    Attributes:
        name: The metric concerned.
        reduction: The reduction asked for.

    Example:
        >>> from substrax.spmd import UnknownReductionError
        >>> error = UnknownReductionError("no median", name="loss", reduction="median")
        >>> error.name, error.reduction
        ('loss', 'median')
    """

    __module__ = "substrax.spmd"

    def __init__(self, message: str, *, name: str, reduction: object) -> None:
        super().__init__(message)
        self.name = name
        self.reduction = reduction
