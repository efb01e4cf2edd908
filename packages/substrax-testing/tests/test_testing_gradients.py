"""Gradient checks on real nnx models: passes, the worst leaf of a wrong gradient, dtypes."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from substrax.testing import (
    GRADIENT_TOLERANCES,
    GradientMismatchError,
    GradientTolerance,
    LeafGradientCheck,
    ZeroGradientError,
    check_input_gradients,
    check_parameter_gradients,
)
from substrax.testing.gradients import (
    check_input_gradients as interface_input,
    check_parameter_gradients as interface_parameters,
)


class Mlp(nnx.Module):
    def __init__(self, *, dtype=jnp.float32, rngs):
        # computing in the parameters' dtype (nnx's default): float64 for the reference
        self.hidden = nnx.Linear(3, 8, param_dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(8, 1, param_dtype=dtype, rngs=rngs)
        # deterministic: a dropout mask drawn under x64 (the reference) differs from float32's
        self.dropout = nnx.Dropout(0.25, deterministic=True, rngs=rngs)

    def __call__(self, x):
        return self.out(self.dropout(jnp.tanh(self.hidden(x))))


wrong_square = jax.custom_jvp(lambda x: x * x)
wrong_square.defjvps(lambda t, _, x: 3.0 * x * t)  # the true derivative is 2x


class Scaled(nnx.Module):
    def __init__(self, *, rngs):
        self.linear = nnx.Linear(3, 2, rngs=rngs)
        self.scale = nnx.Param(jnp.array([0.5, 1.5]))

    def __call__(self, x):
        return self.linear(x) * wrong_square(self.scale[...])


def _inputs(dtype=np.float32):
    return jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)), dtype=dtype)


def test_a_correct_model_passes_in_both_modes_and_is_left_unchanged():
    model, x = Mlp(rngs=nnx.Rngs(0)), _inputs()
    before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    grads = check_parameter_gradients(model, lambda m: (m(x) ** 2).mean())
    expected = nnx.jit(nnx.grad(lambda m: (m(x) ** 2).mean()))(model)
    # the check's own jax.grad call and this one may compile differently: f32 rounding apart
    close = functools.partial(np.testing.assert_allclose, rtol=1e-6)
    jax.tree.map(close, grads, nnx.state(expected, nnx.Param))
    jax.tree.map(np.testing.assert_array_equal, nnx.state(model, nnx.Param), before)
    grad = check_input_gradients(model, lambda m, v: jnp.sin(m(v)).sum(), x)
    assert grad.shape == x.shape
    assert interface_parameters is check_parameter_gradients
    assert interface_input is check_input_gradients


def test_a_wrong_derivative_names_the_worst_leaf():
    model, x = Scaled(rngs=nnx.Rngs(1)), _inputs()
    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(model, lambda m: m(x).sum())
    worst = info.value.worst
    assert (worst.path, worst.dtype) == ("scale", "float32")
    assert worst.index == (1,)  # the larger scale, the larger error
    assert worst.numeric == pytest.approx(2 * 1.5 * float(model.linear(x)[:, 1].sum()), rel=1e-4)
    assert worst.analytic == pytest.approx(1.5 * worst.numeric, rel=1e-4)  # 3 s against 2 s
    assert worst.failing == worst.checked == 2
    assert worst.max_rel_error == pytest.approx(0.5, rel=1e-4)
    assert worst.tolerance == GRADIENT_TOLERANCES["float32"]
    assert {(leaf.path, leaf.mode) for leaf in info.value.leaves if leaf.failing} == {
        ("scale", "rev"),
        ("scale", "fwd"),
    }
    assert {leaf.path for leaf in info.value.leaves} == {"linear/bias", "linear/kernel", "scale"}
    passed = [leaf for leaf in info.value.leaves if not leaf.failing]
    assert all(np.isnan(leaf.analytic) and leaf.index == () for leaf in passed)  # no element
    assert passed[0].describe() == (
        "linear/bias (rev, float32): 2 checked elements within tolerance, each and along a "
        "random direction (rtol 0.002, atol 1e-05, step 0.001)"
    )
    assert passed[0].max_abs_error < 1e-5  # rev compares each element: its errors are known
    forward = next(leaf for leaf in passed if leaf.mode == "fwd")
    assert np.isnan(forward.max_abs_error)  # fwd checks the direction only, when it passes
    assert forward.describe().endswith(
        "within tolerance along a random direction (rtol 0.002, atol 1e-05, step 0.001)"
    )
    message = str(info.value)
    assert "worst leaf scale[1] (" in message
    assert f"scale[1] ({worst.mode}, float32): analytic {worst.analytic:.6g}, numeric" in message
    assert worst.step == pytest.approx(1.5e-3)  # the step used there: 0.001 * |1.5|
    assert (
        "2 of 2 checked elements out of tolerance (rtol 0.002, atol 1e-05, step 0.0015)" in message
    )
    assert "1 other leaf check(s) failed too" in message
    assert isinstance(info.value.__cause__, AssertionError)  # check_grads', with its numbers
    assert "ACTUAL" in str(info.value.__cause__)


MASK = np.zeros((3, 2), np.float32)
MASK[2, 1] = 1.0


wrong_at_one_element = jax.custom_jvp(lambda w: w * w)
wrong_at_one_element.defjvps(lambda t, _, w: (2.0 + MASK) * w * t)  # 3 w, not 2 w, at [2, 1]


class Plain(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.arange(1.0, 7.0, dtype=jnp.float32).reshape(3, 2) / 4)

    def __call__(self):
        return wrong_at_one_element(self.w[...]).sum()


@pytest.mark.parametrize("modes", [("rev",), ("fwd",), ("rev", "fwd")])
def test_a_failure_names_the_one_wrong_element(modes):
    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(Plain(), lambda m: m(), modes=modes)
    info.match(r"worst leaf w\[2, 1\] \((rev|fwd), float32\)")  # as pytest.raises(match=)
    worst = info.value.worst
    assert (worst.index, worst.checked, worst.failing) == ((2, 1), 6, 1)
    assert worst.numeric == pytest.approx(2 * 1.5, rel=1e-5)  # d(w^2)/dw at w = 6/4
    assert worst.analytic == pytest.approx(3 * 1.5, rel=1e-6)
    assert worst.max_abs_error == pytest.approx(1.5, rel=1e-5)
    assert [leaf.failing for leaf in info.value.leaves] == [1] * len(modes)
    assert "1 of 6 checked elements out of tolerance" in str(info.value)
    assert isinstance(info.value.__cause__, AssertionError)


SMALL = jnp.ones(16).at[5].set(0.001)  # loss = sum(SMALL * w): its gradient is SMALL


@jax.custom_vjp
def small_wrong_sign(w):
    return (SMALL * w).sum()


small_wrong_sign.defvjp(
    lambda w: (small_wrong_sign(w), None),
    lambda _, g: (g * SMALL.at[5].set(-0.001),),  # element 5: -0.001, not +0.001
)


class SmallElement(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.linspace(-1.0, 1.0, 16))

    def __call__(self):
        return small_wrong_sign(self.w[...])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rev_mode_compares_each_element_so_a_small_wrong_one_fails(seed):
    # along a random direction the error (0.002) is within rtol of the sum of 16 elements
    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(SmallElement(), lambda m: m(), modes=("rev",), seed=seed)
    worst = info.value.worst
    assert (worst.path, worst.mode, worst.index, worst.failing) == ("w", "rev", (5,), 1)
    assert worst.analytic == pytest.approx(-0.001)
    assert worst.numeric == pytest.approx(0.001, rel=1e-3)
    assert info.value.__cause__ is None  # check_grads passed: the elements failed


def test_a_failure_of_the_direction_alone_says_so():
    """Hostile finding: the message named a worst element within tolerance ("0 of 4 ... out of
    tolerance") without saying that only check_grads' random direction had failed (a BatchNorm
    scale whose gradient is 0 on a symmetric batch, float32's rounding adding up)."""
    leaf = LeafGradientCheck(
        path="layers/1/scale",
        mode="rev",
        dtype="float32",
        index=(3,),
        analytic=-3.3e-6,
        numeric=-1.2e-6,
        max_abs_error=2.1e-6,
        max_rel_error=1.77,
        checked=4,
        failing=0,
    )
    alone = "each element was within tolerance, and only jax's check_grads"
    assert alone in str(GradientMismatchError(leaf, (leaf,)))
    wrong = dataclasses.replace(leaf, failing=1)
    assert alone not in str(GradientMismatchError(wrong, (wrong,)))


def test_the_wrong_leaf_is_left_out_with_a_filter():
    model, x = Scaled(rngs=nnx.Rngs(1)), _inputs()
    only_linear = nnx.All(nnx.Param, nnx.PathContains("linear"))
    grads = check_parameter_gradients(model, lambda m: m(x).sum(), wrt=only_linear)
    assert set(grads) == {"linear"}


def test_an_all_zero_gradient_is_refused_unless_allowed():
    model, x = Mlp(rngs=nnx.Rngs(2)), _inputs()

    def unused(m):
        return (m(x) * 0.0).sum()

    with pytest.raises(ZeroGradientError) as info:
        check_parameter_gradients(model, unused)
    assert (info.value.what, info.value.leaves) == ("parameters", 4)
    grads = check_parameter_gradients(model, unused, allow_zero=True)
    assert all(not np.any(leaf) for leaf in jax.tree.leaves(grads))
    with pytest.raises(ZeroGradientError, match="respect to the input"):
        check_input_gradients(model, lambda m, v: jnp.round(m(v)).sum() * 0.0, x)


def test_gradients_all_below_the_absolute_tolerance_are_refused_as_proving_nothing():
    """Hostile finding: a loss scaled by 1e-7 passed with a wrong sign on its whole gradient."""
    model, x = Mlp(rngs=nnx.Rngs(2)), _inputs()

    @jax.custom_vjp
    def flipped(y):
        return y

    flipped.defvjp(lambda y: (y, None), lambda _, g: (-g,))  # the wrong sign, everywhere

    def tiny(m):
        return 1e-7 * (flipped(m(x)) ** 2).mean()

    with pytest.raises(ZeroGradientError, match="below the absolute tolerance") as info:
        check_parameter_gradients(model, tiny, modes=("rev",))
    assert info.value.largest < info.value.atol == GRADIENT_TOLERANCES["float32"].atol
    with pytest.raises(GradientMismatchError):  # scaled up, as the message says: caught
        check_parameter_gradients(model, lambda m: 1e7 * tiny(m), modes=("rev",))
    strict = dataclasses.replace(GRADIENT_TOLERANCES["float32"], atol=1e-14)
    with pytest.raises(GradientMismatchError):  # or with a smaller atol
        check_parameter_gradients(model, tiny, modes=("rev",), tolerance=strict)
    check_parameter_gradients(model, lambda m: 1e-7 * (m(x) ** 2).mean(), allow_zero=True)


def test_a_detached_loss_is_zero_for_jax_but_not_for_finite_differences():
    model, x = Mlp(rngs=nnx.Rngs(2)), _inputs()

    def detached(m):
        return jax.lax.stop_gradient(m(x) ** 2).sum()

    with pytest.raises(ZeroGradientError):
        check_parameter_gradients(model, detached)
    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(model, detached, allow_zero=True)
    assert info.value.worst.analytic == 0.0
    assert info.value.worst.numeric != 0.0


def test_bfloat16_is_checked_with_its_own_tolerance():
    model, x = Mlp(dtype=jnp.bfloat16, rngs=nnx.Rngs(3)), _inputs()
    grads = check_parameter_gradients(model, lambda m: (m(x) ** 2).mean())  # float64 reference
    assert {leaf.dtype for leaf in jax.tree.leaves(grads)} == {jnp.dtype(jnp.bfloat16)}
    strict = GRADIENT_TOLERANCES["float64"]
    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(model, lambda m: (m(x) ** 2).mean(), tolerance=strict)
    assert info.value.worst.dtype == "bfloat16"


@pytest.mark.x64
def test_float64_is_checked_tightly():
    x = _inputs(np.float64)
    model = nnx.Linear(3, 2, param_dtype=jnp.float64, rngs=nnx.Rngs(4))
    check_parameter_gradients(model, lambda m: jnp.cos(m(x)).sum())

    def nearly(m):  # a derivative off by a relative 1e-4: within float32's tolerance only
        y = m(x)
        return (y * (1 + 1e-4 * jnp.sin(jax.lax.stop_gradient(y)))).sum()

    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(model, nearly)
    assert info.value.worst.dtype == "float64"
    check_parameter_gradients(model, nearly, tolerance=GRADIENT_TOLERANCES["float32"])


def test_only_a_sample_of_a_large_leaf_is_checked():
    model = nnx.Linear(3, 64, rngs=nnx.Rngs(6))
    with pytest.raises(GradientMismatchError) as info:
        check_parameter_gradients(model, lambda m: wrong_square(m.kernel[...]).sum(), samples=5)
    kernel = [leaf for leaf in info.value.leaves if leaf.path == "kernel"]
    assert [(leaf.checked, leaf.failing) for leaf in kernel] == [(5, 5), (5, 5)]
    worst = info.value.worst
    assert worst.path == "kernel"
    assert len(worst.index) == 2
    assert worst.analytic == pytest.approx(1.5 * worst.numeric, rel=1e-3)
    assert worst.numeric == pytest.approx(2 * float(model.kernel[worst.index]), rel=1e-3)


def _params(**options):
    return lambda m, x: check_parameter_gradients(m, lambda m: m(x).sum(), **options)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m, x: check_parameter_gradients(m, lambda m: m(x)), TypeError, "scalar"),
        (
            lambda m, _: check_input_gradients(m, lambda m, v: m(v).sum(), jnp.arange(3)),
            TypeError,
            r"floating arrays only; input is int32: pass x\.astype\(jnp\.float32\), say$",
        ),  # a hostile finding: it gave the parameters' advice (a wrt filter)
        (
            lambda _, x: check_parameter_gradients(lambda p: p, lambda m: m(x).sum()),
            TypeError,
            r"check_parameter_gradients checks an nnx\.Module's gradients, not <function",
        ),
        (
            lambda _, x: check_input_gradients(abs, lambda m, v: m(v).sum(), x),
            TypeError,
            r"check_input_gradients checks an nnx\.Module's gradients, not <built-in .*",
        ),
        (_params(modes=("bwd",)), ValueError, r"modes must .* not \('bwd',\)"),
        (_params(modes="rev"), ValueError, "modes must be a non-empty sequence .* not 'rev'"),
        (_params(modes=()), ValueError, r"not \(\)"),
        (_params(samples=0), ValueError, "samples=0 must be an integer >= 1"),
        (_params(samples=2.5), TypeError, "samples=2.5 must be an integer"),
        (_params(seed=-1), ValueError, "seed=-1 must be an integer >= 0"),
        (_params(tolerance={"rtol": 1.0}), TypeError, "tolerance must be a GradientTolerance"),
        (
            lambda m, x: check_input_gradients(
                m, lambda m, v: m(v.astype(jnp.float32)).sum(), x.astype(jnp.float8_e4m3fn)
            ),
            ValueError,
            "no default gradient tolerance for float8_e4m3fn",
        ),
    ],
)
def test_misuse_is_refused(call, error, match):
    with pytest.raises(error, match=match):
        call(nnx.Linear(3, 2, rngs=nnx.Rngs(7)), _inputs())


