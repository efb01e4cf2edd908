"""Opt-in quieting of the orbax warnings that report what the store asked for on purpose."""

import logging
from typing import Final


_EXPECTED: Final = (
    # every save without OCDBT: there is nothing to merge
    "Skipping merge of OCDBT checkpoints: No per-process OCDBT checkpoint",
    # every read_only open (readers, the CLI's ls/show/verify): a reader saves nothing
    "CheckpointManagerOptions.read_only=True, setting save_interval_steps=0",
    "Given directory is read only=",
)


class _Expected(logging.Filter):
    """Drop orbax's warnings about settings the store chose on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not any(expected in message for expected in _EXPECTED)


def quiet_orbax_notices() -> None:
    """Hide orbax's warnings about settings the store chooses on purpose (opt-in, idempotent).

    Orbax warns through absl at every save without OCDBT and at every ``read_only`` open. The
    store never touches another library's loggers by itself: this adds a filter dropping
    exactly those messages to the ``absl`` logger. ``python -m substrax.checkpoint`` calls it.

    Example:
        >>> import logging
        >>> from substrax.checkpoint import quiet_orbax_notices
        >>> absl, before = logging.getLogger("absl"), list(logging.getLogger("absl").filters)
        >>> quiet_orbax_notices()
        >>> quiet_orbax_notices()  # a second call adds nothing
        >>> [added] = [f for f in absl.filters if f not in before]
        >>> absl.removeFilter(added)  # an example leaves the process's loggers as it found them
    """
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _Expected) for f in logger.filters):
        logger.addFilter(_Expected())
