"""Where jax's persistent compilation cache lives when nothing else says."""

from __future__ import annotations

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from pathlib import Path


def default_compilation_cache_dir() -> Path:
    """The user cache directory's ``jax`` folder: ``platformdirs.user_cache_dir("substrax")/jax``.

    ``JaxRuntime`` keeps jax's persistent compilation cache here unless its
    ``compilation_cache_dir`` says otherwise (or ``compilation_cache=False`` turns it off), so a
    second run of the same program loads its compiled steps instead of compiling them again.

    Example:
        >>> from substrax.runtime import default_compilation_cache_dir
        >>> path = default_compilation_cache_dir()
        >>> path.is_absolute(), path.name, path.parent.name.lower()
        (True, 'jax', 'substrax')
    """
    # pathlib and platformdirs load only when a cache directory is rendered (see _config.py)
    from pathlib import Path  # noqa: PLC0415

    import platformdirs  # noqa: PLC0415

    return Path(platformdirs.user_cache_dir("substrax")).resolve() / "jax"
