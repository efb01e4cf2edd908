"""Logical axis names mapped onto mesh axes, and the shardings they give."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import cast

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._errors import UnknownLogicalAxisError


type MeshAxes = str | tuple[str, ...] | None
"""Where one logical dimension goes: a mesh axis, several mesh axes, or nowhere (replicated)."""


_WANTED = "a mesh axis name (a non-empty str), a tuple of them, or None"
_PAIR = 2


def _check_axes(name: str, axes: object) -> MeshAxes:
    if axes is None:
        return axes
    if isinstance(axes, str):
        checked: tuple[str, ...] = (axes,)
    elif isinstance(axes, (tuple, list)) and all(isinstance(a, str) for a in axes):
        checked = tuple(axes)
    else:
        msg = f"logical axis {name!r} maps to {axes!r} ({type(axes).__name__}); use {_WANTED}"
        raise TypeError(msg)
    if not all(checked):
        msg = f"logical axis {name!r} maps to {axes!r}, an empty mesh axis name; use {_WANTED}"
        raise ValueError(msg)
    if len(set(checked)) != len(checked):  # one dimension cannot be split twice over one axis
        msg = (
            f"logical axis {name!r} maps to {axes!r}, which names a mesh axis twice; name each once"
        )
        raise ValueError(msg)
    return axes if isinstance(axes, str) else checked


def _check_pair(pair: object) -> tuple[str, object]:
    """One ``(logical name, mesh axes)`` rule, its name a non-empty str."""
    if not isinstance(pair, (tuple, list)) or len(pair) != _PAIR:
        msg = f"logical axis rules must be (name, mesh axes) pairs; got {pair!r} ({type(pair).__name__})"
        raise TypeError(msg)
    name, axes = cast("tuple[object, object]", tuple(pair))
    if not isinstance(name, str):
        msg = f"logical axis name {name!r} ({type(name).__name__}) must be a non-empty str"
        raise TypeError(msg)
    if not name:
        msg = "logical axis name '' must be a non-empty str"
        raise ValueError(msg)
    return name, axes


class LogicalAxisRules(Mapping[str, MeshAxes]):
    """An open, read-only mapping from logical axis names to mesh axes.

    The same information as flax's ``LogicalRules`` (a sequence of ``(logical, mesh)`` pairs),
    which :meth:`to_flax` returns; built from a mapping or from such pairs.

    Example:
        >>> from substrax.mesh import LogicalAxisRules
        >>> rules = LogicalAxisRules({"batch": "data", "embed": None, "mlp": "model"})
        >>> rules("batch", "mlp")
        ('data', 'model')
        >>> rules.spec("embed", "mlp")
        P(None, 'model')
    """

    __slots__ = ("_rules",)

    def __init__(self, rules: Mapping[str, MeshAxes] | Sequence[tuple[str, MeshAxes]] = ()) -> None:
        given = cast("object", rules)
        if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
            msg = (
                f"rules={rules!r:.80} ({type(rules).__name__}) must be a mapping from logical "
                "axis names to mesh axes, or a sequence of (name, mesh axes) pairs"
            )
            raise TypeError(msg)
        pairs = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
        checked: dict[str, MeshAxes] = {}
        for name, axes in map(_check_pair, pairs):
            if name in checked:
                msg = f"logical axis {name!r} is mapped twice; give each name one mesh axis"
                raise ValueError(msg)
            checked[name] = _check_axes(name, axes)
        self._rules = MappingProxyType(checked)

    def __getitem__(self, name: str) -> MeshAxes:
        try:
            return self._rules[name]
        except KeyError:
            raise UnknownLogicalAxisError(name, list(self._rules)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"LogicalAxisRules({dict(self._rules)!r})"

    def __call__(self, *names: str | None) -> tuple[MeshAxes, ...]:
        """The mesh axes of each logical name (None stays None)."""
        return tuple(None if n is None else self[n] for n in names)

    def spec(self, *names: str | None) -> PartitionSpec:
        """The partition spec of a tensor whose dimensions have these logical names."""
        return PartitionSpec(*self(*names))

    def to_flax(self) -> tuple[tuple[str, MeshAxes], ...]:
        """The rules as flax ``LogicalRules`` pairs, e.g. for ``nnx.logical_axis_rules``."""
        return tuple(self._rules.items())


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshRules:
    """A fixed logical-to-mesh mapping for the four common dimensions.

    Attributes:
        data: Mesh axis of the batch dimension.
        embed: Mesh axis of embedding dimensions.
        mlp: Mesh axis of MLP hidden dimensions.
        heads: Mesh axis of attention-head dimensions.

    Raises:
        TypeError: A field is not a mesh axis name, a tuple of them, or None.
        ValueError: A field names an empty mesh axis (``""``).

    Example:
        >>> from substrax.mesh import MeshRules
        >>> rules = MeshRules(data="data", mlp="model")
        >>> rules("data", "embed", "mlp")
        ('data', None, 'model')
    """

    data: str | None = None
    embed: str | None = None
    mlp: str | None = None
    heads: str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):  # a list of axes is kept as a tuple, so that the rules hash
            object.__setattr__(self, f.name, _check_axes(f.name, getattr(self, f.name)))

    def __call__(self, *keys: str) -> tuple[str | None, ...]:
        """Look up the mesh axes of logical dimension names.

        Raises:
            UnknownLogicalAxisError: If a key is not one of the four fields.
        """
        return tuple(self.as_logical_rules()[k] for k in keys)  # pyright: ignore[reportReturnType]

    def as_logical_rules(self) -> LogicalAxisRules:
        """The same mapping as an open :class:`LogicalAxisRules`."""
        return LogicalAxisRules({f.name: getattr(self, f.name) for f in fields(self)})


type RulesLike = (
    MeshRules | LogicalAxisRules | Mapping[str, MeshAxes] | Sequence[tuple[str, MeshAxes]]
)


def as_logical_rules(rules: RulesLike) -> LogicalAxisRules:
    """Turn any accepted rules form into :class:`LogicalAxisRules`.

    Example:
        >>> from substrax.mesh import as_logical_rules
        >>> as_logical_rules([("batch", "data")])("batch")
        ('data',)
    """
    if isinstance(rules, LogicalAxisRules):
        return rules
    if isinstance(rules, MeshRules):
        return rules.as_logical_rules()
    return LogicalAxisRules(rules)


def data_parallel_rules(data_axis: str = "data") -> MeshRules:
    """Rules that split only the batch dimension, over ``data_axis``.

    Example:
        >>> from substrax.mesh import data_parallel_rules
        >>> data_parallel_rules()
        MeshRules(data='data', embed=None, mlp=None, heads=None)
    """
    return MeshRules(data=data_axis)


def fsdp_rules(data_axis: str = "data", model_axis: str = "model") -> MeshRules:
    """Rules that split the batch over ``data_axis`` and weight dimensions over ``model_axis``.

    Example:
        >>> from substrax.mesh import fsdp_rules
        >>> fsdp_rules()("data", "embed", "mlp", "heads")
        ('data', 'model', 'model', 'model')
    """
    return MeshRules(data=data_axis, embed=model_axis, mlp=model_axis, heads=model_axis)


def create_named_sharding(mesh: Mesh, *axis_names: MeshAxes) -> NamedSharding:
    """A ``NamedSharding`` over ``mesh``, one mesh axis (or None) per array dimension.

    With no names the sharding replicates.

    Raises:
        ValueError: If a name is not an axis of the mesh.

    Example:
        >>> from substrax.mesh import create_device_mesh, create_named_sharding
        >>> create_named_sharding(create_device_mesh({"data": 2}), "data").spec
        P('data',)
    """
    known = set(mesh.axis_names)
    for axes in axis_names:
        for axis in (axes,) if isinstance(axes, str) else (axes or ()):
            if axis not in known:
                msg = f"{axis!r} is not an axis of the mesh {dict(mesh.shape)}; use one of {sorted(known)}"
                raise ValueError(msg)
    return NamedSharding(mesh, PartitionSpec(*axis_names))


def partition_spec_for_names(rules: RulesLike, *logical_names: str | None) -> PartitionSpec:
    """Map logical dimension names through ``rules`` into a ``PartitionSpec``.

    Raises:
        UnknownLogicalAxisError: If a name is not in the rules.

    Example:
        >>> from substrax.mesh import fsdp_rules, partition_spec_for_names
        >>> partition_spec_for_names(fsdp_rules(), "data", "mlp")
        P('data', 'model')
    """
    return as_logical_rules(rules).spec(*logical_names)