def test_tolerance_values_are_validated():
    with pytest.raises(ValueError, match="step"):
        GradientTolerance(step=0.0, rtol=1e-3, atol=1e-5)


def test_a_loss_that_is_not_finite_is_refused():
    model, x = nnx.Linear(3, 2, rngs=nnx.Rngs(7)), _inputs()
    with pytest.raises(ValueError, match="the loss is nan; finite differences need it finite"):
        check_parameter_gradients(model, lambda m: jnp.log(-jnp.abs(m(x).sum())))


class Vector(nnx.Module):
    def __init__(self, *values):
        self.w = nnx.Param(jnp.array(values, dtype=jnp.float32))


@pytest.mark.parametrize("modes", [("fwd",), ("rev",)])
def test_a_gradient_that_is_not_finite_is_refused(modes):
    def trapped(m):  # sqrt's derivative in the unused branch is nan, and reaches jax.grad
        w = m.w[...]
        return jnp.where(w > 10, jnp.sqrt(w - 20), w).sum()

    expected = r"gradient of w is not finite \(3 of 3 elements, the first w\[0\] = nan\)"
    with pytest.raises(ValueError, match=expected):
        check_parameter_gradients(Vector(0.5, 1.0, 1.5), trapped, modes=modes)


def test_a_wrt_or_an_input_with_nothing_to_check_is_refused():
    model, x = nnx.Linear(3, 2, rngs=nnx.Rngs(7)), _inputs()
    with pytest.raises(
        ValueError, match="wrt=BatchStat selects no variable with elements in Linear"
    ):
        check_parameter_gradients(model, lambda m: m(x).sum(), wrt=nnx.BatchStat, allow_zero=True)
    with pytest.raises(ValueError, match="input has no elements, so nothing would be checked"):
        check_input_gradients(model, lambda m, v: m(v).sum(), jnp.zeros((0, 3)), allow_zero=True)


