"""Every public error of substrax.checkpoint shows its public module and keeps its builtin base."""

import inspect
from pathlib import Path

import pytest

import substrax.checkpoint
from substrax.checkpoint import (
    CheckpointStoreClosedError,
    CheckpointStoreReadOnlyError,
    DistributedNotInitializedError,
    OrbaxCheckpointStore,
    UpgradeDestinationError,
)


PUBLIC = [
    value
    for name in substrax.checkpoint.__all__
    if inspect.isclass(value := getattr(substrax.checkpoint, name))
    and (issubclass(value, BaseException) or name in ("DtypeMismatch", "NotWrittenReason"))
]


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda cls: cls.__name__)
def test_a_public_error_shows_its_public_module(cls):
    assert cls.__module__ == "substrax.checkpoint"
    assert getattr(substrax.checkpoint, cls.__name__) is cls


def test_the_new_errors_subclass_the_builtins_they_replace():
    assert issubclass(CheckpointStoreClosedError, RuntimeError)
    assert issubclass(CheckpointStoreReadOnlyError, PermissionError)
    assert issubclass(DistributedNotInitializedError, RuntimeError)
    assert issubclass(UpgradeDestinationError, ValueError)
    error = DistributedNotInitializedError(process_count=4, needed_by="the PreemptionHandler")
    assert (error.process_count, error.needed_by) == (4, "the PreemptionHandler")
    assert "jax.distributed.initialize()" in str(error)
    refused = UpgradeDestinationError(destination=Path("/a"), reason="is the source")
    assert (refused.destination, refused.reason) == (Path("/a"), "is the source")


def test_a_closed_store_says_so(store_dir):
    store = OrbaxCheckpointStore(store_dir)
    store.close()
    for call in (store.list_steps, lambda: store.restore(0), lambda: store.delete(0)):
        with pytest.raises(CheckpointStoreClosedError, match="is closed") as error:
            call()
        assert error.value.directory == store.directory
