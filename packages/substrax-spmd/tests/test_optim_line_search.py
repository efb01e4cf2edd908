import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from substrax.optim import LineSearchStateError, update_with_line_search, with_strong_state_types


X = jnp.asarray(np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32))
Y = X @ jnp.array([[1.0], [-2.0], [0.5]]) + 0.3


def loss(model):
    return ((model(X) - Y) ** 2).mean()


def _reference(steps):
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    pure = nnx.as_pure(params)

    def value_fn(p):
        candidate = nnx.merge(graphdef, params, copy=True)
        nnx.update(candidate, p)
        return loss(candidate)

    solver = optax.lbfgs()
    state = solver.init(pure)
    value_and_grad = optax.value_and_grad_from_state(value_fn)

    @jax.jit
    def step(pure, state):
        value, grad = value_and_grad(pure, state=state)
        updates, state = solver.update(grad, state, pure, value=value, grad=grad, value_fn=value_fn)
        return optax.apply_updates(pure, updates), state, value

    values = []
    for _ in range(steps):
        pure, state, value = step(pure, state)
        values.append(float(value))
    return values, pure


@pytest.fixture(scope="module")
def reference():
    """optax.lbfgs's own loop: its 4 steps' losses and the parameters after them.

    Run (and compiled) once for the module; the tests only read it.
    """
    return _reference(4)


def test_matches_optax_lbfgs_loop(reference):
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, with_strong_state_types(optax.lbfgs()), wrt=nnx.Param)
    step = nnx.jit(lambda m, o: update_with_line_search(m, o, loss, objective_changed=False))
    values = [float(step(model, optimizer)) for _ in range(4)]
    expected_values, expected = reference
    np.testing.assert_allclose(values, expected_values, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(model.kernel.get_value()), np.asarray(expected["kernel"]), rtol=1e-4, atol=1e-6
    )
    assert values[-1] < 0.1 * values[0]


def test_traced_objective_changed_flag(reference):
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, with_strong_state_types(optax.lbfgs()), wrt=nnx.Param)
    step = nnx.jit(
        lambda m, o, changed: update_with_line_search(m, o, loss, objective_changed=changed)
    )
    values = [float(step(model, optimizer, jnp.asarray(i == 0))) for i in range(3)]
    np.testing.assert_allclose(values, reference[0][:3], rtol=1e-5)


def test_weakly_typed_state_is_refused():
    def init(params):
        return {"scale": jnp.asarray(1.0)}  # weakly typed

    tx = optax.GradientTransformationExtraArgs(init, lambda u, s, _p=None, **_: (u, s))
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    with pytest.raises(LineSearchStateError, match="weakly typed leaves") as info:
        update_with_line_search(model, optimizer, loss)
    assert info.value.paths == ("['scale']",)


def test_mixed_parameter_dtypes_are_refused():
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    model.bias = nnx.Param(jnp.zeros((1,), jnp.bfloat16))
    optimizer = nnx.Optimizer(model, with_strong_state_types(optax.lbfgs()), wrt=nnx.Param)
    with pytest.raises(
        LineSearchStateError, match=r"mix floating dtypes \['bfloat16', 'float32'\]"
    ):
        update_with_line_search(model, optimizer, lambda m: jnp.sum(m.kernel.get_value()))
    assert jax.device_count() == 8


@pytest.mark.x64
def test_a_float64_loss_over_float32_parameters(reference):
    assert jnp.zeros(()).dtype == jnp.float64  # x64 is on in this test

    def loss64(model):
        return ((model(X) - Y) ** 2).astype(jnp.float64).mean()

    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    assert model.kernel.get_value().dtype == jnp.float32
    optimizer = nnx.Optimizer(model, with_strong_state_types(optax.lbfgs()), wrt=nnx.Param)
    traces = []

    def body(model, optimizer):
        traces.append(None)
        return update_with_line_search(model, optimizer, loss64, objective_changed=False)

    step = nnx.jit(body)
    values = [step(model, optimizer) for _ in range(4)]
    assert {value.dtype for value in values} == {jnp.dtype(jnp.float32)}
    assert len(traces) == 1, "the state's types changed between steps"
    assert model.kernel.get_value().dtype == jnp.float32
    np.testing.assert_allclose([float(v) for v in values], reference[0], rtol=1e-4)
