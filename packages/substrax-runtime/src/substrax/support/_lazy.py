"""A package's public names, listed once in its ``__init__.pyi``, loaded on first use (PEP 562).

A part's package keeps its re-exports in one place, the stub beside its ``__init__.py``: one
``from ._module import Name as Name`` line per name. Type checkers read the stub; at run time
:func:`lazy_exports` reads the same stub and loads each name from its module the first time it
is asked for, so the list cannot drift from what the type checker sees.
"""

import os
import sys
from _ast import (  # the parser's own nodes: the ast module would add re and enum to every import
    Constant,
    Expr,
    ImportFrom,
    Module,
    PyCF_ONLY_AST,
)
from collections.abc import Iterable
from importlib import import_module


STUB_NAME = "__init__.pyi"


class DamagedInstallError(ImportError):
    """A package is installed without its ``__init__.pyi``: reinstalling its distribution mends it.

    An ``ImportError`` (with ``name`` and ``path`` set), since it is raised while the package
    imports; its own class so that the message, not the type, is what names the remedy.
    """


def read_stub(path: str) -> dict[str, str]:
    """Each name a package stub re-exports and the module it is imported from, as written.

    A stub holds ``from .module import Name as Name`` lines (``from substrax.part import Name as
    Name`` for a name another part defines), and at most a docstring and comments besides:
    anything else is refused, so the stub stays a list that run time can read.

    Args:
        path: The stub's path.

    Returns:
        ``{"Name": ".module"}``, in the stub's order; an absolute module stays absolute.

    Raises:
        ValueError: The stub holds a line that is not such a re-export, or a name twice.

    Example:
        >>> import os, tempfile
        >>> from substrax.support._lazy import read_stub
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     stub = os.path.join(directory, "__init__.pyi")
        ...     with open(stub, "w") as file:
        ...         print("from ._mode import Mode as Mode, check_mode as check_mode", file=file)
        ...         print("from substrax.support import Closeable as Closeable", file=file)
        ...     read_stub(stub)
        {'Mode': '._mode', 'check_mode': '._mode', 'Closeable': 'substrax.support'}
    """
    with open(path, "rb") as file:  # noqa: PTH123  (pathlib would cost every part an import)
        source = file.read()
    tree = compile(source, path, "exec", PyCF_ONLY_AST, dont_inherit=True)
    if not isinstance(tree, Module):  # what "exec" always gives
        raise TypeError(f"{path}: parsed as {type(tree).__name__}, not a module")
    homes: dict[str, str] = {}
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, Expr) and isinstance(node.value, Constant):
            continue  # the stub's docstring
        if (
            not isinstance(node, ImportFrom)
            or node.level > 1
            or node.module is None
            or any(alias.name == "*" for alias in node.names)
        ):
            raise _refused(path, node.lineno, "only `from .module import Name as Name` lines")
        home = "." * node.level + node.module
        for alias in node.names:
            if alias.asname != alias.name:
                raise _refused(path, node.lineno, f"re-exports as `{alias.name} as {alias.name}`")
            if alias.name in homes:
                raise _refused(path, node.lineno, f"{alias.name!r} once")
            homes[alias.name] = home
    return homes


def _refused(path: str, line: int, wanted: str) -> ValueError:
    return ValueError(f"{path}:{line}: a package stub holds {wanted}")


def lazy_exports(package: str, *, eager: bool | Iterable[str] = False) -> None:
    """Give ``package`` the names its ``__init__.pyi`` lists: ``__all__``, ``__getattr__``, ``__dir__``.

    A part's ``__init__.py`` calls this with its ``__name__``; its stub, beside it, is the one
    list of its public names (what type checkers see). Each name is loaded from its module the
    first time it is asked for (PEP 562) and then kept in the package, so later uses cost
    nothing; ``__all__`` lists the stub's names, sorted, and ``dir()`` shows them. A name the
    ``__init__.py`` already bound (an eager import) is left as it is. The hooks are set on the
    module object at run time, so type checkers see no module-level ``__getattr__`` and still
    report a misspelled import.

    Args:
        package: The package's ``__name__``.
        eager: ``True`` to load every name now; or the modules, as the stub writes them
            (``"._config"``), whose names to load now. The others load on first use.

    Raises:
        ImportError: The package has no stub (a damaged install), naming its path.
        ValueError: The stub holds anything but ``from .module import Name as Name`` lines, or
            ``eager`` names a module it does not.

    Example:
        >>> import substrax.support
        >>> substrax.support.Mode.MAX  # loaded from substrax.support._mode on first use
        <Mode.MAX: 'max'>
        >>> "check_int" in substrax.support.__all__
        True
        >>> substrax.support.nothing
        Traceback (most recent call last):
        ...
        AttributeError: module 'substrax.support' has no attribute 'nothing'
    """
    module = sys.modules[package]
    stub = os.path.join(module.__path__[0], STUB_NAME)  # noqa: PTH118  (no pathlib import)
    try:
        homes = read_stub(stub)
    except FileNotFoundError:
        raise DamagedInstallError(
            f"{package} is installed without {stub}, the list of its public names: the install"
            f" is damaged; reinstall the distribution that holds {package}",
            name=package,
            path=stub,
        ) from None

    def load(name: str) -> object:
        value = getattr(import_module(homes[name], package), name)
        setattr(module, name, value)
        return value

    def module_getattr(name: str) -> object:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return load(name)

    def module_dir() -> list[str]:
        return sorted({*vars(module), *homes})

    setattr(module, "__all__", sorted(homes))  # noqa: B010  (ModuleType does not declare it)
    setattr(module, "__getattr__", module_getattr)  # noqa: B010  (PEP 562's hook, set at run time)
    setattr(module, "__dir__", module_dir)  # noqa: B010
    now = set(homes.values()) if eager is True else set(eager or ())
    if not now <= set(homes.values()):
        unknown = sorted(now - set(homes.values()))
        raise ValueError(f"{package}: eager modules {unknown} are not in its {STUB_NAME}")
    for name, home in homes.items():
        if home in now and name not in vars(module):
            load(name)
