"""Logging for a script's ``main()``, without ``force=True``."""

import logging
from typing import TextIO


ENTRY_POINT_HANDLER_NAME = "substrax.entry_point"


def configure_entry_point_logging(
    level: int | str = logging.INFO,
    *,
    stream: TextIO | None = None,
    fmt: str = "%(message)s",
) -> logging.Handler:
    r"""Install one named stream handler on the root logger and set its level.

    A second call replaces the handler this function installed; handlers installed by anyone
    else (pytest's capture among them) are left in place, unlike ``basicConfig(force=True)``.

    Args:
        level: The root logger's level.
        stream: Where records go; defaults to ``sys.stderr``.
        fmt: The ``logging.Formatter`` format.

    Returns:
        The installed handler.

    Example:
        >>> import io, logging
        >>> from substrax.runtime import configure_entry_point_logging
        >>> root = logging.getLogger()
        >>> level = root.level
        >>> buffer = io.StringIO()
        >>> handler = configure_entry_point_logging(stream=buffer)
        >>> logging.getLogger("demo").info("hello")
        >>> buffer.getvalue()
        'hello\n'
        >>> root.removeHandler(handler)  # an entry point keeps it; an example tidies up
        >>> root.setLevel(level)
    """
    root = logging.getLogger()
    for existing in list(root.handlers):
        if existing.get_name() == ENTRY_POINT_HANDLER_NAME:
            root.removeHandler(existing)
            existing.close()
    handler = logging.StreamHandler(stream)
    handler.set_name(ENTRY_POINT_HANDLER_NAME)
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
    return handler
