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

from substrax.support import lazy_exports, moved_modules


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read);
# each loads from its module on first use (PEP 562), then is kept here.
lazy_exports(__name__)

# substrax 0.1.22's module path for the metadata record's names; importing it warns once.
moved_modules(
    {
        "substrax.checkpoint.metadata": {
            "substrax.checkpoint": [
                "CURRENT_FORMAT_VERSION",
                "FORMAT_NAME",
                "LIBRARY_NAMES",
                "RESERVED_METADATA_KEYS",
                "CheckpointMetadata",
                "Producer",
                "check_extra",
                "library_versions",
            ]
        }
    }
)
