"""Old module paths kept importable from one map, each warning once that its names moved.

A part that moved names out of a public module declares, in one map, each old path with the
names it served and the module each lives in now; a ``sys.meta_path`` finder then answers
``import old.path`` with a module holding those very objects, after one ``DeprecationWarning``
per path and process that names the import to use instead.
"""

import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from importlib import import_module
from importlib.machinery import ModuleSpec
from types import ModuleType


class _MovedModules:
    """The ``sys.meta_path`` finder and loader of every old path a part declared."""

    def __init__(self) -> None:
        self.moves: dict[str, dict[str, tuple[str, ...]]] = {}
        self.warned: set[str] = set()

    def find_spec(
        self,
        fullname: str,
        path: object = None,  # noqa: ARG002  (the finder protocol's arguments)
        target: object = None,  # noqa: ARG002
    ) -> ModuleSpec | None:
        if fullname not in self.moves:
            return None
        # The finder is its own loader, structurally: importlib.abc.Loader costs 50 ms to import.
        return ModuleSpec(fullname, self)  # pyright: ignore[reportArgumentType]

    def create_module(self, spec: ModuleSpec) -> None:  # noqa: ARG002
        return None  # the import system makes a plain module

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        homes = self.moves[old]
        if old not in self.warned:
            self.warned.add(old)
            warnings.warn(
                deprecation_message(old, homes),
                DeprecationWarning,
                stacklevel=2,
                skip_file_prefixes=_IMPORT_MACHINERY,
            )
        for home, names in homes.items():
            source = import_module(home)
            for name in names:
                setattr(module, name, getattr(source, name))
        module.__doc__ = f"Deprecated: {deprecation_message(old, homes)}."
        setattr(module, "__all__", sorted(name for names in homes.values() for name in names))  # noqa: B010


# The warning names the line that imported the old path, not importlib's frames.
_IMPORT_MACHINERY = (os.path.dirname(import_module.__code__.co_filename) + os.sep,)  # noqa: PTH120
_FINDER = _MovedModules()


def deprecation_message(old: str, homes: Mapping[str, Iterable[str]]) -> str:
    """What importing ``old`` warns: the import to use instead, and the names that went private.

    Args:
        old: The old module path.
        homes: Each module its names live in now, with those names.

    Returns:
        One sentence, without a final full stop.

    Example:
        >>> from substrax.support._moved import deprecation_message
        >>> deprecation_message("old.spec", {"new": ["Task", "JobSpec"], "new._spec": ["helper"]})
        'old.spec is deprecated and will be removed: use `from new import JobSpec, Task`; helper went private, with no import to use instead'
    """
    public = {home: sorted(names) for home, names in homes.items() if not _private(home)}
    hidden = sorted(name for home, names in homes.items() if _private(home) for name in names)
    uses = " and ".join(
        f"`from {home} import {', '.join(names)}`" for home, names in public.items()
    )
    text = f"{old} is deprecated and will be removed"
    if uses:
        text += f": use {uses}"
    if hidden:
        text += f"; {', '.join(hidden)} went private, with no import to use instead"
    return text


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def moved_modules(moves: Mapping[str, Mapping[str, Iterable[str]]]) -> None:
    """Keep each old module path importable, warning once per process where its names went.

    ``import old.path`` (or ``from old.path import Name``) then gives a module holding the
    same objects as their new homes, after one ``DeprecationWarning`` per path and process that
    names the new import. A part calls this from its package ``__init__`` with its one map of
    old paths; importing an old path imports its package first, so the map is always in place.

    Args:
        moves: Each old module path, with each module its names live in now and those names
            (``{"pkg.spec": {"pkg": ["JobSpec", "Task"]}}``). A home whose path has a private
            part (``pkg._spec``) is named in the warning as private, with no import to use.

    Example:
        >>> import warnings
        >>> from substrax.support import moved_modules
        >>> moved_modules({"substrax_example_modes": {"substrax.support": ["Mode"]}})
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     from substrax_example_modes import Mode
        >>> print(caught[0].message)
        substrax_example_modes is deprecated and will be removed: use `from substrax.support import Mode`
        >>> import substrax.support
        >>> Mode is substrax.support.Mode
        True
    """
    for old, homes in moves.items():
        _FINDER.moves[old] = {home: tuple(names) for home, names in homes.items()}
    if _FINDER not in sys.meta_path:
        # First: an old path is answered from the map, never from a stale file left beside it.
        sys.meta_path.insert(0, _FINDER)
