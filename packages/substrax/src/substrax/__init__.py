"""substrax: the training plumbing of a JAX/Flax NNX project.

Each part is its own distribution under the shared ``substrax`` namespace; this package owns the
namespace's ``__init__`` and reaches every part lazily (PEP 562), so ``import substrax`` imports
no jax and costs next to nothing. ``substrax.mesh`` imports the mesh part on first use.

Example:
    >>> import substrax
    >>> substrax.__version__ == __import__("importlib.metadata").metadata.version("substrax")
    True
    >>> substrax.records.__name__
    'substrax.records'
"""

import os as _os
import sys as _sys
from importlib import import_module as _import_module
from types import ModuleType as _ModuleType


# The namespace spans every part's directory, editable (one src/ per part) or installed: what
# pkgutil.extend_path does, without the cost of importing pkgutil.
__path__ = [
    *__path__,
    *(
        portion
        for portion in (_os.path.join(entry or _os.curdir, __name__) for entry in _sys.path)  # noqa: PTH118
        if portion not in __path__ and _os.path.isdir(portion)  # noqa: PTH112
    ),
]

_PARTS = frozenset(
    {
        "artifacts",
        "callbacks",
        "checkpoint",
        "compute",
        "devices",
        "examples",
        "mesh",
        "nnx_typing",
        "optim",
        "records",
        "rng",
        "runtime",
        "spmd",
        "support",
        "testing",
        "tracking",
        "typing",
    }
)


def __getattr__(name: str) -> _ModuleType | str:
    """Import a part, or read the installed version, on first access (PEP 562)."""
    if name in _PARTS:
        return _import_module(f"{__name__}.{name}")
    if name == "__version__":
        # importlib.metadata costs ~100 ms to import: pay it only when the version is asked for.
        from importlib.metadata import version as installed_version  # noqa: PLC0415

        version = installed_version("substrax")
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'substrax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PARTS, "__version__"})
