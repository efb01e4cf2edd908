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


class ConfigWatch:
    """The pytest plugin's account of jax's global config across a session.

    ``expected`` is what the config should read between tests: the session's baseline (taken
    once jax is imported), with the changes the module-, class-, package- or session-scoped
    fixtures set up now made. Each such fixture's changes are recorded when it is set up and
    checked when it is torn down.
    """

    def __init__(self) -> None:
        self.expected: dict[str, Any] | None = None
        self.changes: dict[int, dict[str, Any]] = {}  # by fixture: each option's value before

    def baseline(self) -> dict[str, Any]:
        """``expected``, taken from jax's config now if this is the first ask."""
        if self.expected is None:
            self.expected = snapshot_jax_config()
        return self.expected

    def restore(self) -> list[str]:
        """Set each option that differs from ``expected`` back; return their names, sorted."""
        import jax  # noqa: PLC0415 - called once jax is imported

        expected = self.baseline()
        names = changed_jax_config(expected)
        for name in names:
            jax.config.update(name, expected[name])
        return names

    def set_up(self, fixture: int, before: dict[str, Any]) -> None:
        """Record what a fixture's setup changed (``before``: the config before it ran)."""
        expected = self.baseline()
        now = snapshot_jax_config()
        for name in changed_jax_config(before):
            self.changes.setdefault(fixture, {}).setdefault(name, before[name])
            expected[name] = now[name]

    def torn_down(self, fixture: int) -> list[str]:
        """Set back what a fixture changed and its teardown left; return those names, sorted."""
        import jax  # noqa: PLC0415 - called once jax is imported

        expected, earlier = self.baseline(), self.changes.pop(fixture, {})
        now = snapshot_jax_config()
        left = sorted(name for name, value in earlier.items() if now[name] != value)
        for name, value in earlier.items():
            expected[name] = value
            if name in left:
                jax.config.update(name, value)
        return left
