"""Gradient checks on the simplest float32 modules, against closed-form gradients.

0.1.22 users reported ``check_parameter_gradients`` and ``check_input_gradients`` failing with
"Cannot lower jaxpr ... broadcast_in_dim" on a plain float32 module with ``w`` and ``b``
parameters. These tests run the checks on such modules, each way the report could have arisen
(Variables holding ``jax.Ref`` values, which failed, scalar and one-element parameters, a jitted loss, parameters broadcast from a Python float,
a module rebuilt by split/merge, sharding metadata, x64 on for the whole process), and check
the returned gradients against the closed forms.
"""

import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from substrax.testing import (
    GradientMismatchError,
    check_input_gradients,
    check_parameter_gradients,
    run_python,
)


A = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, -0.25], [0.0, -0.25, 3.0], [1.0, 1.0, 1.0]], np.float32)
Y = np.array([1.0, -1.0, 0.5, 2.0], np.float32)
X = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)


class Affine(nnx.Module):
    """``x @ w + b`` with raw float32 ``nnx.Param`` arrays."""

    def __init__(self, w=None, b=None):
        w = np.arange(6.0).reshape(3, 2) / 10 if w is None else w
        self.w = nnx.Param(jnp.asarray(w, jnp.float32))
        self.b = nnx.Param(jnp.asarray(np.array([0.5, -0.5]) if b is None else b, jnp.float32))

    def __call__(self, x):
        return x @ self.w[...] + self.b[...]


class Scale(nnx.Module):
    """``s * x + c`` with parameters of shape ``shape`` (``()`` or ``(1,)``)."""

    def __init__(self, shape=()):
        self.s = nnx.Param(jnp.full(shape, 1.5, jnp.float32))
        self.c = nnx.Param(jnp.broadcast_to(0.25, shape))  # a Python float, broadcast

    def __call__(self, x):
        return self.s[...] * x + self.c[...]


class LeastSquares(nnx.Module):
    """``sum((A w - y)^2)``, whose gradient is ``2 A^T (A w - y)``."""

    def __init__(self, square=jnp.square):
        self.w = nnx.Param(jnp.array([0.5, -1.0, 2.0], jnp.float32))
        self.square = square

    def __call__(self):
        return jnp.sum(self.square(A @ self.w[...] - Y))


def _sum_of_squares(m, x=X):
    return jnp.sum(jnp.square(m(x)))


def _affine_closed_form(model):
    w, b = (np.asarray(model.w[...], np.float64), np.asarray(model.b[...], np.float64))
    xs = np.asarray(X, np.float64)
    residual = xs @ w + b  # loss = sum(r^2): dw = 2 x^T r, db = 2 sum_rows r, dx = 2 r w^T
    return {"w": 2 * xs.T @ residual, "b": 2 * residual.sum(0)}, 2 * residual @ w.T


def _assert_affine(model):
    expected, expected_x = _affine_closed_form(model)
    grads = check_parameter_gradients(model, _sum_of_squares)
    for name, value in expected.items():
        assert grads[name][...].dtype == jnp.float32
        np.testing.assert_allclose(grads[name][...], value, rtol=1e-5, atol=1e-5)
    grad_x = check_input_gradients(model, _sum_of_squares, jnp.asarray(X))
    np.testing.assert_allclose(grad_x, expected_x, rtol=1e-5, atol=1e-5)


def test_a_float32_module_with_w_and_b_has_its_closed_form_gradients():
    _assert_affine(Affine())


def test_nnx_linear_has_its_closed_form_gradients():
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    expected, expected_x = _affine_closed_form(Affine(model.kernel[...], model.bias[...]))
    grads = check_parameter_gradients(model, _sum_of_squares)
    np.testing.assert_allclose(grads["kernel"][...], expected["w"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["bias"][...], expected["b"], rtol=1e-5, atol=1e-5)
    grad_x = check_input_gradients(model, _sum_of_squares, jnp.asarray(X))
    np.testing.assert_allclose(grad_x, expected_x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["ref", "hijax"])
def test_variables_holding_jax_refs_or_hijax_values(kind):
    with nnx.var_defaults(**{kind: True}):  # flax's own switches: Variables made this way
        model, linear = Affine(), nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    before = jax.tree.map(lambda x: np.array(x[...]), (nnx.state(model), nnx.state(linear)))
    _assert_affine(model)
    expected, _ = _affine_closed_form(Affine(linear.kernel[...], linear.bias[...]))
    grads = check_parameter_gradients(linear, _sum_of_squares)
    np.testing.assert_allclose(grads["kernel"][...], expected["w"], rtol=1e-5, atol=1e-5)
    if kind == "ref":  # the module keeps its references, with the values they held
        assert isinstance(nnx.state(linear)["kernel"].get_raw_value(), jax.Ref)
    after = jax.tree.map(lambda x: np.array(x[...]), (nnx.state(model), nnx.state(linear)))
    jax.tree.map(np.testing.assert_array_equal, after, before)


@pytest.mark.parametrize("shape", [(), (1,)])
def test_scalar_and_one_element_parameters(shape):
    model, x = Scale(shape), jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)
    residual = 1.5 * np.asarray(x, np.float64) + 0.25  # loss = sum(r^2)
    grads = check_parameter_gradients(model, lambda m: jnp.sum(jnp.square(m(x))))
    assert grads["s"][...].shape == shape
    np.testing.assert_allclose(grads["s"][...], np.full(shape, 2 * (residual * x).sum()), 1e-5)
    np.testing.assert_allclose(grads["c"][...], np.full(shape, 2 * residual.sum()), 1e-5)
    grad_x = check_input_gradients(model, lambda m, v: jnp.sum(jnp.square(m(v))), x)
    np.testing.assert_allclose(grad_x, 2 * 1.5 * residual, rtol=1e-5)


