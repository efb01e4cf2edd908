"""substrax: the training plumbing of a JAX/Flax NNX project.

Each part is its own distribution under the shared ``substrax`` namespace; this package owns the
namespace's ``__init__`` and reaches every part lazily, so ``import substrax`` imports no jax.

Example:
    >>> import substrax
    >>> substrax.__version__ == __import__("importlib.metadata").metadata.version("substrax")
    True
"""

import importlib
import importlib.metadata
import pkgutil
from types import ModuleType
from typing import TYPE_CHECKING


if TYPE_CHECKING:  # the parts, as type checkers and editors should see them
    from substrax import (
        artifacts as artifacts,
        callbacks as callbacks,
        checkpoint as checkpoint,
        compute as compute,
        devices as devices,
        examples as examples,
        mesh as mesh,
        optim as optim,
        records as records,
        rng as rng,
        runtime as runtime,
        spmd as spmd,
        testing as testing,
        tracking as tracking,
        typing as typing,
    )


# The namespace spans every part's directory, editable (one src/ per part) or installed.
__path__ = pkgutil.extend_path(__path__, __name__)

__version__ = importlib.metadata.version("substrax")

_PARTS = frozenset(
    {
        "artifacts",
        "callbacks",
        "checkpoint",
        "compute",
        "devices",
        "examples",
        "mesh",
        "optim",
        "records",
        "rng",
        "runtime",
        "spmd",
        "testing",
        "tracking",
        "typing",
    }
)

__all__ = [
    "__version__",
    "artifacts",
    "callbacks",
    "checkpoint",
    "compute",
    "devices",
    "examples",
    "mesh",
    "optim",
    "records",
    "rng",
    "runtime",
    "spmd",
    "testing",
    "tracking",
    "typing",
]


def __getattr__(name: str) -> ModuleType:
    """Import a part on first attribute access (PEP 562)."""
    if name in _PARTS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'substrax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PARTS})
