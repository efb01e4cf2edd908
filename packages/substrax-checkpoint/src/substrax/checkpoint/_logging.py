"""Quiet one orbax warning that every save without OCDBT would otherwise print."""

import logging


_NOTHING_TO_MERGE = "Skipping merge of OCDBT checkpoints: No per-process OCDBT checkpoint"


class _NothingToMerge(logging.Filter):
    """Drop orbax's "nothing to merge" warning: a store written without OCDBT has nothing to merge."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _NOTHING_TO_MERGE not in str(record.msg)


def quiet_orbax_merge_warning() -> None:
    """Install the filter on the ``absl`` logger once (idempotent).

    Example:
        >>> quiet_orbax_merge_warning()
    """
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _NothingToMerge) for f in logger.filters):
        logger.addFilter(_NothingToMerge())