@pytest.mark.parametrize("value", [jnp.float32(2.0), np.float32(2.0), np.array([2.0], np.float32)])
def test_a_scalar_or_numpy_input(value):
    grad = check_input_gradients(Scale(), lambda m, v: jnp.sum(jnp.square(m(v))), value)
    assert grad.shape == np.shape(value)
    np.testing.assert_allclose(grad, np.full(np.shape(value), 2 * 1.5 * (1.5 * 2.0 + 0.25)), 1e-6)


def test_least_squares_has_the_closed_form_gradient_in_both_modes():
    model = LeastSquares()
    w = np.asarray(model.w[...], np.float64)
    expected = 2 * A.astype(np.float64).T @ (A @ w - Y)
    grads = check_parameter_gradients(model, lambda m: m(), modes=("fwd", "rev"))
    np.testing.assert_allclose(grads["w"][...], expected, rtol=1e-6)


@jax.custom_vjp
def wrong_vjp_square(r):
    return r * r


wrong_vjp_square.defvjp(lambda r: (r * r, r), lambda r, g: (3.0 * r * g,))  # true: 2 r g


@jax.custom_vjp
def right_vjp_square(r):
    return r * r


right_vjp_square.defvjp(lambda r: (r * r, r), lambda r, g: (2.0 * r * g,))


wrong_jvp_square = jax.custom_jvp(lambda r: r * r)
wrong_jvp_square.defjvps(lambda t, _, r: 3.0 * r * t)  # true: 2 r t


def test_a_wrong_custom_vjp_fails_naming_the_leaf_and_mode():
    model = LeastSquares(square=wrong_vjp_square)
    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(model, lambda m: m(), modes=("rev",))
    worst = info.value.worst
    assert (worst.path, worst.mode, worst.dtype) == ("w", "rev", "float32")
    assert (worst.index, worst.checked, worst.failing) == ((2,), 3, 3)
    w = np.asarray(model.w[...], np.float64)
    expected = 2 * A.astype(np.float64).T @ (A @ w - Y)  # the largest is w[2]'s
    assert worst.numeric == pytest.approx(expected[2], rel=1e-5)
    assert worst.analytic == pytest.approx(1.5 * worst.numeric, rel=1e-4)  # 3 r against 2 r
    assert worst.max_rel_error == pytest.approx(0.5, rel=1e-4)
    assert "worst leaf w[2] (rev, float32): analytic" in str(info.value)
    assert "3 of 3 checked elements out of tolerance (rtol 0.002, atol 1e-05" in str(info.value)
    assert isinstance(info.value.__cause__, AssertionError)  # check_grads' own, with its numbers
    assert "VJP cotangent projection" in str(info.value.__cause__)


@pytest.mark.parametrize("modes", [("rev", "fwd"), ("fwd", "rev")])
def test_a_wrong_custom_vjp_in_both_modes_reports_the_rev_mismatch(modes):
    # fwd refuses a custom_vjp: the mismatch rev found is raised, the refusal noted
    model = LeastSquares(square=wrong_vjp_square)
    with pytest.raises(GradientMismatchError, match=r"worst leaf w\[2\] \(rev") as info:
        check_parameter_gradients(model, lambda m: m(), modes=modes)
    (note,) = info.value.__notes__
    assert note.startswith("check_parameter_gradients: not checked in fwd mode: w: forward mode")


def test_a_correct_custom_vjp_in_fwd_mode_is_refused():
    model = LeastSquares(square=right_vjp_square)
    assert check_parameter_gradients(model, lambda m: m(), modes=("rev",))
    with pytest.raises(TypeError, match=r"w: forward mode .* modes=\('rev',\)"):
        check_parameter_gradients(model, lambda m: m())