def test_a_leaf_with_no_elements_is_skipped():
    model = Vector(1.0, 2.0)
    model.empty = nnx.Param(jnp.zeros((0,)))
    grads = check_parameter_gradients(model, lambda m: (m.w[...] ** 2).sum() + m.empty[...].sum())
    assert grads["empty"].get_value().shape == (0,)
    np.testing.assert_allclose(grads["w"].get_value(), [2.0, 4.0])


def test_each_element_has_its_own_step_and_a_failure_reports_it():
    model = Vector(1000.0, 0.1, 0.2)  # a step relative to 1000 would be 1 for every element
    check_parameter_gradients(model, lambda m: jnp.sin(m.w[...][1:]).sum() + m.w[...][0] ** 2)
    given = GRADIENT_TOLERANCES["float32"]  # a tolerance= is used as given: no finer retry
    with pytest.raises(GradientMismatchError) as info:  # sin at 1000 with a step of 1
        check_parameter_gradients(model, lambda m: jnp.sin(m.w[...]).sum(), tolerance=given)
    worst = info.value.worst
    assert (worst.index, worst.failing, worst.step) == ((0,), 1, 1.0)
    assert "1 of 3 checked elements out of tolerance (rtol 0.002, atol 1e-05, step 1)" in str(
        info.value
    )
    small = GradientTolerance(step=1e-6, rtol=2e-3, atol=1e-5)
    check_parameter_gradients(model, lambda m: jnp.sin(m.w[...]).sum(), tolerance=small)
    check_parameter_gradients(model, lambda m: jnp.sin(m.w[...]).sum())  # retried at 1e-3


