"""A package's public names loaded from their private modules on first use (PEP 562)."""

import sys
from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` that load each public name when first used.

    A package's ``__init__`` keeps its ``if TYPE_CHECKING:`` imports (what type checkers and
    readers see) and its ``__all__``, and lets this load each name from its module the first time
    it is asked for; the value is then kept in the package, so later uses cost nothing.

    Args:
        package: The package's ``__name__``.
        homes: Each public name and the module that defines it, relative to ``package``
            (``{"Mode": "_mode"}``).
        public: What ``dir(package)`` lists besides the package's globals (its ``__all__``).

    Returns:
        ``(__getattr__, __dir__)``, to assign at the package's top level.

    Example:
        >>> from substrax.support import lazy_exports
        >>> getattr_, dir_ = lazy_exports("substrax.support", {"Mode": "_mode"}, ["Mode"])
        >>> getattr_("Mode").MAX
        <Mode.MAX: 'max'>
        >>> getattr_("nothing")
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

    return module_getattr, module_dir
