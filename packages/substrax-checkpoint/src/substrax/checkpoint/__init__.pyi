# The public names of substrax.checkpoint, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from substrax.support import Mode as Mode

from ._callback import CheckpointCallback as CheckpointCallback
from ._extra import RESERVED_METADATA_KEYS as RESERVED_METADATA_KEYS, check_extra as check_extra
from ._logging import quiet_orbax_notices as quiet_orbax_notices
from ._metadata import (
    CURRENT_FORMAT_VERSION as CURRENT_FORMAT_VERSION,
    FORMAT_NAME as FORMAT_NAME,
    ITEM_NAMES as ITEM_NAMES,
    LIBRARY_NAMES as LIBRARY_NAMES,
    CheckpointMetadata as CheckpointMetadata,
    Producer as Producer,
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
from ._store import OrbaxCheckpointStore as OrbaxCheckpointStore
from ._upgrade import upgrade_checkpoints as upgrade_checkpoints
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
