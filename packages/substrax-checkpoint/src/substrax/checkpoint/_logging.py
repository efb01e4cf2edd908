"""Quiet the orbax warnings that report what the store asked for, on every save or read-only open."""

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
    """Install the filter on the ``absl`` logger once (idempotent).

    Example:
        >>> quiet_orbax_notices()
    """
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _Expected) for f in logger.filters):
        logger.addFilter(_Expected())
        >>> import logging
        >>> from substrax.checkpoint import quiet_orbax_notices
        >>> from substrax.checkpoint._logging import _Expected