def _relu_mlp_loss():
    """An ordinary float32 ReLU classifier's mean cross-entropy, its gradient correct."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(4096, 8)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, 4096))
    mlp = nnx.Sequential(
        nnx.Linear(8, 64, rngs=nnx.Rngs(5)), nnx.relu, nnx.Linear(64, 10, rngs=nnx.Rngs(6))
    )

    def loss(m, relu=nnx.relu):
        logits = m.layers[2](relu(m.layers[0](x)))
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1).mean()

    return mlp, loss


leaky_derivative = jax.custom_jvp(nnx.relu)  # relu, whose derivative is 0.9 where x > 0
leaky_derivative.defjvps(lambda t, _, x: jnp.where(x > 0, 0.9, 0.0) * t)


def test_a_correct_float32_relu_model_passes_and_a_wrong_one_still_fails():
    """Hostile finding: float32's step (1e-3) on the float64 reference crossed ReLU kinks near
    sampled elements, so a correct ReLU MLP failed (4 of 16 elements). A failed leaf is
    checked again at float64's step, where the reference is float64."""
    mlp, loss = _relu_mlp_loss()
    grads = check_parameter_gradients(mlp, loss)
    expected = nnx.grad(loss)(mlp)
    close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-8)  # f32 apart
    jax.tree.map(close, grads, nnx.state(expected, nnx.Param))
    with pytest.raises(GradientMismatchError) as info:  # a derivative 10% off: still caught
        check_parameter_gradients(mlp, functools.partial(loss, relu=leaky_derivative))
    assert info.value.worst.path.startswith("layers/0/")  # before the wrong relu
    with pytest.raises(GradientMismatchError):  # a tolerance= is used as given: no retry
        check_parameter_gradients(mlp, loss, tolerance=GRADIENT_TOLERANCES["float32"])


