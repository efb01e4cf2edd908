"""The matrix FLOPs of a jax program, counted from its jaxpr: the same on every backend.

XLA's cost analysis of a compiled program is a backend's own figure: on NVIDIA GPUs the
matrix multiplications become cuBLAS library calls that it does not count (an 8192x8192 bf16
matmul reads ``-1``), so an MFU built on it reads about ten times low. The program's jaxpr
says what it computes before any backend rewrites it, so this module counts from there.

What is counted: ``dot_general`` (matmuls, einsums), ``conv_general_dilated`` (without the
zeros a dilated input holds), ``ragged_dot`` and cuDNN's fused attention, each at two FLOPs per
multiply-add (four real ones per complex one), plus the textbook counts of a triangular solve,
Cholesky, LU and an FFT, through every nested program (``jit``, ``remat``, custom derivatives,
``custom_linear_solve``'s solve, ``shard_map``, ``pmap``), a ``scan`` body times its length and
a ``cond`` at its costliest branch. Elementwise work, reductions and normalisation are not
counted: they are a few percent of a model's FLOPs, and MFU is quoted on the matrix FLOPs (6·N
per token for a dense transformer). The count is of the program as written: a rematerialised
forward pass is counted again in the backward pass (hardware FLOPs, which read above 6·N·T).
What cannot be counted gives no figure, with the reason, never a partial one: a ``while``
loop whose body multiplies (its trip count is data), an opaque kernel (Pallas, an FFI or custom
call), an iterative decomposition (eigh, SVD, QR), a symbolic shape, or a
program without any matrix work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any


__all__ = ["FlopCount", "count_flops", "jaxpr_flops"]

# Kernels whose work the jaxpr cannot see: substrings of their primitives' names.
_OPAQUE = ("pallas", "ffi_call", "custom_call", "triton", "mosaic")
# Decompositions whose count depends on the data (iterations to converge): not counted.
_UNCOUNTED = frozenset({"eigh", "eig", "svd", "schur", "qr", "geqrf", "householder_product"})
_LINEAR_ALGEBRA = frozenset({"triangular_solve", "cholesky", "lu"})
# cuDNN's fused attention (``jax.nn.dot_product_attention(..., implementation="cudnn")``):
# ``dot_product_attention_{fwd,bwd}[_wrapper]`` and their fp8 forms.
_ATTENTION = "dot_product_attention"


@dataclass(frozen=True, kw_only=True)
class FlopCount:
    """The matrix FLOPs of a program, or None with the reason they cannot be counted.

    Attributes:
        flops: Two per multiply-add of every matmul, convolution and fused attention, over
            the whole program (every device's share together); None when not countable.
        reason: Why ``flops`` is None; None when it is a count.

    Example:
        >>> from substrax.devices import FlopCount
        >>> FlopCount(flops=None, reason="a while loop multiplies").flops is None
        True
    """

    flops: float | None
    reason: str | None = None


class _Uncountable(Exception):  # noqa: N818  (internal control flow, never raised to a user)
    pass


def _size(shape: Iterable[Any]) -> int:
    try:
        return math.prod(int(d) for d in shape)
    except (TypeError, ValueError) as error:  # a symbolic (shape-polymorphic) dimension
        raise _Uncountable(f"a shape has a symbolic dimension ({error})") from None


def _complex(eqn: Any) -> int:  # noqa: ANN401
    """Four real multiply-adds per complex one."""
    dtype = getattr(eqn.outvars[0].aval, "dtype", None)
    return 4 if dtype is not None and dtype.kind == "c" else 1


def _shape(atom: Any) -> tuple[int, ...]:  # noqa: ANN401  (a jaxpr Var or Literal)
    return tuple(atom.aval.shape)


def _dot_general(eqn: Any) -> float:  # noqa: ANN401  (a jaxpr equation)
    (contract, _), _ = eqn.params["dimension_numbers"]
    lhs = _shape(eqn.invars[0])
    return 2.0 * _size(_shape(eqn.outvars[0])) * _size(lhs[d] for d in contract) * _complex(eqn)


def _convolution(eqn: Any) -> float:  # noqa: ANN401
    kernel = _shape(eqn.invars[1])
    out_features = kernel[eqn.params["dimension_numbers"].rhs_spec[0]]
    # each output element takes (kernel size / output features) multiply-adds; the kernel's
    # input-feature dimension is already divided by the feature groups. A dilated input (a
    # strided convolution's input gradient, a transposed convolution) is mostly the zeros the
    # dilation inserts: only one window position in the dilation's size meets a real input.
    dilation = _size(eqn.params.get("lhs_dilation") or ())
    macs = _size(_shape(eqn.outvars[0])) * _size(kernel) / out_features / dilation
    return 2.0 * macs * _complex(eqn)


def _ragged_dot(eqn: Any) -> float:  # noqa: ANN401
    """Each output element sums its contracted dimensions over one group's rows, never all."""
    lhs, out = _shape(eqn.invars[0]), _size(_shape(eqn.outvars[0]))
    numbers = eqn.params.get("ragged_dot_dimension_numbers")
    if numbers is None:  # ragged_dot: (m, k) by (groups, k, n), each row meeting one group
        return 2.0 * out * lhs[-1] * _complex(eqn)
    (contracting, _), _ = numbers.dot_dimension_numbers
    summed = _size(tuple(lhs[d] for d in contracting))
    if numbers.rhs_group_dimensions:  # each row meets its group's matrix
        return 2.0 * out * summed * _complex(eqn)
    # the ragged dimension is contracted (a weight gradient): each group sums its own rows only
    return 2.0 * out * summed / _shape(eqn.invars[2])[0] * _complex(eqn)


def _matrix(eqn: Any) -> tuple[int, int, int]:  # noqa: ANN401
    """A linear-algebra operand's batch size and its last two dimensions."""
    shape = _shape(eqn.invars[0])
    return _size(shape[:-2]), shape[-2], shape[-1]


def _linear_algebra(eqn: Any) -> float:  # noqa: ANN401
    """LAPACK's textbook counts: triangular solve, Cholesky and LU."""
    name = eqn.primitive.name
    if name == "triangular_solve":  # a (m, m) triangle against b's other dimension
        batch, m, _ = _matrix(eqn)
        b = _shape(eqn.invars[1])
        return float(batch * m * m * (_size(b[-2:]) // m)) * _complex(eqn)
    batch, m, n = _matrix(eqn)
    if name == "cholesky":
        return batch * m**3 / 3.0 * _complex(eqn)
    k = min(m, n)  # lu: 2mnk - (m + n)k^2 + 2k^3/3, which is 2n^3/3 for a square matrix
    return batch * (2.0 * m * n * k - (m + n) * k * k + 2.0 * k**3 / 3.0) * _complex(eqn)


def _fft(eqn: Any) -> float:  # noqa: ANN401
    """5 N log2 N per complex transform of N points (the Cooley-Tukey count)."""
    lengths = [int(n) for n in eqn.params["fft_lengths"]]
    points = _size(lengths)
    transforms = _size(_shape(eqn.invars[0])) / points
    return 5.0 * transforms * points * math.log2(max(points, 2))


def _attention(eqn: Any, *, backward: bool) -> float:  # noqa: ANN401
    query, key = _shape(eqn.invars[0]), _shape(eqn.invars[1])
    bnth = eqn.params.get("layout") == 1  # cuDNN's AttentionLayout: 0 is BTNH, 1 is BNTH
    if bnth:
        batch, heads, q_len, head_dim = query
        kv_len = key[2]
    else:
        batch, q_len, heads, head_dim = query
        kv_len = key[1]
    # scores (Q K^T) and their values (P V), the whole score matrix, as the unfused program
    # computes it whatever the mask; the backward pass twice that, as autodiff's is
    forward = 4.0 * batch * heads * q_len * kv_len * head_dim
    return 2 * forward if backward else forward


def _subprograms(params: dict[str, Any]) -> Iterator[Any]:
    """The jaxprs among an equation's parameters, alone or in tuples (duck-typed)."""
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if hasattr(item, "eqns") or hasattr(getattr(item, "jaxpr", None), "eqns"):
                yield item


def _eqns(program: Any) -> Any:  # noqa: ANN401  (a Jaxpr or ClosedJaxpr)
    return program.eqns if hasattr(program, "eqns") else program.jaxpr.eqns


def _replicas(eqn: Any) -> int:  # noqa: ANN401
    """How many copies of a per-device body run: ``shard_map``'s manual axes, ``pmap``'s size."""
    params = eqn.params
    if "axis_size" in params:
        return int(params["axis_size"])
    mesh = params.get("mesh")
    if mesh is None:
        return 1
    axes = (  # the axes the body is written per device for, as this jax names them
        params.get("manual_axes") or params.get("newly_manual_axes") or mesh.axis_names
    )
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    return _size(sizes[a] for a in axes)


_COUNTERS: dict[str, Callable[[Any], float]] = {
    "dot_general": _dot_general,
    "conv_general_dilated": _convolution,
    "ragged_dot": _ragged_dot,
    "ragged_dot_general": _ragged_dot,
    "fft": _fft,
    **dict.fromkeys(_LINEAR_ALGEBRA, _linear_algebra),
}


def _nested(eqn: Any) -> float:  # noqa: ANN401
    """The FLOPs of the programs an equation runs: loops, branches, calls."""
    name, params = eqn.primitive.name, eqn.params
    if name == "cond":
        return max(_count(branch) for branch in params["branches"])
    if name == "while":
        if _count(params["body_jaxpr"]) or _count(params["cond_jaxpr"]):
            raise _Uncountable(
                "the program multiplies inside a while loop, whose trip count is data; "
                "use lax.scan or fori_loop with static bounds"
            )
        return 0.0
    if name == "scan":
        return int(params["length"]) * _count(params["jaxpr"])
    if name == "custom_linear_solve":  # runs its solve; the other programs are for autodiff
        return _count(params["jaxprs"].solve)
    # jit, remat, custom_jvp/vjp, shard_map, pmap: their programs, once per copy
    inner = sum(_count(sub) for sub in _subprograms(params))
    return inner * _replicas(eqn) if inner else 0.0


def _count(program: Any) -> float:  # noqa: ANN401
    total = 0.0
    for eqn in _eqns(program):
        name = eqn.primitive.name
        counter = _COUNTERS.get(name)
        if counter is not None:
            total += counter(eqn)
        elif name.startswith(_ATTENTION):  # the fp8 forms too
            total += _attention(eqn, backward="_bwd" in name)
        elif name in _UNCOUNTED or any(part in name for part in _OPAQUE):
            raise _Uncountable(f"the program calls {name!r}, whose FLOPs are not counted")
        else:
            total += _nested(eqn)
    return total


def jaxpr_flops(program: Any) -> FlopCount:  # noqa: ANN401  (a Jaxpr or ClosedJaxpr)
    """The matrix FLOPs of a traced program (``jax.make_jaxpr(f)(...)``, ``jit(f).trace(...).jaxpr``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from substrax.devices import jaxpr_flops
        >>> jaxpr_flops(jax.make_jaxpr(jnp.matmul)(jnp.ones((4, 8)), jnp.ones((8, 2)))).flops
        128.0
    """
    try:
        flops = _count(program)
    except _Uncountable as error:
        return FlopCount(flops=None, reason=str(error))
    if flops <= 0:
        return FlopCount(flops=None, reason="the program has no matmul, convolution or attention")
    return FlopCount(flops=flops)


def count_flops(function: Callable[..., Any], *args: object, **kwargs: object) -> FlopCount:
    """The matrix FLOPs of one call of ``function`` on ``args``, counted from its jaxpr.

    ``function`` is any jax-traceable callable, or a ``jax.jit`` function (traced with its
    static arguments, and the trace kept for its later calls); ``args`` may be arrays or
    ``jax.ShapeDtypeStruct``. It is traced, never compiled or run. The count is
    the whole program's, summed over the devices a sharded program runs on: divide by the
    device count for one device's share. A backward pass is counted as the program has it
    (for a ``jax.grad`` program, about twice the forward), and a rematerialised forward again.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from substrax.devices import count_flops
        >>> count_flops(lambda a, b: a @ b, jnp.ones((4, 8)), jnp.ones((8, 2))).flops
        128.0
        >>> count_flops(jnp.sin, jnp.ones(3)).reason
        'the program has no matmul, convolution or attention'
    """
    trace: Callable[..., Any] | None = getattr(function, "trace", None)
    if callable(trace):  # a jax.jit function: traced as it is called, static arguments too
        traced = trace(*args, **kwargs)
        if (jaxpr := getattr(traced, "jaxpr", None)) is not None:  # nnx.jit's trace has none
            return jaxpr_flops(jaxpr)
    import jax  # noqa: PLC0415  (importing substrax.devices starts no jax)

    return jaxpr_flops(jax.make_jaxpr(function)(*args, **kwargs))
