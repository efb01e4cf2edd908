"""The matrix FLOPs of a jax program, counted from its jaxpr: the same on every backend.

XLA's cost analysis of a compiled program is a backend's own figure: on NVIDIA GPUs the
matrix multiplications become cuBLAS library calls that it does not count (an 8192x8192 bf16
matmul reads ``-1``), so an MFU built on it reads about ten times low. The program's jaxpr
says what it computes before any backend rewrites it, so this module counts from there.

What is counted: ``dot_general`` (matmuls, einsums), ``conv_general_dilated``, ``ragged_dot``
and cuDNN's fused attention, each at two FLOPs per multiply-add, through every nested program
(``jit``, ``remat``, custom derivatives, ``shard_map``, ``pmap``), a ``scan`` body times its
length and a ``cond`` at its costliest branch. Elementwise work, reductions and
normalisation are not counted: they are a few percent of a model's FLOPs, and MFU is quoted
on the matrix FLOPs (6·N per token for a dense transformer). What cannot be counted gives no
figure, with the reason: a ``while`` loop whose body multiplies (its trip count is data), an
opaque kernel (Pallas, an FFI or custom call), or a program without any matrix work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any


__all__ = ["FlopCount", "count_flops", "jaxpr_flops"]

# Kernels whose work the jaxpr cannot see: substrings of their primitives' names.
_OPAQUE = ("pallas", "ffi_call", "custom_call", "triton", "mosaic")
# cuDNN's fused attention (``jax.nn.dot_product_attention(..., implementation="cudnn")``).
_ATTENTION_FORWARD = "dot_product_attention_fwd"
_ATTENTION_BACKWARD = "dot_product_attention_bwd"


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


def _size(shape: Iterable[int]) -> int:
    return math.prod(int(d) for d in shape)


def _shape(atom: Any) -> tuple[int, ...]:  # noqa: ANN401  (a jaxpr Var or Literal)
    return tuple(atom.aval.shape)


def _dot_general(eqn: Any) -> float:  # noqa: ANN401  (a jaxpr equation)
    (contract, _), _ = eqn.params["dimension_numbers"]
    lhs = _shape(eqn.invars[0])
    return 2.0 * _size(_shape(eqn.outvars[0])) * _size(lhs[d] for d in contract)


def _convolution(eqn: Any) -> float:  # noqa: ANN401
    kernel = _shape(eqn.invars[1])
    out_features = kernel[eqn.params["dimension_numbers"].rhs_spec[0]]
    # each output element takes (kernel size / output features) multiply-adds; the kernel's
    # input-feature dimension is already divided by the feature groups
    return 2.0 * _size(_shape(eqn.outvars[0])) * _size(kernel) / out_features


def _ragged_dot(eqn: Any) -> float:  # noqa: ANN401
    lhs, rhs = _shape(eqn.invars[0]), _shape(eqn.invars[1])  # (m, k) and (groups, k, n)
    return 2.0 * _size(lhs) * rhs[-1]


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
    axes = params.get("manual_axes") or mesh.axis_names
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    return _size(sizes[a] for a in axes)


def _count(program: Any) -> float:  # noqa: ANN401
    total = 0.0
    for eqn in _eqns(program):
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_general(eqn)
        elif name == "conv_general_dilated":
            total += _convolution(eqn)
        elif name in {"ragged_dot", "ragged_dot_general"}:
            total += _ragged_dot(eqn)
        elif name.startswith((_ATTENTION_FORWARD, _ATTENTION_BACKWARD)):
            total += _attention(eqn, backward=name.startswith(_ATTENTION_BACKWARD))
        elif any(part in name for part in _OPAQUE):
            raise _Uncountable(f"the program calls the opaque kernel {name!r}")
        elif name == "cond":
            total += max(_count(branch) for branch in eqn.params["branches"])
        elif name == "while":
            if _count(eqn.params["body_jaxpr"]) or _count(eqn.params["cond_jaxpr"]):
                raise _Uncountable(
                    "the program multiplies inside a while loop, whose trip count is data; "
                    "use lax.scan or fori_loop with static bounds"
                )
        elif name == "scan":
            total += int(eqn.params["length"]) * _count(eqn.params["jaxpr"])
        else:  # jit, remat, custom_jvp/vjp, shard_map, pmap: their programs, once per copy
            inner = sum(_count(sub) for sub in _subprograms(eqn.params))
            total += inner * _replicas(eqn) if inner else 0.0
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
        return jaxpr_flops(trace(*args, **kwargs).jaxpr)
    import jax  # noqa: PLC0415  (importing substrax.devices starts no jax)

    return jaxpr_flops(jax.make_jaxpr(function)(*args, **kwargs))