class Cnn(nnx.Module):
    def __init__(self, activation):
        self.first = nnx.Conv(1, 4, (3, 3), rngs=nnx.Rngs(1))
        self.second = nnx.Conv(4, 4, (3, 3), rngs=nnx.Rngs(2))
        self.out = nnx.Linear(4 * 8 * 8, 10, rngs=nnx.Rngs(3))
        self.activation = activation

    def __call__(self, x):
        h = self.activation(self.second(self.activation(self.first(x))))
        return self.out(h.reshape(h.shape[0], -1))


@pytest.mark.parametrize("activation", [nnx.relu, leaky_derivative])
def test_a_small_relu_cnn_is_checked_at_the_reference_s_precision(activation):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(16, 8, 8, 1)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, 16))

    def loss(m):
        return -jnp.take_along_axis(jax.nn.log_softmax(m(x)), y[:, None], 1).mean()

    if activation is nnx.relu:  # 15 of 16 elements failed at float32's step
        check_parameter_gradients(Cnn(activation), loss, modes=("rev",))
    else:
        with pytest.raises(GradientMismatchError):
            check_parameter_gradients(Cnn(activation), loss, modes=("rev",))


def test_a_reference_that_is_not_float64_is_named():
    x = jnp.linspace(-1, 1, 12).reshape(4, 3).astype(jnp.bfloat16)
    model = nnx.Linear(3, 2, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    with pytest.raises(
        ValueError, match="its reference is not float64: the loss is bfloat16"
    ) as info:
        check_parameter_gradients(model, lambda m: jnp.tanh(m(x)).sum())
    assert "Pass dtype=None to a layer that keeps it" in str(info.value)
    assert isinstance(info.value.__cause__, GradientMismatchError)


def test_a_loop_carry_that_does_not_follow_the_parameters_dtype_is_named():
    """Hostile finding: jax's own carry TypeError, from the float64 reference on float32 data."""
    model, x = nnx.Linear(3, 3, rngs=nnx.Rngs(0)), _inputs()

    def looped(m, h):
        return jax.lax.fori_loop(0, 3, lambda _, h: jnp.tanh(m(h)), h).sum()

    with pytest.raises(TypeError, match=r"does not follow the parameters' dtype: a loop carry"):
        check_parameter_gradients(model, lambda m: looped(m, x))
    check_parameter_gradients(model, lambda m: looped(m, x.astype(m.kernel.dtype)))  # the fix


def test_an_rnn_cell_that_computes_in_float32_is_named_with_advice_that_applies():
    """Hostile finding: the advice "set the layer's dtype to None" did not name the cell."""
    x = jnp.linspace(-1, 1, 30).reshape(2, 5, 3)
    rnn = nnx.RNN(nnx.SimpleCell(3, 4, rngs=nnx.Rngs(0)))  # its cell's dtype is float32
    with pytest.raises(ValueError, match=r"reference is not float64.*nnx\.SimpleCell's"):
        check_parameter_gradients(rnn, lambda m: m(x).sum())
    rnn = nnx.RNN(nnx.SimpleCell(3, 4, dtype=None, rngs=nnx.Rngs(0)))
    with pytest.raises(TypeError, match=r"initial state made in a layer's param_dtype"):
        check_parameter_gradients(rnn, lambda m: m(x).sum())

    def started(m):  # the carry in the parameters' dtype, as that message says
        return m(x, initial_carry=jnp.zeros((2, 4), m.cell.dense_h.kernel.dtype)).sum()

    check_parameter_gradients(rnn, started)


def test_a_dropout_that_is_not_deterministic_is_named():
    model, x = Mlp(rngs=nnx.Rngs(0)), _inputs()
    model.dropout = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=1))
    with pytest.raises(
        ValueError, match=r"not the same function .* Dropout that is not deterministic"
    ):
        check_parameter_gradients(model, lambda m: jnp.tanh(m(x)).sum())


