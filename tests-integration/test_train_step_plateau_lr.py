"""A learning rate lowered by ReduceLROnPlateauCallback reaches a TrainStep's compiled step.

Both wirings of the callback: ``trainer=step`` (it reads ``step.optimizer``) and
``optimizer=step.optimizer`` (it keeps the object). The step must pick the new rate up before
its next call, without a recompile, so the parameter update per step halves.
"""

import numpy as np
import optax
import pytest
from flax import nnx

from substrax.callbacks import ReduceLROnPlateauCallback
from substrax.mesh import create_device_mesh
from substrax.spmd import TrainStep, create_data_parallel_sharding
from substrax.testing import expect_compiles


def linear_loss(model, batch):
    return model(batch["x"]).sum()  # a gradient that does not depend on the parameters


@pytest.mark.parametrize("wiring", ["trainer", "optimizer"])
def test_a_plateau_halves_the_update_per_step_without_a_recompile(wiring):
    mesh = create_device_mesh({"data": 8})
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
    step = TrainStep(
        model,
        nnx.Optimizer(model, tx, wrt=nnx.Param),
        linear_loss,
        mesh=mesh,
        batch_sharding=create_data_parallel_sharding(mesh),
    )
    kwargs = {"optimizer": step.optimizer} if wiring == "optimizer" else {}
    callback = ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1, **kwargs)
    trainer = step if wiring == "trainer" else None
    batch = {"x": np.ones((8, 4), np.float32)}

    def kernel():
        return np.asarray(step.model.kernel.get_value())

    with expect_compiles(1):
        kernels = [kernel()]
        for epoch in range(4):
            for _ in range(2):
                step(batch)
                kernels.append(kernel())
            callback.on_epoch_end(trainer, epoch, {"loss": 1.0})  # no improvement after epoch 0
    updates = -np.diff([k[0, 0] for k in kernels])
    # 8 rows of ones: each step moves the kernel by 8 * learning rate
    np.testing.assert_allclose(updates, [0.8, 0.8, 0.8, 0.8, 0.4, 0.4, 0.2, 0.2], rtol=1e-5)
    assert callback.scale == 0.125
    lr = step.optimizer.opt_state.hyperparams["learning_rate"].get_value()
    np.testing.assert_allclose(float(lr), 0.0125)


@pytest.mark.parametrize("layout", ["chain", "switch_at"])
def test_a_plateau_reaches_an_injected_rate_inside_a_chain_or_a_switch(layout):
    """Second-pass finding: the callback rebuilt every tuple of the state, so the TrainStep
    refused optimizer.opt_state as replaced (StateChangedError) at its next call."""
    from substrax.optim import switch_at

    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    sgd = optax.inject_hyperparams(optax.sgd)
    tx = (
        optax.chain(optax.clip_by_global_norm(100.0), sgd(learning_rate=0.1))
        if layout == "chain"
        else switch_at(sgd(learning_rate=0.1), sgd(learning_rate=0.1), step=100)
    )
    step = TrainStep(model, nnx.Optimizer(model, tx, wrt=nnx.Param), linear_loss)
    callback = ReduceLROnPlateauCallback(monitor="loss", factor=0.5, patience=1)
    batch = {"x": np.ones((8, 4), np.float32)}
    kernels = [np.asarray(step.model.kernel.get_value())]
    for epoch in range(3):
        step(batch)
        kernels.append(np.asarray(step.model.kernel.get_value()))
        callback.on_epoch_end(step, epoch, {"loss": 1.0})
    updates = -np.diff([k[0, 0] for k in kernels])
    np.testing.assert_allclose(updates, [0.8, 0.8, 0.4], rtol=1e-5)
