"""Where a logger writes when no directory is given: the artifacts policy, never the working tree."""

from __future__ import annotations

import os
from pathlib import Path


__all__ = ["resolve_log_dir"]


def resolve_log_dir(name: str, log_dir: str | os.PathLike[str] | None) -> Path:
    """``log_dir`` resolved, or ``substrax.artifacts.resolve_output_dir(name)`` when it is None.

    The default is ``$AVITAI_OUTPUT_DIR/<name>`` or a per-run temporary directory, never the
    current working directory.

    Example:
        >>> import tempfile
        >>> from substrax.tracking._paths import resolve_log_dir
        >>> resolve_log_dir("demo", tempfile.gettempdir()).is_absolute()
        True
    """
    if log_dir is not None:
        return Path(log_dir).resolve()
    from substrax.artifacts import resolve_output_dir  # noqa: PLC0415

    return Path(resolve_output_dir(name).path)
