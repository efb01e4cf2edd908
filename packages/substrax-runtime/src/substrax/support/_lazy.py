"""A package's public names loaded from their private modules on first use (PEP 562)."""

import sys
from collections.abc import Iterable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str], public: Iterable[str]) -> None:
    """Give ``package`` a module ``__getattr__`` and ``__dir__`` loading each public name on use.

    A package's ``__init__`` keeps its ``if TYPE_CHECKING:`` imports (what type checkers and
    readers see) and its ``__all__``, and calls this last to load each name from its module the
    first time it is asked for; the value is then kept in the package, so later uses cost
    nothing. The hooks are set on the module object at run time, so type checkers see no
    module-level ``__getattr__`` and still report a misspelled import.

    Args:
        package: The package's ``__name__``.
        homes: Each public name and the module that defines it, relative to ``package``
            (``{"Mode": "_mode"}``).
        public: What ``dir(package)`` lists besides the package's globals (its ``__all__``).

    Example:
        >>> import substrax.support
        >>> substrax.support.Mode.MAX  # loaded from substrax.support._mode on first use
        <Mode.MAX: 'max'>
        >>> substrax.support.nothing
        Traceback (most recent call last):
        ...
        AttributeError: module 'substrax.support' has no attribute 'nothing'
    """
    listed = frozenset(public)

    def module_getattr(name: str) -> Any:  # noqa: ANN401  (any of the public names)
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def module_dir() -> list[str]:
        return sorted({*vars(sys.modules[package]), *listed})

    module = sys.modules[package]
    setattr(module, "__getattr__", module_getattr)  # noqa: B010  (PEP 562's hook, set at run time)
    setattr(module, "__dir__", module_dir)  # noqa: B010