@jax.custom_vjp
def _double_sin(x):  # sin, with twice its derivative: a real gradient bug
    return jnp.sin(x)


_double_sin.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * 2.0 * jnp.cos(x),))


def test_a_wrong_gradient_of_a_model_using_jax_only_methods_is_a_mismatch():
    model = Vector(0.1, 0.4, 0.7, 1.0)  # .at exists on jax arrays, not on the reference's numpy
    with pytest.raises(GradientMismatchError):
        check_parameter_gradients(
            model, lambda m: _double_sin(m.w[...].at[0].multiply(1.0)).sum(), modes=("rev",)
        )


def test_a_wrong_gradient_of_a_cast_loss_is_a_mismatch_noting_the_cast():
    model = Vector(0.1, 0.4, 0.7, 1.0)
    with pytest.raises(GradientMismatchError) as info:  # off by 2x: more than float32 rounding
        check_parameter_gradients(
            model, lambda m: _double_sin(m.w[...]).sum().astype(jnp.float32), modes=("rev",)
        )
    assert "its reference is not float64: the loss is float32" in "\n".join(info.value.__notes__)


@pytest.mark.x64
def test_a_correct_gradient_failed_by_a_cast_loss_rounding_blames_the_reference():
    model = nnx.Linear(3, 2, param_dtype=jnp.float64, rngs=nnx.Rngs(4))
    x = _inputs(np.float64)  # float64's step is too small for a loss rounded to float32
    with pytest.raises(ValueError, match="its reference is not float64: the loss is float32"):
        check_parameter_gradients(model, lambda m: (100 * m(x) ** 2).sum().astype(jnp.float32))
