"""What a name in a scanned file stands for: its imports, read scope by scope.

A scan sets :data:`IMPORTED` to the names of the scope it reads, and :func:`dotted` reads a node
through them: ``_os.environ`` is ``"os.environ"`` after ``import os as _os``. A name a scope binds
otherwise (a parameter, an assignment, a ``def``) and does not import is that scope's own, and
a name nothing binds stands for itself; a function or class body starts from what the function around
it sees (a class body's names are not seen by the methods in it). Standard library only.
"""

import ast
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import NamedTuple


type Meanings = Mapping[str, str | None]
"""Local name to what it names (``{"_os": "os"}``); None for a name the scope binds itself."""

CONVENTIONAL: Meanings = {
    **{name: f"os.{name}" for name in ("environ", "environb", "putenv", "unsetenv")},
    **{name: f"logging.{name}" for name in ("basicConfig", "getLogger")},
    **{name: f"logging.config.{name}" for name in ("dictConfig", "fileConfig")},
    "TYPE_CHECKING": "typing.TYPE_CHECKING",
}
"""What a bare name is taken to be in a node read outside a scan, or after ``from os import *``."""

IMPORTED: ContextVar[Meanings] = ContextVar("IMPORTED", default=CONVENTIONAL)
"""The names of the scope a scan is reading (:data:`CONVENTIONAL` outside a scan)."""


class Names(NamedTuple):
    """What each name means in one scope, and in a function or class defined in it."""

    here: Meanings
    inner: Meanings  # a class body's own names are not seen by the definitions in it


_IMPORT_CALLS = frozenset({"importlib.import_module", "__import__", "builtins.__import__"})
_GUARDS: frozenset[str | None] = frozenset(
    {"typing.TYPE_CHECKING", "typing_extensions.TYPE_CHECKING"}
)


def dotted(node: ast.AST) -> str | None:
    """``"os.environ"`` for ``os.environ`` or ``_os.environ`` after ``import os as _os``.

    The first name is read through :data:`IMPORTED`; an assignment expression is its value
    (``(e := os.environ)``), and an import by a call its module (``__import__("os")``,
    ``importlib.import_module("os")``, a string literal). None for a name the scope binds
    itself, and for anything else.
    """
    if isinstance(node, ast.Name):
        return IMPORTED.get().get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        owner = dotted(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    if isinstance(node, ast.NamedExpr):
        return dotted(node.value)
    if isinstance(node, ast.Call) and node.args and (called := dotted(node.func)) in _IMPORT_CALLS:
        module = node.args[0]
        if isinstance(module, ast.Constant) and isinstance(module.value, str) and module.value:
            # ``__import__`` gives the top package of the module named, as ``import`` binds it
            return (
                module.value if called == "importlib.import_module" else module.value.split(".")[0]
            )
    return None


def _imported(node: ast.Import | ast.ImportFrom) -> dict[str, str | None]:
    """The names an import binds, each to the module or object it names."""
    if isinstance(node, ast.Import):
        names: dict[str, str | None] = {}
        for alias in node.names:
            if alias.asname is None:  # ``import logging.config`` binds ``logging``
                head = alias.name.partition(".")[0]
                names[head] = head
            else:
                names[alias.asname] = alias.name
        return names
    module = "." * node.level + (node.module or "")  # relative: never one of the modules checked
    if any(alias.name == "*" for alias in node.names):
        return {
            name: meaning
            for name, meaning in CONVENTIONAL.items()
            if meaning is not None and meaning.rpartition(".")[0] == module
        }
    return {alias.asname or alias.name: f"{module}.{alias.name}" for alias in node.names}


def _false_type_checking(node: ast.Assign) -> bool:
    """Whether ``node`` is ``TYPE_CHECKING = False``."""
    return (
        [getattr(target, "id", None) for target in node.targets] == ["TYPE_CHECKING"]
        and isinstance(node.value, ast.Constant)
        and node.value.value is False
    )


def _imported_by_assignment(node: ast.Assign) -> dict[str, str | None]:
    """``os = importlib.import_module("os")`` or ``os = __import__("os")``: an import by a call.

    ``import_module`` gives the module named, ``__import__`` the top package of it (as ``import``
    binds it); a name not a string literal is not read. ``TYPE_CHECKING = False``, the idiom
    that spares importing typing, stands for typing's (as an import of it would).
    """
    call, targets = node.value, node.targets
    if _false_type_checking(node):
        return {"TYPE_CHECKING": "typing.TYPE_CHECKING"}
    if not (isinstance(call, ast.Call) and len(targets) == 1 and isinstance(targets[0], ast.Name)):
        return {}
    function = call.func
    if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
        called = f"{function.value.id}.{function.attr}"
    else:
        called = function.id if isinstance(function, ast.Name) else ""
    if called not in ("importlib.import_module", "import_module", "__import__") or not call.args:
        return {}
    module = call.args[0]
    if not (isinstance(module, ast.Constant) and isinstance(module.value, str)):
        return {}
    name = module.value.partition(".")[0] if called == "__import__" else module.value
    return {targets[0].id: name}


def _parameters(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, around: Meanings
) -> dict[str, str | None]:
    """A function's parameters, each its own name or what its default names in ``around``.

    A default naming ``os`` or ``logging`` or a name in them (``environ=os.environ``, ``os=os``)
    gives its parameter that meaning.
    """
    arguments = node.args
    named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    named.extend(argument for argument in (arguments.vararg, arguments.kwarg) if argument)
    positional = [*arguments.posonlyargs, *arguments.args][::-1]
    defaults = [
        *zip(positional, arguments.defaults[::-1], strict=False),  # the last ones have defaults
        *zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True),
    ]
    token = IMPORTED.set(around)
    try:
        meant = {argument.arg: dotted(default) for argument, default in defaults if default}
    finally:
        IMPORTED.reset(token)
    parameters: dict[str, str | None] = dict.fromkeys(argument.arg for argument in named)
    for name, meaning in meant.items():
        if meaning is not None and meaning.split(".")[0] in ("os", "logging"):
            parameters[name] = meaning
    return parameters


