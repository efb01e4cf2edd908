"""The errors of ``substrax.mesh``."""

from collections.abc import Sequence

from substrax.support import StructuredError


class _MeshError(StructuredError, public_module="substrax.mesh"):
    """The base of every error here: each shows as ``substrax.mesh``'s, where users import it."""


class MeshShapeError(_MeshError, ValueError):
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

    message: str
    mesh_shape: dict[str, int]
    device_count: int


class UnknownLogicalAxisError(_MeshError, KeyError):
    """A logical axis name that the rules do not map.

    Attributes:
        name: The unknown logical name.
        known: The names the rules do map.

    Example:
        >>> from substrax.mesh import UnknownLogicalAxisError
        >>> print(UnknownLogicalAxisError("mlp", ["batch"]))
        logical axis 'mlp' is not in the rules (they map ['batch']); add it to the rules, mapped to a mesh axis or to None for replicated
    """

    name: str
    known: Sequence[str]

    def _message(self) -> str:
        return (
            f"logical axis {self.name!r} is not in the rules (they map {list(self.known)}); "
            "add it to the rules, mapped to a mesh axis or to None for replicated"
        )


class ShardingAnnotationError(_MeshError, ValueError):
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

    message: str
    path: str
    annotation: object


class UnknownStrategyError(_MeshError, KeyError):
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

    tensor_name: str
    unknown: Sequence[str]
    known: Sequence[str]

    def _message(self) -> str:
        return (
            f"specs proposed for {self.tensor_name!r} by unknown strategies "
            f"{list(self.unknown)}; known: {list(self.known)}"
        )
