"""``restored_jax_config``: undo changes to jax's global configuration made inside a block.

Each option is read twice: its global value (what ``jax.config.update`` sets) and this thread's
override of it (what a config context manager such as ``jax.enable_x64(True)`` sets until it
exits). Either one left changed is set back, and named; an override is named with
``" (thread-local)"`` after the option.

Importing this module imports no jax; entering ``restored_jax_config`` does.

Example:
    >>> import jax
    >>> from substrax.testing import restored_jax_config
    >>> with restored_jax_config() as changed:
    ...     jax.config.update("jax_debug_nans", True)
    ...     jax.enable_x64(True).__enter__()  # entered, never exited
    >>> changed
    ['jax_debug_nans', 'jax_enable_x64 (thread-local)']
    >>> jax.config.jax_debug_nans, jax.config.jax_enable_x64
    (False, False)
"""

from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any


THREAD_LOCAL = " (thread-local)"  # after an option's name: this thread's override of it changed

type Snapshot = dict[str, tuple[Any, Any]]  # option name: (global value, thread-local value)


def snapshot_jax_config() -> Snapshot:
    """Read every jax config option's global value and this thread's override of it.

    Returns:
        A mapping from option name (``"jax_enable_x64"``) to ``(global value, thread-local
        value)`` (``substrax.runtime.config_settings``, which says why jax's own holders are
        read: no public API tells an override from a global value).
    """
    from substrax.runtime import config_settings  # noqa: PLC0415 - it imports jax

    return config_settings()


def _differences(target: Mapping[str, tuple[Any, Any]], now: Snapshot) -> list[str]:
    """Name the options of ``target`` whose global value or override differs now, sorted."""
    labels: list[str] = []
    for name, (global_value, local_value) in target.items():
        if name not in now:
            continue  # an option jax no longer has
        now_global, now_local = now[name]
        if now_global != global_value:
            labels.append(name)
        if now_local is not local_value and now_local != local_value:
            labels.append(name + THREAD_LOCAL)
    return sorted(labels)


def changed_jax_config(before: Mapping[str, tuple[Any, Any]]) -> list[str]:
    """Name the options that differ from ``before`` (options added since are ignored).

    Args:
        before: A snapshot from ``snapshot_jax_config``, or part of one.

    Returns:
        The changed options, sorted: an option whose global value changed by its name, one
        whose thread-local override changed by its name and ``" (thread-local)"``.
    """
    return _differences(before, snapshot_jax_config())


def restore_jax_config(target: Mapping[str, tuple[Any, Any]]) -> tuple[list[str], list[str]]:
    """Set each option of ``target`` that differs from it now back, then check that it is.

    Args:
        target: A snapshot from ``snapshot_jax_config``, or part of one.

    Returns:
        The options that differed (as ``changed_jax_config`` names them) and those that still
        differ after being set back (normally none).

    Raises:
        RuntimeError: jax refused to restore an option (e.g. ``jax_num_cpu_devices`` after
            the backend started); it propagates from ``jax.config.update``.
    """
    import jax  # noqa: PLC0415 - importing this module imports no jax

    from substrax.runtime import set_config_override  # noqa: PLC0415

    changed = changed_jax_config(target)
    if not changed:  # the usual case: one read of jax's config
        return changed, []
    for label in changed:
        name = label.removesuffix(THREAD_LOCAL)
        global_value, local_value = target[name]
        if label == name:
            jax.config.update(name, global_value)
        else:
            set_config_override(name, local_value)
    return changed, changed_jax_config(target)


@contextmanager
def restored_jax_config() -> Generator[list[str]]:
    """Snapshot jax's config, run the block, then set every changed option back.

    Options are restored even when the block raises. A config context manager entered in the
    block and never exited (``jax.enable_x64(True).__enter__()``) is undone too.

    Yields:
        A list that, once the block exits, holds the sorted names of the options the block
        changed (and that were restored); an option whose thread-local override changed is
        named with ``" (thread-local)"`` after it.

    Raises:
        RuntimeError: jax refused to restore an option (e.g. ``jax_num_cpu_devices`` after
            the backend started); it propagates from ``jax.config.update``.
        ValueError: An option still differs after being set back (naming it).
    """
    before = snapshot_jax_config()
    changed: list[str] = []
    try:
        yield changed
    finally:
        names, left = restore_jax_config(before)
        changed[:] = names
        if left:
            raise ValueError(
                f"jax's config could not be set back: {', '.join(left)} still differ(s) after "
                "restoring; set it back yourself after the block"
            )


class ConfigWatch:
    """The pytest plugin's account of jax's config across a session.

    ``expected`` is what the config should read between tests: the session's baseline (taken
    once jax is imported), with the changes the module-, class-, package- or session-scoped
    fixtures set up now made. Each such fixture's changes are recorded when it is set up and
    checked when it is torn down. Global values and this thread's overrides are both held.
    """

    def __init__(self) -> None:
        self.expected: Snapshot | None = None
        self.changes: dict[int, dict[str, Any]] = {}  # by fixture: each changed label's before

    def baseline(self) -> Snapshot:
        """``expected``, taken from jax's config now if this is the first ask."""
        if self.expected is None:
            self.expected = snapshot_jax_config()
        return self.expected

    def restore(self) -> tuple[list[str], list[str]]:
        """Set each option that differs from ``expected`` back.

        Returns:
            The options that differed and those still differing after (``restore_jax_config``).
        """
        return restore_jax_config(self.baseline())

    def set_up(self, fixture: int, before: Snapshot) -> None:
        """Record what a fixture's setup changed (``before``: the config before it ran).

        Only what changed is expected from now on: an option's global value, its override, or
        both; the other stays as expected.
        """
        expected, now = self.baseline(), snapshot_jax_config()
        for label in _differences(before, now):
            name, part = _part(label)
            self.changes.setdefault(fixture, {}).setdefault(label, before[name][part])
            expected[name] = _replaced(expected.get(name, now[name]), part, now[name][part])

    def torn_down(self, fixture: int) -> tuple[list[str], list[str]]:
        """Set back what a fixture changed and its teardown left, as ``expected`` holds them.

        Returns:
            Those options, and the ones still differing after (``restore_jax_config``).
        """
        expected, earlier = self.baseline(), self.changes.pop(fixture, {})
        if not earlier:
            return [], []
        names = {_part(label)[0] for label in earlier}
        for label, value in earlier.items():  # the part it changed set back; the other as was
            name, part = _part(label)
            expected[name] = _replaced(expected[name], part, value)
        return restore_jax_config({name: expected[name] for name in names})


def _part(label: str) -> tuple[str, int]:
    """The option a label names, and which part changed: 0 its global value, 1 its override."""
    name = label.removesuffix(THREAD_LOCAL)
    return name, int(name != label)


def _replaced(setting: tuple[Any, Any], part: int, value: object) -> tuple[Any, Any]:
    return (value, setting[1]) if part == 0 else (setting[0], value)
