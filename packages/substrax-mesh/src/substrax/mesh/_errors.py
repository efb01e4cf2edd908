"""The errors of ``substrax.mesh``."""

from collections.abc import Sequence

from substrax.support import StructuredError


class MeshShapeError(StructuredError, ValueError):
    """A mesh shape that the visible devices cannot hold, or that is malformed.

    Attributes:
        message: The error's text.
        mesh_shape: The requested shape, as a dict from axis name to size.
        device_count: How many devices were available to build it (-1 when not looked at).

    Example:
        >>> from substrax.mesh import MeshShapeError
        >>> error = MeshShapeError("needs 8 devices", mesh_shape={"data": 8}, device_count=4)
        >>> error.mesh_shape, error.device_count
        ({'data': 8}, 4)
    """

    __module__ = "substrax.mesh"

    message: str
    mesh_shape: dict[str, int]
    device_count: int


class UnknownLogicalAxisError(StructuredError, KeyError):
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

    name: str
    known: Sequence[str]

    def _message(self) -> str:
        return (
            f"logical axis {self.name!r} is not in the rules (they map {list(self.known)}); "
            "add it to the rules, mapped to a mesh axis or to None for replicated"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class ShardingAnnotationError(StructuredError, ValueError):
    """A variable whose annotation cannot become a sharding on this mesh.

    Attributes:
        message: The error's text.
        path: The variable's path in the state, e.g. ``"layers/0/kernel"``.
        annotation: The variable's ``out_sharding`` metadata.

    Example:
        >>> from substrax.mesh import ShardingAnnotationError
        >>> error = ShardingAnnotationError("no axis", path="layers/0/kernel", annotation=("x",))
        >>> error.path, error.annotation
        ('layers/0/kernel', ('x',))
    """

    __module__ = "substrax.mesh"

    message: str
    path: str
    annotation: object


class UnknownStrategyError(StructuredError, KeyError):
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

    tensor_name: str
    unknown: Sequence[str]
    known: Sequence[str]

    def _message(self) -> str:
        return (
            f"specs proposed for {self.tensor_name!r} by unknown strategies "
            f"{list(self.unknown)}; known: {list(self.known)}"
        )

    def __str__(self) -> str:
        return str(self.args[0])
