"""The errors of ``substrax.mesh``."""

from __future__ import annotations

from collections.abc import Sequence

from substrax.support import PicklableError


class MeshShapeError(PicklableError, ValueError):
    """A mesh shape that the visible devices cannot hold, or that is malformed.

    Attributes:
        mesh_shape: The requested shape, as a dict from axis name to size.
        device_count: How many devices were available to build it (-1 when not looked at).

    Example:
        >>> from substrax.mesh import MeshShapeError
        >>> error = MeshShapeError("needs 8 devices", mesh_shape={"data": 8}, device_count=4)
        >>> error.mesh_shape, error.device_count
        ({'data': 8}, 4)
    """

    __module__ = "substrax.mesh"

    def __init__(self, message: str, *, mesh_shape: dict[str, int], device_count: int) -> None:
        super().__init__(message)
        self.mesh_shape = mesh_shape
        self.device_count = device_count


class UnknownLogicalAxisError(PicklableError, KeyError):
    """A logical axis name that the rules do not map.

    Attributes:
        name: The unknown logical name.
        known: The names the rules do map.

    Example:
        >>> from substrax.mesh import UnknownLogicalAxisError
        >>> print(UnknownLogicalAxisError("mlp", ["batch"]))
        logical axis 'mlp' is not in the rules (they map ['batch']); add it to the rules, mapped to a mesh axis or to None for replicated
    """

    __module__ = "substrax.mesh"

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(
            f"logical axis {name!r} is not in the rules (they map {list(self.known)}); "
            "add it to the rules, mapped to a mesh axis or to None for replicated"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class ShardingAnnotationError(PicklableError, ValueError):
    """A variable whose annotation cannot become a sharding on this mesh.

    Attributes:
        path: The variable's path in the state, e.g. ``"layers/0/kernel"``.
        annotation: The variable's ``out_sharding`` metadata.

    Example:
        >>> from substrax.mesh import ShardingAnnotationError
        >>> error = ShardingAnnotationError("no axis", path="layers/0/kernel", annotation=("x",))
        >>> error.path, error.annotation
        ('layers/0/kernel', ('x',))
    """

    __module__ = "substrax.mesh"

    def __init__(self, message: str, *, path: str, annotation: object) -> None:
        super().__init__(message)
        self.path = path
        self.annotation = annotation


class UnknownStrategyError(PicklableError, KeyError):
    """Sharding specs proposed by strategies a ``MultiDimensionalStrategy`` does not hold.

    Attributes:
        tensor_name: The tensor the specs were proposed for.
        unknown: The strategy names it does not hold.
        known: The strategy names it holds, in priority order.

    Example:
        >>> from substrax.mesh import UnknownStrategyError
        >>> print(UnknownStrategyError("w", unknown=["tp"], known=["fsdp"]))
        specs proposed for 'w' by unknown strategies ['tp']; known: ['fsdp']
    """

    __module__ = "substrax.mesh"

    def __init__(self, tensor_name: str, *, unknown: Sequence[str], known: Sequence[str]) -> None:
        self.tensor_name = tensor_name
        self.unknown = tuple(unknown)
        self.known = tuple(known)
        super().__init__(
            f"specs proposed for {tensor_name!r} by unknown strategies {list(self.unknown)}; "
            f"known: {list(self.known)}"
        )

    def __str__(self) -> str:
        return str(self.args[0])
