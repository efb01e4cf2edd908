"""TrainStep's flat state: what it reads back, what it differentiates, buffers of their own."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.mesh import create_device_mesh
from substrax.spmd import TrainStep, spmd_train_step


X = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
Y = np.random.default_rng(1).normal(size=(8, 2)).astype(np.float32)


def squares(model, batch):
    return jnp.mean(model(batch) ** 2)


# --- a Variable holding several arrays ------------------------------------------------------


class WithPair(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((4, 2)))
        self.extra = nnx.Variable((jnp.zeros(()), jnp.zeros((2,))))

    def __call__(self, x):
        return x @ self.w[...] + self.extra.get_value()[1]


@pytest.mark.parametrize("how", ["set_value", "nnx.update"])
def test_a_restore_is_read_back_when_a_variable_holds_several_arrays(how):
    """Hostile finding: one Variable holding a pytree turned read-back off for the whole model,
    so a restore was ignored by the next step and then overwritten by the step's state."""
    model = WithPair()
    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), squares)
    step(X)
    step(X)
    pair = (jnp.asarray(1.0), jnp.asarray([2.0, 3.0]))
    if how == "set_value":
        model.w.set_value(jnp.zeros((4, 2)))
        model.extra.set_value(pair)
    else:
        nnx.update(model, {"w": jnp.zeros((4, 2)), "extra": pair})
    assert float(step(X)) == pytest.approx((4 + 9) / 2)  # the restored weights, not the old
    np.testing.assert_array_equal(np.asarray(step.model.extra.get_value()[1]), [2.0, 3.0])
    assert float(step.model.extra.get_value()[0]) == 1.0
    assert not np.allclose(np.asarray(step.model.w.get_value()), 0.0)  # trained on from zeros


def test_a_variable_set_to_another_structure_or_shape_is_refused_by_name():
    model = WithPair()
    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), squares)
    model.extra.set_value((jnp.zeros(()),) * 3)
    with pytest.raises(ValueError, match=r"model\['extra'\] was set to a value of structure"):
        step(X)
    model.extra.set_value((jnp.zeros(()), jnp.zeros((3,))))
    with pytest.raises(ValueError, match=r"model\['extra'\]\[1\] was set to shape \(3,\).*\(2,\)"):
        step(X)


# --- two Variables sharing one array ---------------------------------------------------------


class Shared(nnx.Module):
    def __init__(self, copy: bool = False):
        z = jnp.ones((4, 2))
        self.a = nnx.Param(z)
        self.b = nnx.Param(jnp.array(z) if copy else z)

    def __call__(self, x):
        return x @ self.a[...] + 2 * (x @ self.b[...])


def _reference_losses(steps: int) -> list[float]:
    model = Shared(copy=True)
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    step = nnx.jit(lambda m, o, b: spmd_train_step(m, o, squares, b))
    return [float(step(model, optimizer, X)) for _ in range(steps)]


@pytest.mark.parametrize("on_mesh", [False, True], ids=["one-device", "mesh"])
def test_variables_sharing_one_array_train_and_the_next_step_still_runs(on_mesh):
    """Hostile finding: the donating step was handed one buffer twice and XLA refused it; on
    the 8-device mesh the next TrainStep in the process then hung."""
    mesh = create_device_mesh({"data": 8}) if on_mesh else None
    model = Shared()
    step = TrainStep(model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param), squares, mesh=mesh)
    np.testing.assert_allclose([float(step(X)) for _ in range(2)], _reference_losses(2), rtol=1e-6)
    # a restore that sets two variables to one array is taken as two buffers too
    step.model.b.set_value(step.model.a.get_value())
    a = np.asarray(step.model.a.get_value())
    expected = float(np.mean((X @ a * 3) ** 2))
    assert float(step(X)) == pytest.approx(expected, rel=1e-5)
    other = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
    after = TrainStep(
        other, nnx.Optimizer(other, optax.sgd(0.1), wrt=nnx.Param), squares, mesh=mesh
    )
    assert np.isfinite(float(after(X)))


# --- what the optimizer updates is what is differentiated ------------------------------------


class Trainable(nnx.Variable):
    pass


class Mixed(nnx.Module):
    def __init__(self):
        self.w = Trainable(jnp.full((4, 2), 0.5))
        self.b = nnx.Param(jnp.full((2,), 0.25))

    def __call__(self, x):
        return x @ self.w[...] + self.b[...]


def _optax_reference(names: tuple[str, ...], steps: int) -> tuple[list[float], dict]:
    """The same training in plain jax and optax: only ``names`` are trained."""
    params = {"w": jnp.full((4, 2), 0.5), "b": jnp.full((2,), 0.25)}

    def loss(trained, frozen):
        p = {**frozen, **trained}
        return jnp.mean((X @ p["w"] + p["b"] - Y) ** 2)

    tx = optax.adam(1e-2)
    trained = {k: params[k] for k in names}
    frozen = {k: v for k, v in params.items() if k not in names}
    opt_state = tx.init(trained)
    losses = []
    for _ in range(steps):
        value, grads = jax.value_and_grad(loss)(trained, frozen)
        updates, opt_state = tx.update(grads, opt_state, trained)
        trained = optax.apply_updates(trained, updates)
        losses.append(float(value))
    return losses, {**frozen, **trained}


WRT = [
    pytest.param(Trainable, ("w",), id="custom-type"),
    pytest.param(nnx.Any(nnx.Param, Trainable), ("w", "b"), id="any"),
    pytest.param(nnx.Param, ("b",), id="param"),
]


def _mse(model, batch):
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)


@pytest.mark.parametrize(("wrt", "names"), WRT)
@pytest.mark.parametrize("path", ["TrainStep", "spmd_train_step"])
def test_the_step_differentiates_what_the_optimizer_updates(wrt, names, path):
    """Hostile finding: the plain step differentiated nnx.Param whatever ``wrt`` was, and a
    custom Variable type failed with a pytree structure error."""
    model = Mixed()
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=wrt)
    batch = {"x": X, "y": Y}
    if path == "TrainStep":
        step = TrainStep(model, optimizer, _mse)
        losses = [float(step(batch)) for _ in range(3)]
        model = step.model
    else:
        jitted = nnx.jit(lambda m, o, b: spmd_train_step(m, o, _mse, b))
        losses = [float(jitted(model, optimizer, batch)) for _ in range(3)]
    expected, params = _optax_reference(names, 3)
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(model.w.get_value()), params["w"], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(model.b.get_value()), params["b"], rtol=1e-6)