def test_a_wrong_custom_jvp_fails_in_both_modes():
    model = LeastSquares(square=wrong_jvp_square)
    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(model, lambda m: m())
    assert {(leaf.path, leaf.mode) for leaf in info.value.leaves if leaf.failing} == {
        ("w", "rev"),
        ("w", "fwd"),
    }
    assert info.value.worst.analytic == pytest.approx(1.5 * info.value.worst.numeric, rel=1e-4)


def test_a_wrong_derivative_of_the_input_names_the_input():
    model = Scale((3,))

    def loss(m, v):
        return jnp.sum(wrong_jvp_square(m(v)))

    with pytest.raises(
        GradientMismatchError, match=r"worst leaf input\[2\] \((rev|fwd), float32"
    ) as info:
        check_input_gradients(model, loss, jnp.asarray([0.5, 1.0, 2.0], jnp.float32))
    worst = info.value.worst  # the largest input, the largest error: 3 r s against 2 r s
    assert worst.numeric == pytest.approx(2 * (1.5 * 2.0 + 0.25) * 1.5, rel=1e-5)
    assert worst.analytic == pytest.approx(1.5 * worst.numeric, rel=1e-5)
    assert (worst.checked, worst.failing) == (3, 3)


@pytest.mark.parametrize("wrap", [jax.jit, nnx.jit], ids=["jax.jit", "nnx.jit"])
def test_a_jitted_loss(wrap):
    _assert_affine_with(wrap(_sum_of_squares))


def _assert_affine_with(loss):
    model = Affine()
    expected, _ = _affine_closed_form(model)
    grads = check_parameter_gradients(model, loss)
    np.testing.assert_allclose(grads["w"][...], expected["w"], rtol=1e-5, atol=1e-5)


def test_a_module_rebuilt_by_split_and_merge():
    graphdef, state = nnx.split(Affine())
    _assert_affine(nnx.merge(graphdef, state))


def test_parameters_with_sharding_metadata_in_a_mesh():
    mesh = jax.make_mesh((1,), ("model",))
    with jax.set_mesh(mesh):
        model = Affine()
        model.w = nnx.Param(model.w[...], out_sharding=(None, "model"))
        model.b = nnx.Param(model.b[...], out_sharding=("model",))
        _assert_affine(model)


@pytest.mark.x64
def test_float32_modules_under_x64():  # the marker: inside jax.enable_x64(True)
    _assert_affine(Affine())
    test_scalar_and_one_element_parameters(())
    test_least_squares_has_the_closed_form_gradient_in_both_modes()


class Normalized(nnx.Module):
    """A linear layer and a batch norm in training mode: the loss updates float32 statistics."""

    def __init__(self):
        self.linear = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        self.norm = nnx.BatchNorm(2, rngs=nnx.Rngs(1))

    def __call__(self, x):
        return self.norm(self.linear(x))


def test_a_module_with_batch_statistics_is_checked_without_a_warning():
    # the float64 reference wrote its statistics into float32 ones: jax's FutureWarning, an error
    # under the suite's filterwarnings = error (a future jax refuses it)
    model = Normalized()
    mean = model.norm.mean[...]
    grads = check_parameter_gradients(model, lambda m: jnp.tanh(m(X)).sum(), modes=("rev",))
    assert grads["linear"]["kernel"][...].dtype == jnp.float32
    assert model.norm.mean[...].dtype == jnp.float32
    np.testing.assert_array_equal(model.norm.mean[...], mean)  # the model is left as it was


def test_float32_modules_under_strict_dtype_promotion():
    # the float64 reference meets float32 data the loss closes over (X, A, Y): strict refuses it
    with jax.numpy_dtype_promotion("strict"):
        _assert_affine(Affine())
        test_least_squares_has_the_closed_form_gradient_in_both_modes()
    assert jax.config.jax_numpy_dtype_promotion == "standard"


@pytest.mark.usefixtures("child_processes")
def test_float32_modules_with_x64_switched_on_for_the_process():
    program = textwrap.dedent(
        """
        import jax
        jax.config.update("jax_enable_x64", True)
        import test_testing_gradients_simple as cases
        from substrax.testing import GradientMismatchError
        cases.test_a_float32_module_with_w_and_b_has_its_closed_form_gradients()
        cases.test_nnx_linear_has_its_closed_form_gradients()
        cases.test_scalar_and_one_element_parameters(())
        cases.test_scalar_and_one_element_parameters((1,))
        cases.test_least_squares_has_the_closed_form_gradient_in_both_modes()
        cases.test_a_wrong_custom_jvp_fails_in_both_modes()
        print("ok")
        """
    )
    env = {"PYTHONPATH": str(Path(__file__).parent)}
    result = run_python(program, timeout=300, env=env).check()
    assert result.stdout.strip().endswith("ok")
