"""Run a callback the moment ``jax`` is first imported, before the importer's next line.

The pytest plugin takes its config baseline there when a test is the first to import jax, so
that what the test changes after its ``import jax`` is seen. Importing this module imports no
jax.
"""

import contextlib
import importlib.abc
import sys
from collections.abc import Callable, Generator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _OnImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` as the other finders do, and runs ``callback`` once it has executed."""

    def __init__(self, name: str, callback: Callable[[], object]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # once; and the finders below find the module
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        callback = self.callback

        def exec_module(module: ModuleType) -> None:
            original(module)
            with contextlib.suppress(AttributeError):
                del loader.exec_module  # pyright: ignore[reportAttributeAccessIssue]
            callback()

        loader.exec_module = exec_module  # pyright: ignore[reportAttributeAccessIssue]
        return spec


@contextlib.contextmanager
def on_first_import(name: str, callback: Callable[[], object]) -> Generator[None]:
    """Within the block, run ``callback`` right after top-level module ``name`` is imported.

    Nothing is watched when it is imported already.
    """
    if name in sys.modules:
        yield
        return
    finder = _OnImport(name, callback)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
