"""Optional SDKs (wandb, mlflow, tensorboardX, matplotlib, rich), imported where they are used.

Example:
    >>> require("json", who="this", extra="none").dumps([1])
    '[1]'
    >>> install_hint("plots")
    "install it with `uv add 'substrax-tracking[plots]'`"
"""

# ruff: noqa: ANN401  (an imported SDK module is typed Any on purpose)

from __future__ import annotations

import importlib
from typing import Any


def install_hint(extra: str) -> str:
    """The sentence that tells how to install the ``extra`` of substrax-tracking."""
    return f"install it with `uv add 'substrax-tracking[{extra}]'`"


def require(module: str, *, who: str, extra: str) -> Any:
    """Import ``module``, or raise an ImportError naming the extra that installs it.

    Args:
        module: The dotted module to import (``"wandb"``, ``"rich.progress"``).
        who: What needs it, for the message (``"WandbLogger"``).
        extra: The substrax-tracking extra that brings it (``"wandb"``).

    Raises:
        ImportError: ``<who> needs <package>; install it with `uv add 'substrax-tracking[<extra>]'```.
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = module.partition(".")[0]
        raise ImportError(f"{who} needs {package}; {install_hint(extra)}") from error
