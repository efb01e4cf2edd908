"""Static checks over Python sources: what a file runs at import time, and where a predicate holds.

A predicate takes one syntax node (``ast.AST``) and says whether it is what the check looks
for; :func:`writes_environment` and :func:`configures_logging` are the two a library most
needs, and ``lambda node: isinstance(node, ast.Call)`` finds every call. Standard library only.
"""

import ast
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from ._names import IMPORTED, Names, dotted, inner_names, module_names, shadowed
from ._source_files import SourceText, existing_file, parsed_python


type Predicate = Callable[[ast.AST], bool]
type _Pending = tuple[ast.AST, str, Names]
type _Comprehension = ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp

_ENVIRON = frozenset({"os.environ", "os.environb"})
_ENVIRON_METHODS = frozenset(
    {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
)
_ENVIRON_FUNCTIONS = frozenset({"os.putenv", "os.unsetenv"})
_TYPING = frozenset({"typing.TYPE_CHECKING", "typing_extensions.TYPE_CHECKING", "TYPE_CHECKING"})
_LOGGING_FUNCTIONS = frozenset(
    {
        "logging.basicConfig",
        "logging.config.dictConfig",
        "logging.config.fileConfig",
        "logging.config.listen",
        "logging.disable",
        "logging.captureWarnings",
        "logging.setLoggerClass",
        "logging.setLogRecordFactory",
    }
)
_LOGGER_METHODS = frozenset(
    {"addHandler", "removeHandler", "setLevel", "addFilter", "removeFilter"}
)
_HOLDERS = ("", "Logger.", "RootLogger.", "Logger.manager.", "RootLogger.manager.")
_ROOT_LOGGERS = frozenset(f"logging.{holder}root" for holder in _HOLDERS)  # logging's root
_LOGGER_ATTRIBUTES = frozenset({"handlers", "level", "filters", "propagate", "disabled"})
_LOGGER_LISTS = frozenset({"handlers", "filters"})
_LIST_METHODS = frozenset({"append", "extend", "insert", "remove", "pop", "clear", "__setitem__"})


def _is_environ(node: ast.AST) -> bool:
    return dotted(node) in _ENVIRON


def _is_root_logger(node: ast.AST) -> bool:
    node = node.value if isinstance(node, ast.NamedExpr) else node  # ``(r := getLogger())``
    if dotted(node) in _ROOT_LOGGERS:
        return True
    if not isinstance(node, ast.Call) or dotted(node.func) != "logging.getLogger":
        return False
    if any(keyword.arg != "name" for keyword in node.keywords):
        return False
    named = [*node.args, *(keyword.value for keyword in node.keywords)]
    if len(named) > 1:
        return False
    return not named or (
        isinstance(named[0], ast.Constant) and named[0].value in {None, "", "root"}
    )


def _is_root_list(node: ast.AST) -> bool:
    """Whether ``node`` is the root logger's ``handlers`` or ``filters`` list."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in _LOGGER_LISTS
        and _is_root_logger(node.value)
    )


def _calls(
    node: ast.AST,
    methods: Collection[str],
    receiver: Callable[[ast.AST], bool],
    functions: Collection[str],
) -> bool:
    """Whether ``node`` calls one of ``methods`` on a ``receiver``, or one of ``functions``."""
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Attribute) and node.func.attr in methods:
        return receiver(node.func.value)
    return dotted(node.func) in functions


def writes_environment(node: ast.AST) -> bool:
    r"""Whether ``node`` changes the process environment.

    Matches an assignment to or deletion of ``os.environ[...]``, ``os.environ |= {...}``,
    ``os.environ.update/setdefault/pop/popitem/clear(...)``, ``os.putenv`` and ``os.unsetenv``,
    and rebinding ``os.environ`` itself. Reading the environment is not a match. In a scan
    (:func:`import_time_lines`, :func:`matching_lines`) names are read through the file's
    imports, scope by scope, so ``import os as _os`` then ``_os.environ[...] = ...`` and ``from
    os import environ as env`` then ``env[...] = ...`` or ``env |= {...}`` match, while a name
    the scope binds otherwise and does not import (a parameter ``environ``, ``environ = {}``,
    ``def putenv``), or that nothing binds, is not ``os``'s. Outside a scan (one node read
    alone) a bare ``environ``, ``putenv`` or ``unsetenv`` is taken as the one in ``os``.
    ``(e := os.environ)[...]`` and ``__import__("os")`` or ``importlib.import_module("os")``
    (a string literal) are read too; not ``sys.modules["os"]``, or a variable holding it.

    Example:
        >>> import ast
        >>> from substrax.testing.source_scans import writes_environment
        >>> code = "os.environ['A'] = '1'\nos.environ.get('A')\nos.environ.setdefault('B', '2')"
        >>> [node.lineno for node in ast.walk(ast.parse(code)) if writes_environment(node)]
        [1, 3]
    """
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
        return _is_environ(node.value)
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
        return _is_environ(node)
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        return _is_environ(node.target)  # ``environ |= {...}`` updates it in place
    return _calls(node, _ENVIRON_METHODS, _is_environ, _ENVIRON_FUNCTIONS)


def configures_logging(node: ast.AST) -> bool:
    r"""Whether ``node`` configures logging for the whole process.

    Matches ``logging.basicConfig``, ``logging.config.dictConfig/fileConfig/listen``,
    ``logging.disable``, ``logging.captureWarnings``, ``logging.setLoggerClass``,
    ``logging.setLogRecordFactory``, and changing the root logger written out
    (``logging.getLogger()``, ``logging.getLogger("root")``, ``logging.root``, or
    ``logging.Logger.root`` or ``.manager.root``): its
    ``addHandler``, ``removeHandler``, ``setLevel``, ``addFilter``, ``removeFilter``,
    assigning or deleting its ``handlers``, ``level``, ``filters``, ``propagate`` or
    ``disabled``, or changing its ``handlers`` or ``filters`` list in place (``.clear()``,
    ``.append(...)``, ``[:] = []``, ...). In a scan names are read through the file's imports
    (``import logging as log``, ``import logging.config as lc``, ``from logging import
    getLogger``) as :func:`writes_environment` reads them; outside a scan a bare
    ``basicConfig``, ``dictConfig``, ``fileConfig`` or ``getLogger`` is taken as logging's.
    A library's own named logger is not a match, and neither is a root logger first stored in
    a variable (the check reads one node at a time).

    Example:
        >>> import ast
        >>> from substrax.testing.source_scans import configures_logging
        >>> code = (
        ...     "logging.getLogger('app').setLevel(10)\n"
        ...     "logging.getLogger().setLevel(10)\n"
        ...     "logging.basicConfig(level=10)"
        ... )
        >>> [node.lineno for node in ast.walk(ast.parse(code)) if configures_logging(node)]
        [2, 3]
    """
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
        return node.attr in _LOGGER_ATTRIBUTES and _is_root_logger(node.value)
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
        return _is_root_list(node.value)
    return _calls(node, _LOGGER_METHODS, _is_root_logger, _LOGGING_FUNCTIONS) or _calls(
        node, _LIST_METHODS, _is_root_list, ()
    )


def is_main_guard(node: ast.AST) -> bool:
    r"""Whether ``node`` is an ``if __name__ == "__main__":`` statement (either operand order).

    This form only; :func:`import_time_lines` also skips the others that cannot run on import.

    Example:
        >>> import ast
        >>> from substrax.testing.source_scans import is_main_guard
        >>> is_main_guard(ast.parse('if __name__ == "__main__":\n    main()').body[0])
        True
        >>> is_main_guard(ast.parse('if __name__ != "__main__":\n    main()').body[0])
        False
    """
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    return isinstance(node.test.ops[0], ast.Eq) and _compared(node.test) is False


def _qualified(scope: str, name: str) -> str:
    return f"{scope}.{name}" if scope else name


def _definition_time(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.AST]:
    """What a ``def`` or ``lambda`` evaluates where it stands: decorators and default values."""
    arguments = node.args
    evaluated: list[ast.AST] = [*arguments.defaults]
    evaluated.extend(default for default in arguments.kw_defaults if default is not None)
    if not isinstance(node, ast.Lambda):
        evaluated = [*node.decorator_list, *evaluated]
    return evaluated


def _children(node: ast.AST, scope: str, names: Names, *, import_time: bool) -> Iterator[_Pending]:
    """The nodes under ``node`` with their scope; at import time, only what runs on import."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        yield from ((child, scope, names) for child in _definition_time(node))
        if not import_time:
            inner = inner_names(node, names)
            if isinstance(node, ast.Lambda):
                yield node.body, scope, inner
            else:
                yield from ((child, _qualified(scope, node.name), inner) for child in node.body)
    elif isinstance(node, ast.ClassDef):
        for child in (*node.decorator_list, *node.bases, *node.keywords):
            yield child, scope, names
        inner = inner_names(node, names)
        yield from ((child, _qualified(scope, node.name), inner) for child in node.body)
    elif import_time and isinstance(node, ast.If):
        yield node.test, scope, names
        value = _on_import(node.test)
        for taken, branch in ((True, node.body), (False, node.orelse)):
            if value is None or value is taken:
                yield from ((child, scope, names) for child in branch)
    elif isinstance(
        node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp | ast.comprehension
    ):
        yield from _comprehension_children(node, scope, names)
    elif import_time and isinstance(node, ast.Match) and _is_name(node.subject):
        yield node.subject, scope, names
        cases = [case for case in node.cases if not _main_only(case.pattern)]
        yield from ((case, scope, names) for case in cases)
    else:
        yield from ((child, scope, names) for child in ast.iter_child_nodes(node))


