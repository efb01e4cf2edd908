"""Whether the objects a step was built from still hold the Variables it tracks.

A :class:`~substrax.spmd.TrainStep` reads and writes the Variable objects that its model and
optimizer held at construction. A Variable or submodule replaced since (``model.head =
nnx.Linear(...)``) is one the step never sees: these checks find that, and a Variable that a
step's program adds to its state (``sow`` without a pop), and name it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, MutableMapping, MutableSequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.nnx import graph

from ._errors import StateChangedError


_FIX = (
    "build a new TrainStep (and EvalStep) after replacing a Variable or submodule, or write "
    "into the existing Variables instead ({how}), which the step reads back"
)


def _key(entry: Any) -> Any:  # noqa: ANN401  (a graph key or a jax key-path entry)
    for name in ("key", "idx", "name"):
        if hasattr(entry, name):
            return getattr(entry, name)
    return entry


def describe(path: tuple[Any, ...], *, attributes: tuple[bool, ...] | None = None) -> str:
    """``model.down.kernel`` for the path ``(0, 'down', 'kernel')`` into ``(model, optimizer)``.

    A str key is an attribute (``.key``) unless ``attributes`` says it is an item; an int key
    is an index (``[0]``).

    Example:
        >>> from substrax.spmd._live_graph import describe
        >>> describe((1, "opt_state", 0, "mu", "kernel"))
        'optimizer.opt_state[0].mu.kernel'
    """
    keys = [_key(entry) for entry in path]
    out = ("model", "optimizer")[int(keys[0])] if keys else "(model, optimizer)"
    for i, key in enumerate(keys[1:], start=1):
        attribute = attributes[i] if attributes is not None else isinstance(key, str)
        out += f".{key}" if attribute and isinstance(key, str) else f"[{key!r}]"
    return out


def _child(parent: Any, key: Any) -> Any:  # noqa: ANN401  (any node of an nnx graph)
    if isinstance(parent, (Mapping, MutableSequence)) or (
        isinstance(parent, tuple) and isinstance(key, int)
    ):
        try:
            return parent[key]  # pyright: ignore[reportUnknownVariableType]
        except (KeyError, IndexError, TypeError):
            return None
    return getattr(parent, key, None)


class LiveGraph:
    """The links from ``(model, optimizer)`` down to the Variables a step tracks.

    Only the links a user can rebind are kept: an attribute of a module or other nnx object
    and an item of a mutable dict or list (tuples and optax's named tuples cannot change in
    place; their owner's link to them is kept), and each module's plain data, traced into the
    program (a flag ``model.eval()`` sets, a list, the optimizer's ``tx``; a mutable container is
    compared with a copy). :meth:`check` costs one dict lookup a link
    and a plain attribute, and one ``len`` a module; when a module gained an attribute (or a
    dict or list an item) it walks the whole graph (:meth:`check_full`) for a Variable added,
    once. Not seen per call: a Variable put in place of an attribute that held no Variable
    (:meth:`check_full` sees it).

    Args:
        roots: The model and optimizer objects.
        tracked: The Variables the step reads and writes (each holding an array).
    """

    def __init__(self, roots: tuple[Any, Any], tracked: list[nnx.Variable[Any]]) -> None:
        self._roots = roots
        self._tracked = {id(v) for v in tracked}
        nodes = dict(graph.iter_graph(roots))
        self._names = {path: _name(path, nodes) for path in nodes}
        self._variable_paths = {p for p, n in nodes.items() if isinstance(n, nnx.Variable)}
        links: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}
        for path, node in nodes.items():
            if id(node) not in self._tracked:
                continue
            for end in range(1, len(path) + 1):
                parent = roots if end == 1 else nodes[path[: end - 1]]
                if end > 1 and (graph.is_graph_node(parent) or _mutable(parent)):
                    links[path[:end]] = (parent, path[end - 1], nodes[path[:end]])
        self._measure()
        self._statics = [  # each module's plain data, traced into the program as it was
            (node, vars(node), key, value, _snapshot(value), (*path, key))
            for path, node in nodes.items()
            if isinstance(node, nnx.Pytree)
            for key, value in vars(node).items()
            if not key.startswith(_INTERNAL) and _plain(value)
        ]
        self._modules = [node for node in nodes.values() if isinstance(node, nnx.Pytree)]
        self._module_paths = {id(node): path for path, node in nodes.items()}
        self._links = [
            (*_slot(parent, key), child, path) for path, (parent, key, child) in links.items()
        ]

    def check(self, *, statics: bool = False) -> None:
        """Refuse if a link to a tracked Variable or its owner no longer holds what it held.

        ``statics`` (a call, which runs the traced program): refuse a plain attribute changed
        too, or set on a module over its class's value.

        Raises:
            StateChangedError: Naming the first path rebound (``model.down.kernel``).
        """
        for holder, key, child, path in self._links:
            held = holder.get(key) if isinstance(holder, dict) else _child(holder, key)
            if held is not child:
                self._refuse(path, "was replaced after the step was built")
        resized = any(len(attributes) != size for attributes, size in self._sizes)
        if resized:
            self.check_full()  # an attribute added somewhere: a Variable, or something else
        if not statics:
            return
        for node, attributes, key, value, kept, path in self._statics:
            held = attributes.get(key, getattr(type(node), key, None))
            if (held is not value or kept is not value) and not _equal(held, kept):
                self._refuse_static(path, f"changed from {kept!r:.60} to {held!r:.60}")
        for node, key in self._shadowing() if resized else ():
            path = (*self._module_paths[id(node)], key)
            self._refuse_static(path, "was set on the module over its class's value")

    def _shadowing(self) -> list[tuple[Any, str]]:
        """Plain attributes set on a module since, over a value its class holds (traced)."""
        known = {(id(node), key) for node, _, key, *_ in self._statics}
        return [
            (node, key)
            for node in self._modules
            for key, value in vars(node).items()
            if (id(node), key) not in known
            and not key.startswith(_INTERNAL)
            and hasattr(type(node), key)
            and _plain(value)
        ]

    def _refuse_static(self, path: tuple[Any, ...], what: str) -> None:
        where = f"{self._names.get(path[:-1]) or describe(path[:-1])}.{path[-1]}"
        msg = (
            f"{where} {what} after the step was built (model.eval() and model.train() set such "
            "flags): the step's program was traced with the old value and would go on running "
            "with it; set it back (model.train() undoes model.eval()), or build a new TrainStep "
            "(and EvalStep) after changing it"
        )
        raise StateChangedError(msg, path=where)

    def _measure(self) -> None:
        nodes = (node for _, node in graph.iter_graph(self._roots))
        held = [vars(n) if isinstance(n, nnx.Pytree) else n for n in nodes if _holds(n)]
        self._sizes = [(items, len(items)) for items in held]

    def check_full(self) -> None:
        """Refuse a Variable holding an array that the step does not track (a graph walk).

        Raises:
            StateChangedError: Naming the first Variable added.
        """
        for path, node in graph.iter_graph(self._roots):
            if (
                isinstance(node, nnx.Variable)
                and id(node) not in self._tracked
                and jax.tree.leaves(node)
            ):
                self._refuse(path, "was added after the step was built")
        self._measure()

    def _refuse(self, path: tuple[Any, ...], what: str) -> None:
        where = self._names.get(path) or describe(path)
        how = (
            f"`{where}.set_value(new_array)`"
            if path in self._variable_paths
            else f"`nnx.update({where}, nnx.state(new_one))`"
        )
        msg = (
            f"{where} {what}: the step only reads and writes the Variables the model and "
            "optimizer held when it was built, so it would go on training (and writing back) "
            f"the old ones; {_FIX.format(how=how)}"
        )
        raise StateChangedError(msg, path=where)


def _name(path: tuple[Any, ...], nodes: dict[tuple[Any, ...], Any]) -> str:
    """``path`` described, its keys into modules and named tuples as attributes."""
    flags = [False] + [
        not isinstance(nodes.get(path[:end]), (Mapping, MutableSequence))
        and not (isinstance(nodes.get(path[:end]), tuple) and isinstance(path[end], int))
        for end in range(1, len(path))
    ]
    return describe(path, attributes=tuple(flags))


def _slot(parent: Any, key: Any) -> tuple[Any, Any]:  # noqa: ANN401  (any node)
    """Where ``parent`` keeps its child at ``key``: an nnx object's ``__dict__``, else itself.

    One dict lookup a check, where ``getattr`` or an ``nnx.List`` index costs several.
    """
    if isinstance(parent, nnx.Pytree):
        attributes = vars(parent)
        return attributes, key if key in attributes else str(key)
    return parent, key


_INTERNAL = ("_pytree__", "_object__")  # nnx's own bookkeeping in a module's attributes


def _plain(value: object) -> bool:
    """Whether ``value`` is plain data: it holds no module, Variable or array (a flag, a list)."""
    if isinstance(value, nnx.Pytree | nnx.Variable):
        return False
    try:
        leaves = jax.tree.leaves(value, is_leaf=lambda x: isinstance(x, nnx.Pytree | nnx.Variable))
    except Exception:  # not a pytree jax can walk: one value
        return True
    return not any(
        isinstance(x, nnx.Pytree | nnx.Variable | jax.Array | np.ndarray) for x in leaves
    )


def _snapshot(value: object) -> object:
    """A copy of a mutable container (a change in place shows against it), else ``value``."""
    if not isinstance(value, list | dict | set):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # an item that cannot be copied: changes in place go unseen
        return value


def _equal(held: object, value: object) -> bool:
    """Whether a plain attribute holds a value equal to ``value`` (NaN equals NaN; 1 equals 1.0)."""
    if (
        isinstance(held, float)
        and isinstance(value, float)
        and math.isnan(held)
        and math.isnan(value)
    ):
        return True
    try:
        return bool(held == value)
    except Exception:  # an elementwise ==
        return False


def _holds(node: object) -> bool:
    return isinstance(node, nnx.Pytree) or _mutable(node)


def _mutable(node: object) -> bool:
    # an nnx.State wraps each dict it hands out anew: its owner's link to it is what is kept
    return isinstance(node, (MutableMapping, MutableSequence)) and not isinstance(node, nnx.State)


def variable_layout(state: Any) -> dict[tuple[Any, ...], int]:  # noqa: ANN401  (an nnx.State)
    """Each Variable's key path in ``state`` (its plain keys) and how many array leaves it holds."""
    items = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]
    layout: dict[tuple[Any, ...], int] = {}
    for path, item in items:
        keys = tuple(_key(entry) for entry in path)
        layout[keys] = layout.get(keys, 0) + len(jax.tree.leaves(item))
    return layout


def check_layout_kept(
    before: dict[tuple[Any, ...], int],
    after: Any,  # noqa: ANN401  (an nnx.State)
    prefix: tuple[Any, ...] = (),
) -> None:
    """Refuse a state (``after``, with Variables) whose Variables differ from ``before``'s.

    ``prefix`` leads the paths to name them from ``(model, optimizer)``: ``(0,)`` for the
    model's own state.

    Raises:
        StateChangedError: Naming the first Variable that appeared or changed its leaves during
            the step (a ``sow`` whose ``nnx.Intermediate`` was not popped, most often).
    """
    for keys, count in variable_layout(after).items():
        if before.get(keys) != count:
            path = describe((*prefix, *keys))
            msg = (
                f"{path} appeared or grew while the step ran (an nnx.Intermediate that `sow` "
                "left in the model, most often): a step's state keeps its Variables, so pop "
                "intermediates inside loss_fn (`nnx.pop(model, nnx.Intermediate)`, returning "
                "them as aux if they are wanted) and do not add Variables in loss_fn"
            )
            raise StateChangedError(msg, path=path)
