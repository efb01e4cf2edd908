import sys

import numpy as np
import pytest
from flax import nnx

from substrax.checkpoint import CheckpointCallback, OrbaxCheckpointStore
from substrax.support import MissingExtraError


class Trainer:
    def __init__(self):
        self.model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))


HOOKS = (
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_batch_begin",
    "on_batch_end",
    "on_validation_begin",
    "on_validation_end",
)


def _run(callback, trainer, epochs, batches):
    callback.on_train_begin(trainer)
    for epoch in range(epochs):
        callback.on_epoch_begin(trainer, epoch)
        for batch in range(batches):
            callback.on_batch_begin(trainer, batch)
            callback.on_batch_end(trainer, batch, {"loss": 1.0 / (batch + 1)})
        callback.on_validation_begin(trainer)
        callback.on_validation_end(trainer, {"val_loss": 0.5})
        callback.on_epoch_end(trainer, epoch, {"val_loss": 1.0 / (epoch + 1), "note": "x"})
    callback.on_train_end(trainer)


def test_callback_has_every_hook():
    assert all(callable(getattr(CheckpointCallback, hook)) for hook in HOOKS)


def test_saves_every_n_epochs_with_monitored_metrics(store_dir):
    trainer = Trainer()
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(store, every_n_epochs=2, monitor=["val_loss"])
        _run(callback, trainer, epochs=4, batches=3)
        assert store.list_steps() == [6, 12]
        record = store.read_metadata(12)
        assert (record.epoch, record.metrics) == (3, {"val_loss": 0.25})
        restored = store.restore(12, templates={"model": nnx.state(trainer.model)})
        assert isinstance(restored.items["model"], nnx.State)


def test_saves_every_n_steps_and_resumes(store_dir):
    trainer = Trainer()
    with OrbaxCheckpointStore(store_dir, max_to_keep=None) as store:
        callback = CheckpointCallback(
            store,
            items=lambda t: {"model": nnx.state(t.model), "data_iterator": {"pos": 1}},
            every_n_epochs=None,
            every_n_steps=2,
        )
        _run(callback, trainer, epochs=1, batches=5)
        assert store.list_steps() == [2, 4]
        assert store.read_metadata(4).metrics == {"loss": 0.25}
        resumed = CheckpointCallback(store, every_n_epochs=1)
        _run(resumed, trainer, epochs=1, batches=1)
        assert store.list_steps() == [2, 4, 5]


def test_callback_validation(store_dir):
    with pytest.raises(ValueError, match="every_n_steps"):
        CheckpointCallback(OrbaxCheckpointStore(store_dir), every_n_steps=0)
    assert np.isfinite(1.0)


def test_saving_the_model_without_flax_names_the_extra(store_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "flax.nnx", None)  # flax.nnx cannot be imported
    with OrbaxCheckpointStore(store_dir) as store:
        callback = CheckpointCallback(store)
        with pytest.raises(MissingExtraError, match=r"substrax-runtime\[nnx\]") as error:
            callback.on_epoch_end(Trainer(), 0, {"loss": 1.0})
        assert "pass items=" in str(error.value)
        assert store.list_steps() == []
