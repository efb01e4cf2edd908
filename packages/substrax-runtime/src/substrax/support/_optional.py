"""Optional SDKs (wandb, mlflow, modal, skypilot, rich, ...), imported where they are used."""

# ruff: noqa: ANN401  (an imported SDK module is typed Any on purpose)

import importlib
from typing import Any

from ._structured import StructuredError


class MissingExtraError(StructuredError, ImportError):
    """An optional SDK is not installed; the message names the extra that brings it.

    Attributes:
        who: what needed it.
        module: the module that failed to import.
        distribution: the substrax distribution whose extra installs it.
        extra: that extra's name.
        name: the top-level package that is missing (``ImportError.name``, e.g. ``"wandb"``).
    """

    __module__ = "substrax.support"

    who: str
    module: str
    distribution: str
    extra: str

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = self.module.partition(".")[0]  # what `except ImportError as e` checks

    def _message(self) -> str:
        package = self.module.partition(".")[0]
        return f"{self.who} needs {package}; {install_hint(self.distribution, self.extra)}"


def install_hint(distribution: str, extra: str) -> str:
    """The sentence that tells how to install ``extra``: the meta-package's, then the part's.

    Example:
        >>> from substrax.support import install_hint
        >>> install_hint("substrax-tracking", "wandb")
        "install it with `uv add 'substrax[wandb]'` (or `uv add 'substrax-tracking[wandb]'`)"
    """
    return f"install it with `uv add 'substrax[{extra}]'` (or `uv add '{distribution}[{extra}]'`)"


def require(module: str, *, who: str, distribution: str, extra: str) -> Any:
    """Import ``module``, or raise :class:`MissingExtraError` naming the extra that installs it.

    Args:
        module: the dotted module to import (``"wandb"``, ``"rich.progress"``).
        who: what needs it, for the message (``"WandbLogger"``).
        distribution: the substrax distribution that declares the extra (``"substrax-tracking"``).
        extra: the extra that brings it (``"wandb"``).

    Example:
        >>> from substrax.support import require
        >>> require("json", who="this", distribution="substrax-runtime", extra="none").dumps([1])
        '[1]'
        >>> require("no_such_sdk", who="MyLogger", distribution="substrax-tracking", extra="x")
        Traceback (most recent call last):
        ...
        substrax.support.MissingExtraError: MyLogger needs no_such_sdk; install it with ...
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(who, module, distribution=distribution, extra=extra) from error


def optional(module: str) -> Any | None:
    """``module`` imported, or None when it is not installed (for a nicety such as rich output).

    Example:
        >>> from substrax.support import optional
        >>> optional("no_such_sdk") is None
        True
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