def _own(body: list[ast.stmt]) -> tuple[dict[str, str | None], set[str]]:
    """The names statements import and the names they bind otherwise, in their own scope only.

    Nested function and class bodies are not read (only the name a ``def`` or ``class`` binds),
    nor a comprehension's loop variables; an augmented assignment (``environ |= ...``) changes
    the object a name holds and does not rebind it; ``global`` and ``nonlocal`` names are not
    the scope's own. ``TYPE_CHECKING`` is typing's only where every binding of it is typing's
    (an import, or ``= False``): one bound otherwise too (``= True``, from another module) is
    the scope's own, whichever comes last.
    """
    imported: dict[str, str | None] = {}
    bound: set[str] = set()
    declared: set[str] = set()
    checking: set[str | None] = set()  # what each import (``= False``) binds TYPE_CHECKING to
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            _take(_imported(node), imported, checking)
            continue
        if isinstance(node, ast.Assign) and (by_call := _imported_by_assignment(node)):
            _take(by_call, imported, checking)
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
            pending.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Global | ast.Nonlocal):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            pending.append(node.value)
        elif isinstance(node, ast.comprehension):
            pending.extend((node.iter, *node.ifs))
        else:
            pending.extend(ast.iter_child_nodes(node))
    _settle_type_checking(imported, bound, checking)
    return imported, bound - declared


def _settle_type_checking(
    imported: dict[str, str | None], bound: set[str], checking: set[str | None]
) -> None:
    """Make TYPE_CHECKING the scope's own where it is bound other than as typing's too.

    Which binding wins depends on their order, which the scan does not read.
    """
    if "TYPE_CHECKING" in bound or not checking <= _GUARDS:
        imported.pop("TYPE_CHECKING", None)
        bound.add("TYPE_CHECKING")


def _take(names: Meanings, imported: dict[str, str | None], checking: set[str | None]) -> None:
    """Add an import's ``names`` to ``imported``, and what it binds TYPE_CHECKING to (if it does)."""
    imported.update(names)
    if "TYPE_CHECKING" in names:
        checking.add(names["TYPE_CHECKING"])


def _meanings(start: Meanings, imported: Meanings, bound: set[str]) -> Meanings:
    # a name a scope both imports and binds otherwise keeps the import: the scan does not read
    # the order, and ``try: import os`` / ``except ImportError: os = None`` is still os
    return {**start, **dict.fromkeys(bound), **imported}


def module_names(tree: ast.Module) -> Names:
    """The names of a module's own scope: its imports, less the names it binds otherwise.

    A bare ``environ`` no import binds is not ``os.environ`` here, but a star import from a
    module in :data:`CONVENTIONAL` binds its names there.
    """
    here = _meanings({}, *_own(tree.body))
    return Names(here, here)


def inner_names(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef, outer: Names
) -> Names:
    """The names of the body of ``node``, defined in a scope with the names ``outer``."""
    if isinstance(node, ast.ClassDef):
        imported, bound = _own(node.body)
        return Names(_meanings(outer.inner, imported, bound), outer.inner)
    imported, bound = _own(node.body) if not isinstance(node, ast.Lambda) else ({}, set[str]())
    parameters = _parameters(node, outer.inner)
    here = {**_meanings(outer.inner, imported, bound | set(parameters)), **parameters}
    return Names(here, here)


def shadowed(outer: Names, targets: Iterable[ast.AST]) -> Names:
    """The names inside a comprehension in a scope with the names ``outer``.

    A comprehension is a scope of its own, as a function is (a class body's names are not seen
    in it); its loop variables, the names its ``targets`` bind, are its own.
    """
    bound = {
        node.id
        for target in targets
        for node in ast.walk(target)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }
    here = {**outer.inner, **dict.fromkeys(bound)}
    return Names(here, here)
