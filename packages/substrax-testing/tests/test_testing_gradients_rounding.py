"""Gradient checks of a loss much larger than its gradient: the central difference's rounding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from substrax.testing import GradientMismatchError, ZeroGradientError, check_parameter_gradients
from substrax.testing._gradient_records import ROUNDING_FACTOR, rounding_allowance


class Raw(nnx.Module):
    def __init__(self, dtype, scale=1.0):
        self.w = nnx.Param(scale * jnp.linspace(-1, 1, 6, dtype=dtype))
        self.b = nnx.Param(jnp.linspace(0.5, 2, 6, dtype=dtype))


def off_by(factor):
    """``sum(w * w)`` whose derivative is ``factor`` times the true one."""
    square = jax.custom_jvp(lambda w: jnp.sum(w * w))
    square.defjvps(lambda t, _, w: jnp.sum(factor * 2 * w * t))
    return square


def test_the_allowance_is_eps_times_the_loss_over_the_step():
    allowed = rounding_allowance(2.0**-52, np.array([1e6, -2.0]), np.array([1e-6, 1e-3]))
    expected = ROUNDING_FACTOR * 2.0**-52 * np.array([1e12, 2e3])
    np.testing.assert_allclose(allowed, expected)


@pytest.mark.x64
def test_a_correct_float64_gradient_of_a_large_loss_passes():
    # the difference of two losses near 1e6 is rounded by ~1e-10 / 2e-6: more than rtol 1e-6
    model = Raw(jnp.float64)
    grads = check_parameter_gradients(model, lambda m: 1e6 + jnp.sum(m.w[...] * m.b[...]))
    np.testing.assert_allclose(grads["w"][...], model.b[...])
    np.testing.assert_allclose(grads["b"][...], model.w[...])


@pytest.mark.x64
def test_a_float64_gradient_wrong_by_one_percent_still_fails():
    model = Raw(jnp.float64)
    square = off_by(1.01)
    with pytest.raises(GradientMismatchError, match=r"worst leaf w\[\d\] \(rev, float64\)"):
        check_parameter_gradients(model, lambda m: 10.0 + square(m.w[...]) + jnp.sum(m.b[...]))
    with pytest.raises(GradientMismatchError, match=r"worst leaf w\[\d\] \(rev, float64\)"):
        # even beside 1e6: the rounding allowed is ~2e-3, 1% of w's gradient 2 w is more
        check_parameter_gradients(model, lambda m: 1e6 + square(m.w[...]) + jnp.sum(m.b[...]))


@pytest.mark.x64
def test_the_wrong_leaf_is_named_not_a_correct_one_beside_a_large_loss():
    # w ~ 1e4: the loss ~ 1e8; b's derivative (1) is exact, w's off by 1%
    model = Raw(jnp.float64, scale=1e4)
    square = off_by(1.01)
    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(model, lambda m: square(m.w[...]) + jnp.sum(m.b[...]))
    assert info.value.worst.path == "w"
    assert {leaf.path for leaf in info.value.leaves if leaf.failing} == {"w"}


def scaled_dot(factor):
    """``sum(w * b)`` whose derivative in ``w`` is ``factor`` times the true one (``b``)."""
    dot = jax.custom_vjp(lambda w, b: jnp.sum(w * b))
    dot.defvjp(lambda w, b: (dot(w, b), (w, b)), lambda r, c: (c * r[1] * factor, c * r[0]))
    return dot


class Weights(nnx.Module):
    def __init__(self, dtype):
        self.w = nnx.Param(jnp.linspace(0.5, 1.5, 8, dtype=dtype))


@pytest.mark.x64
@pytest.mark.parametrize(("factor", "offset"), [(2.0, 1e10), (1.1, 1e9), (1.0, 1e10)])
def test_a_gradient_within_the_rounding_of_a_large_loss_is_refused_as_proving_nothing(
    factor, offset
):
    """Hostile finding: a float64 gradient twice too large passed beside a loss of 1e10."""
    b, dot = jnp.linspace(1, 2, 8, dtype=jnp.float64), scaled_dot(factor)
    with pytest.raises(ZeroGradientError, match=r"subtract the loss's constant") as info:
        check_parameter_gradients(
            Weights(jnp.float64), lambda m: offset + dot(m.w[...], b), modes=("rev",), samples=8
        )
    error = info.value
    assert error.where == "w[7]"
    assert error.loss == pytest.approx(offset + 12.857, rel=1e-12)
    assert error.rounding > 0.1 * error.largest
    assert f"the largest, {error.largest:.3g} at w[7]" in str(error)
    if factor != 1.0:  # centered, the same gradient is caught
        with pytest.raises(GradientMismatchError, match=r"worst leaf w\["):
            check_parameter_gradients(
                Weights(jnp.float64), lambda m: dot(m.w[...], b), modes=("rev",), samples=8
            )


def test_a_float32_gradient_within_the_rounding_of_a_large_loss_is_refused():
    b, dot = jnp.linspace(1, 2, 8), scaled_dot(2.0)
    with pytest.raises(ZeroGradientError, match=r"too small beside the loss \(1e\+13\)"):
        check_parameter_gradients(
            Weights(jnp.float32), lambda m: 1e13 + dot(m.w[...], b), modes=("rev",)
        )
    grads = check_parameter_gradients(  # allow_zero accepts it, as for a gradient under atol
        Weights(jnp.float32), lambda m: 1e13 + dot(m.w[...], b), modes=("rev",), allow_zero=True
    )
    assert grads["w"][...].shape == (8,)
