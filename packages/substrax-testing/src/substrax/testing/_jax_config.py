"""``restored_jax_config``: undo changes to jax's global configuration made inside a block.

Importing this module imports no jax; entering ``restored_jax_config`` does.

Example:
    >>> import jax
    >>> from substrax.testing import restored_jax_config
    >>> with restored_jax_config() as changed:
    ...     jax.config.update("jax_debug_nans", True)
    >>> changed
    ['jax_debug_nans']
    >>> jax.config.jax_debug_nans
    False
"""

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any


def snapshot_jax_config() -> dict[str, Any]:
    """Read every jax config option's current value (as this thread sees it).

    Returns:
        A mapping from option name (``"jax_enable_x64"``) to value.
    """
    import jax  # noqa: PLC0415 - importing this module imports no jax

    return dict(jax.config.values)


def changed_jax_config(before: dict[str, Any]) -> list[str]:
    """Name the options whose value differs from ``before`` (options added since are ignored).

    Args:
        before: A snapshot from ``snapshot_jax_config``.

    Returns:
        The changed option names, sorted.
    """
    now = snapshot_jax_config()
    return sorted(name for name, value in before.items() if name in now and now[name] != value)


@contextmanager
def restored_jax_config() -> Generator[list[str]]:
    """Snapshot jax's config, run the block, then set every changed option back.

    Options are restored even when the block raises.

    Yields:
        A list that, once the block exits, holds the sorted names of the options the block
        changed (and that were restored).

    Raises:
        RuntimeError: jax refused to restore an option (e.g. ``jax_num_cpu_devices`` after
            the backend started); it propagates from ``jax.config.update``.
    """
    import jax  # noqa: PLC0415 - importing this module imports no jax

    before = snapshot_jax_config()
    changed: list[str] = []
    try:
        yield changed
    finally:
        names = changed_jax_config(before)
        for name in names:
            jax.config.update(name, before[name])
        changed[:] = names
