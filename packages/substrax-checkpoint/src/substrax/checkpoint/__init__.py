"""substrax.checkpoint: a step-addressed Orbax checkpoint store that restores onto any topology.

A checkpoint is a step holding named items (``model``, ``optimizer``, ``rng``,
``data_iterator``, ``extensions``), each a PyTree, beside one ``CheckpointMetadata`` record.
Importing this package imports nothing else, not even jax or orbax: each name is loaded from its
module when first used (PEP 562); the errors, records and policies need neither.

Example:
    >>> import tempfile
    >>> import numpy as np
    >>> from substrax.checkpoint import OrbaxCheckpointStore
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     with OrbaxCheckpointStore(directory, max_to_keep=3) as store:
    ...         _ = store.save(100, {"model": {"w": np.ones(2)}}, epoch=2, metrics={"loss": 0.25})
    ...         _ = store.save(200, {"model": {"w": np.zeros(2)}}, metrics={"loss": 0.20})
    ...         (store.list_steps(), store.best_step("loss"), store.read_metadata(100).epoch)
    ([100, 200], 200, 2)
"""

from typing import TYPE_CHECKING

from substrax.support import Mode as Mode, lazy_exports


if TYPE_CHECKING:
    from ._callback import CheckpointCallback as CheckpointCallback
    from ._logging import quiet_orbax_notices as quiet_orbax_notices
    from ._metadata import (
        CURRENT_FORMAT_VERSION as CURRENT_FORMAT_VERSION,
        FORMAT_NAME as FORMAT_NAME,
        ITEM_NAMES as ITEM_NAMES,
        LIBRARY_NAMES as LIBRARY_NAMES,
        RESERVED_METADATA_KEYS as RESERVED_METADATA_KEYS,
        CheckpointMetadata as CheckpointMetadata,
        Producer as Producer,
        check_extra as check_extra,
        library_versions as library_versions,
    )
    from ._paths import resolve_checkpoint_dir as resolve_checkpoint_dir
    from ._preemption import PreemptionHandler as PreemptionHandler
    from ._protocol import Checkpoint as Checkpoint, CheckpointStore as CheckpointStore
    from ._read_errors import (
        CheckpointCorruptError as CheckpointCorruptError,
        CheckpointDtypeMismatchError as CheckpointDtypeMismatchError,
        CheckpointNotFoundError as CheckpointNotFoundError,
        CheckpointStoreClosedError as CheckpointStoreClosedError,
        CheckpointStoreNotADirectoryError as CheckpointStoreNotADirectoryError,
        CheckpointStoreNotFoundError as CheckpointStoreNotFoundError,
        CheckpointWaitTimeoutError as CheckpointWaitTimeoutError,
        DtypeMismatch as DtypeMismatch,
        UnsupportedCheckpointError as UnsupportedCheckpointError,
    )
    from ._retention import RetentionPolicy as RetentionPolicy
    from ._store import (
        OrbaxCheckpointStore as OrbaxCheckpointStore,
        upgrade_checkpoints as upgrade_checkpoints,
    )
    from ._write_errors import (
        BestMetricNotRecordedError as BestMetricNotRecordedError,
        CheckpointLeafNameCollisionError as CheckpointLeafNameCollisionError,
        CheckpointLockedError as CheckpointLockedError,
        CheckpointNotWrittenError as CheckpointNotWrittenError,
        CheckpointStoreReadOnlyError as CheckpointStoreReadOnlyError,
        CheckpointStoreRemovedError as CheckpointStoreRemovedError,
        CheckpointStoreSupersededError as CheckpointStoreSupersededError,
        CheckpointWriteError as CheckpointWriteError,
        DistributedNotInitializedError as DistributedNotInitializedError,
        NotWrittenReason as NotWrittenReason,
        UpgradeDestinationError as UpgradeDestinationError,
    )


# Each public name and the private module that defines it.
_HOMES: dict[str, str] = {
    "CheckpointCallback": "_callback",
    **dict.fromkeys((
        "CheckpointCorruptError", "CheckpointDtypeMismatchError", "CheckpointNotFoundError",
        "CheckpointStoreClosedError", "CheckpointStoreNotADirectoryError",
        "CheckpointStoreNotFoundError", "CheckpointWaitTimeoutError", "DtypeMismatch",
        "UnsupportedCheckpointError",
    ), "_read_errors"),
    **dict.fromkeys((
        "BestMetricNotRecordedError", "CheckpointLeafNameCollisionError", "CheckpointLockedError",
        "CheckpointNotWrittenError", "CheckpointStoreReadOnlyError", "CheckpointStoreRemovedError",
        "CheckpointStoreSupersededError", "CheckpointWriteError", "DistributedNotInitializedError",
        "NotWrittenReason", "UpgradeDestinationError",
    ), "_write_errors"),
    "quiet_orbax_notices": "_logging",
    **dict.fromkeys((
        "CURRENT_FORMAT_VERSION", "FORMAT_NAME", "ITEM_NAMES", "LIBRARY_NAMES",
        "RESERVED_METADATA_KEYS", "CheckpointMetadata", "Producer", "check_extra",
        "library_versions",
    ), "_metadata"),
    "resolve_checkpoint_dir": "_paths",
    "PreemptionHandler": "_preemption",
    **dict.fromkeys(("Checkpoint", "CheckpointStore"), "_protocol"),
    "RetentionPolicy": "_retention",
    **dict.fromkeys(("OrbaxCheckpointStore", "upgrade_checkpoints"), "_store"),
}  # fmt: skip

__all__ = [
    "CURRENT_FORMAT_VERSION",
    "FORMAT_NAME",
    "ITEM_NAMES",
    "LIBRARY_NAMES",
    "RESERVED_METADATA_KEYS",
    "BestMetricNotRecordedError",
    "Checkpoint",
    "CheckpointCallback",
    "CheckpointCorruptError",
    "CheckpointDtypeMismatchError",
    "CheckpointLeafNameCollisionError",
    "CheckpointLockedError",
    "CheckpointMetadata",
    "CheckpointNotFoundError",
    "CheckpointNotWrittenError",
    "CheckpointStore",
    "CheckpointStoreClosedError",
    "CheckpointStoreNotADirectoryError",
    "CheckpointStoreNotFoundError",
    "CheckpointStoreReadOnlyError",
    "CheckpointStoreRemovedError",
    "CheckpointStoreSupersededError",
    "CheckpointWaitTimeoutError",
    "CheckpointWriteError",
    "DistributedNotInitializedError",
    "DtypeMismatch",
    "Mode",
    "NotWrittenReason",
    "OrbaxCheckpointStore",
    "PreemptionHandler",
    "Producer",
    "RetentionPolicy",
    "UnsupportedCheckpointError",
    "UpgradeDestinationError",
    "check_extra",
    "library_versions",
    "quiet_orbax_notices",
    "resolve_checkpoint_dir",
    "upgrade_checkpoints",
]


# Each name is loaded from its module on first use (PEP 562), then kept here.
lazy_exports(__name__, _HOMES, __all__)
