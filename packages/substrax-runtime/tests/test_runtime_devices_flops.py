"""The matrix FLOPs of a program, counted from its jaxpr, against analytic counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from substrax.devices import FlopCount, count_flops, jaxpr_flops


def mlp_loss(params, x, y):
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    return ((hidden @ params["w2"] - y) ** 2).mean()


def mlp_params(d_in, width, d_out):
    return {
        "w1": jnp.ones((d_in, width)),
        "b1": jnp.zeros(width),
        "w2": jnp.ones((width, d_out)),
    }


def test_an_mlp_train_step_counts_forward_and_backward_exactly():
    rows, d_in, width, d_out = 64, 16, 128, 4
    params = mlp_params(d_in, width, d_out)
    x, y = jnp.ones((rows, d_in)), jnp.ones((rows, d_out))
    forward = 2 * rows * (d_in * width + width * d_out)
    # the backward pass: both weight gradients, and the hidden layer's input gradient (the data's
    # own gradient is never computed)
    backward = 2 * rows * (d_in * width + width * d_out) + 2 * rows * width * d_out
    analytic = forward + backward
    counted = count_flops(jax.value_and_grad(mlp_loss), params, x, y)
    assert counted == FlopCount(flops=float(analytic))
    assert count_flops(mlp_loss, params, x, y).flops == forward


def test_abstract_arguments_and_jitted_functions_are_traced_not_run():
    spec = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
    counted = count_flops(jax.jit(jnp.matmul), spec, spec)
    assert counted.flops == 2 * 1024**3


def causal_attention(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def test_a_causal_attention_layer_counts_within_ten_percent():
    batch, seq, heads, head_dim = 2, 128, 4, 32
    model = heads * head_dim
    weights = {name: jnp.ones((model, model)) for name in ("q", "k", "v", "o")}

    def layer(weights, x):
        def split(h):
            return h.reshape(batch, seq, heads, head_dim)

        q, k, v = (split(x @ weights[name]) for name in ("q", "k", "v"))
        out = causal_attention(q, k, v).reshape(batch, seq, model)
        return (out @ weights["o"]).sum()

    x = jnp.ones((batch, seq, model))
    tokens = batch * seq
    projections = 2 * tokens * 4 * model * model
    scores = 2 * 2 * batch * heads * seq * seq * head_dim  # Q K^T and P V, the whole matrix
    forward = projections + scores
    assert abs(count_flops(layer, weights, x).flops - forward) / forward < 0.10
    # forward and backward, every input differentiated: three times the forward
    both = count_flops(jax.grad(layer, argnums=(0, 1)), weights, x).flops
    assert abs(both - 3 * forward) / (3 * forward) < 0.10


def test_a_convolution_counts_its_kernel_per_output_element():
    images = jnp.ones((8, 3, 32, 32))  # NCHW
    kernel = jnp.ones((16, 3, 3, 3))  # OIHW

    def conv(images, kernel):
        return jax.lax.conv_general_dilated(images, kernel, (1, 1), "SAME")

    assert count_flops(conv, images, kernel).flops == 2 * (8 * 16 * 32 * 32) * (3 * 3 * 3)
    grouped = jnp.ones((16, 1, 3, 3))  # depthwise-like: 16 outputs from 16 inputs in 16 groups
    inputs = jnp.ones((8, 16, 32, 32))
    counted = count_flops(
        lambda a, b: jax.lax.conv_general_dilated(a, b, (1, 1), "SAME", feature_group_count=16),
        inputs,
        grouped,
    )
    assert counted.flops == 2 * (8 * 16 * 32 * 32) * 9


def test_a_scan_counts_its_body_times_its_length_and_a_cond_its_costliest_branch():
    w = jnp.ones((32, 32))

    def scanned(w, x):
        return jax.lax.scan(lambda c, _: (c @ w, None), x, length=5)[0]

    one = 2 * 4 * 32 * 32
    assert count_flops(scanned, w, jnp.ones((4, 32))).flops == 5 * one
    fori = count_flops(
        lambda w, x: jax.lax.fori_loop(0, 3, lambda _, c: c @ w, x), w, jnp.ones((4, 32))
    )
    assert fori.flops == 3 * one

    def branch(p, w, x):
        return jax.lax.cond(p, lambda: (x @ w) @ w, lambda: x @ w)

    assert count_flops(branch, True, w, jnp.ones((4, 32))).flops == 2 * one


def test_a_while_loop_that_multiplies_gives_no_figure_with_the_reason():
    w = jnp.ones((8, 8))

    def until_small(w, x):
        return jax.lax.while_loop(lambda c: c.sum() > 1.0, lambda c: c @ w * 0.5, x)

    counted = count_flops(until_small, w, jnp.ones((2, 8)))
    assert counted.flops is None
    assert "while loop" in counted.reason
    # a while loop without matrix work is no obstacle
    counting = count_flops(
        lambda w, x: jax.lax.while_loop(lambda i: i < 3, lambda i: i + 1, 0) + (x @ w).sum(),
        w,
        jnp.ones((2, 8)),
    )
    assert counting.flops == 2 * 2 * 8 * 8


def test_nothing_to_count_is_no_figure_never_zero():
    counted = count_flops(lambda x: jnp.tanh(x).sum(), jnp.ones(10))
    assert counted == FlopCount(
        flops=None, reason="the program has no matmul, convolution or attention"
    )


def test_an_opaque_kernel_gives_no_figure_naming_it():
    pallas = pytest.importorskip("jax.experimental.pallas", reason="jax without Pallas")

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def doubled(x):
        out = pallas.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
        return out(x)  # traced only, never run

    counted = count_flops(lambda x, w: doubled(x) @ w, jnp.ones((8, 8)), jnp.ones((8, 8)))
    assert counted.flops is None
    assert "pallas_call" in counted.reason


def test_a_shard_map_body_counts_once_per_device():
    mesh = jax.make_mesh((8,), ("data",))
    rows = jax.sharding.NamedSharding(mesh, P("data"))
    x = jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=rows)
    w = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=jax.sharding.NamedSharding(mesh, P()))

    @jax.shard_map(mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))
    def local(x, w):
        return x @ w

    assert count_flops(local, x, w).flops == 2 * 64 * 16 * 8


def test_jaxpr_flops_takes_a_traced_program():
    traced = jax.jit(lambda a, b: a @ b).trace(np.ones((4, 8), np.float32), jnp.ones((8, 2)))
    assert jaxpr_flops(traced.jaxpr).flops == 128.0


@pytest.mark.parametrize("stride", [1, 2, 4])
def test_a_strided_convolution_s_input_gradient_costs_what_its_forward_does(stride):
    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    x, w = jnp.ones((2, 16, 16, 8)), jnp.ones((3, 3, 8, 8))
    forward = count_flops(conv, x, w).flops
    y, input_gradient = jax.vjp(lambda x: conv(x, w), x)
    # the zeros a stride's transpose inserts are not multiplied in: a 1/stride^2 share of the
    # dilated window, up to the padding at the edges
    assert count_flops(input_gradient, y).flops == pytest.approx(forward, rel=0.15)


def test_linear_algebra_is_counted_at_its_textbook_figures_and_a_solve_once():
    n = 64
    a = jnp.eye(n) * 2.0
    lu = 2 * n**3 / 3
    solves = 2 * n * n  # two triangular solves of one right-hand side
    assert count_flops(jnp.linalg.solve, a, jnp.ones(n)).flops == pytest.approx(lu + solves)
    assert count_flops(jnp.linalg.cholesky, a).flops == pytest.approx(n**3 / 3)
    fft = count_flops(lambda x: jnp.fft.fft(x).real.sum(), jnp.ones((4, 1024)))
    assert fft.flops == pytest.approx(4 * 5 * 1024 * 10)


def test_a_ragged_dot_and_its_gradients_count_each_row_against_one_group():
    # the input gradient counted 2*m*n*n, the weight gradient every row against every group
    m, k, n, groups = 64, 16, 48, 4
    sizes = jnp.full(groups, m // groups, jnp.int32)

    def loss(x, w):
        return jax.lax.ragged_dot(x, w, sizes).sum()

    x, w = jnp.ones((m, k)), jnp.ones((groups, k, n))
    assert count_flops(loss, x, w).flops == 2 * m * k * n
    assert count_flops(jax.grad(loss, argnums=(0, 1)), x, w).flops == 3 * 2 * m * k * n


def test_a_complex_matmul_counts_four_real_multiply_adds():
    a = jnp.ones((4, 8), jnp.complex64)
    assert count_flops(jnp.matmul, a, a.T).flops == 4 * 2 * 4 * 8 * 4


@pytest.mark.parametrize("decomposition", [jnp.linalg.eigh, jnp.linalg.svd, jnp.linalg.qr])
def test_an_iterative_decomposition_gives_no_figure_rather_than_a_partial_one(decomposition):
    a = jnp.eye(8)
    counted = count_flops(lambda a: jax.tree.leaves(decomposition(a @ a))[0], a)
    assert counted.flops is None
    assert "not counted" in counted.reason


def test_a_partly_manual_shard_map_counts_only_its_manual_axes():
    mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        body = jax.shard_map(
            lambda a, b: a @ b, in_specs=(P("x"), P()), out_specs=P("x"), axis_names={"x"}
        )
        counted = count_flops(jax.jit(body), jnp.ones((64, 64)), jnp.ones((64, 64)))
    assert counted.flops == 2 * 64**3