def _comprehension_children(
    node: _Comprehension | ast.comprehension, scope: str, names: Names
) -> Iterator[_Pending]:
    """A comprehension's nodes: a scope of its own, whose loop variables are its names.

    Its first iterable is read in the scope around it, the rest inside.
    """
    if isinstance(node, ast.comprehension):
        yield node.iter, scope, names  # the first's in the scope around, the others' inside
        inner = shadowed(names, (node.target,))
        yield from ((child, scope, inner) for child in (node.target, *node.ifs))
        return
    first, inner = node.generators[0], shadowed(names, (g.target for g in node.generators))
    yield first, scope, names
    yield from ((child, scope, inner) for child in ast.iter_child_nodes(node) if child is not first)


def _is_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "__name__"


def _is_main(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "__main__"


def _main_only(node: ast.AST) -> bool:
    """Whether a pattern, or a collection written out, holds ``"__main__"`` and nothing else."""
    if isinstance(node, ast.MatchValue):
        return _main_only(node.value)
    if isinstance(node, ast.MatchOr):
        return all(_main_only(pattern) for pattern in node.patterns)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return all(_main_only(element) for element in node.elts)
    return _is_main(node)


def _on_import(test: ast.AST) -> bool | None:
    """What ``test`` is when the module is imported (``__name__`` is not ``"__main__"``).

    None where that is not known: anything but a comparison of ``__name__`` with ``"__main__"``
    (or a written-out collection of only it), ``TYPE_CHECKING``, and ``not``, ``and`` and
    ``or`` over them.
    """
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        value = _on_import(test.operand)
        return None if value is None else not value
    if isinstance(test, ast.BoolOp):
        values = [_on_import(operand) for operand in test.values]
        decisive = isinstance(test.op, ast.Or)  # ``or`` is True once one is, ``and`` False
        if decisive in values:
            return decisive
        return None if None in values else not decisive
    if dotted(test) in _TYPING:  # typing's, or unbound (a NameError); not ``= True``
        return False
    return _compared(test) if isinstance(test, ast.Compare) else None


def _compared(test: ast.Compare) -> bool | None:
    """Whether ``__name__`` compared with ``"__main__"`` holds on import; None for others."""
    if len(test.ops) != 1:
        return None
    (op,), left, right = test.ops, test.left, test.comparators[0]
    written_out = isinstance(right, ast.Tuple | ast.List | ast.Set)  # not ``in "__main__"``
    if isinstance(op, ast.In | ast.NotIn) and _is_name(left) and written_out and _main_only(right):
        return isinstance(op, ast.NotIn)
    named = (_is_name(left) and _is_main(right)) or (_is_main(left) and _is_name(right))
    if isinstance(op, ast.Eq | ast.NotEq) and named:
        return isinstance(op, ast.NotEq)
    return None


def _scan(path: Path | str, predicate: Predicate, *, import_time: bool) -> list[SourceText]:
    path = existing_file(path, "path")
    tree, lines = parsed_python(path)
    found: list[SourceText] = []
    pending: list[_Pending] = [(tree, "", module_names(tree))]
    before = IMPORTED.set(pending[0][2].here)
    try:
        while pending:
            node, scope, names = pending.pop()
            IMPORTED.set(names.here)
            if predicate(node):
                line = getattr(node, "lineno", 1)  # 1 for the module itself
                text = lines[line - 1].strip()
                found.append(SourceText(path=str(path), line=line, scope=scope, text=text))
            pending.extend(_children(node, scope, names, import_time=import_time))
    finally:
        IMPORTED.reset(before)
    return sorted(found, key=lambda finding: finding.line)


def import_time_lines(path: Path | str, predicate: Predicate) -> list[SourceText]:
    r"""The places in a file where ``predicate`` holds in code that runs when it is imported.

    Import time is the module body, class bodies, decorators and default values; not function
    bodies, and not a branch that cannot run on import: the body of ``if __name__ ==
    "__main__":`` (also ``__name__ in ("__main__",)``, or with ``and`` more tests), the ``else``
    of ``if __name__ != "__main__":``, ``case "__main__":`` under ``match __name__:``, and
    ``if TYPE_CHECKING:`` (typing's or ``TYPE_CHECKING = False``, and not bound otherwise
    too: ``= True``, from elsewhere); ``if __name__ == "__main__" or debug:`` runs.
    Annotations are not scanned. The file is read as Python imports it (a byte-order mark, a
    ``# coding:`` line), and its imports say what a name is while the predicate runs (see
    :func:`writes_environment`); ``line`` and ``text`` are the line ``ast`` numbers.

    Args:
        path: A Python file.
        predicate: Whether a syntax node is a match (:func:`writes_environment`,
            :func:`configures_logging`, or your own).

    Returns:
        One finding per matching node, in line order; ``scope`` names the class around it.

    Raises:
        SourceNotFoundError: ``path`` does not exist (a ``FileNotFoundError``).
        ValueError: ``path`` is a directory.
        SyntaxError: The file is not valid Python (or not in the encoding it declares).

    Example:
        >>> import ast, tempfile
        >>> from pathlib import Path
        >>> from substrax.testing.source_scans import import_time_lines, writes_environment
        >>> source = [
        ...     "import os",
        ...     "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'",
        ...     "jax.config.update('jax_enable_x64', True)",
        ...     "def main():",
        ...     "    os.environ['A'] = '1'",
        ...     "if __name__ == '__main__':",
        ...     "    main()",
        ... ]
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     path = Path(directory) / "app.py"
        ...     _ = path.write_text("\n".join(source))
        ...     writes = import_time_lines(path, writes_environment)
        ...     calls = import_time_lines(path, lambda node: isinstance(node, ast.Call))
        >>> [finding.line for finding in writes]
        [2]
        >>> [finding.text for finding in calls]
        ["jax.config.update('jax_enable_x64', True)"]
    """
    return _scan(path, predicate, import_time=True)


def matching_lines(path: Path | str, predicate: Predicate) -> list[SourceText]:
    r"""The places anywhere in a file where ``predicate`` holds, each with its enclosing scope.

    Annotations are not scanned. The file is read as :func:`import_time_lines` reads it.

    Args:
        path: A Python file.
        predicate: Whether a syntax node is a match.

    Returns:
        One finding per matching node, in line order; ``scope`` is the qualified name of the
        function or class around it (``""`` at module level), so a check can allow a match in
        named places only.

    Raises:
        SourceNotFoundError: ``path`` does not exist (a ``FileNotFoundError``).
        ValueError: ``path`` is a directory.
        SyntaxError: The file is not valid Python (or not in the encoding it declares).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.testing.source_scans import configures_logging, matching_lines
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     path = Path(directory) / "cli.py"
        ...     _ = path.write_text("import logging\ndef main():\n    logging.basicConfig()\n")
        ...     found = matching_lines(path, configures_logging)
        >>> [(finding.line, finding.scope) for finding in found]
        [(3, 'main')]
    """
    return _scan(path, predicate, import_time=False)
