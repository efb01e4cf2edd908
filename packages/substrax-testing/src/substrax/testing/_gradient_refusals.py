"""What a gradient check refuses, before and after its comparison.

A gradient it cannot check (not finite), or one whose check proves nothing: zero everywhere, or
under the absolute tolerance or within the rounding of a large loss everywhere. Importing this
module imports no jax.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ._gradient_records import GradientTolerance, rounding_allowance


if TYPE_CHECKING:
    import jax


__all__ = ["BLIND_ROUNDING", "refuse_blind", "refuse_gradient", "widened_loss"]


def refuse_gradient(
    names: tuple[str, str], leaves: list[tuple[str, "jax.Array"]], gradients: list[Any], zero: bool
) -> None:
    """Refuse jax's gradient (what is returned): a leaf not finite, or all zero unless ``zero``."""
    import numpy as np  # noqa: PLC0415

    from ._errors import ZeroGradientError  # noqa: PLC0415 - a cycle

    (who, what), nonzero = names, False
    for (path, _), leaf in zip(leaves, gradients, strict=True):
        gradient = np.asarray(leaf, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(gradient))
        if bad.size:
            at = ", ".join(map(str, np.unravel_index(int(bad[0]), gradient.shape)))
            raise ValueError(
                f"{who}: jax's gradient of {path} is not finite ({bad.size} of {gradient.size} "
                f"elements, the first {path}[{at}] = {gradient.flat[bad[0]]}); finite "
                "differences cannot check it. Look in the loss for a jnp.where whose unused "
                "branch has an infinite derivative (sqrt or log at or below 0: make that "
                "branch's input safe too, a second jnp.where) or a division by zero"
            )
        nonzero = nonzero or bool(np.any(gradient != 0))
    if not zero and not nonzero:
        raise ZeroGradientError(what, sum(1 for _, value in leaves if value.size))


BLIND_ROUNDING: Final = 0.1
"""The largest fraction of a leaf's largest gradient its rounding allowance may reach."""


def refuse_blind(
    what: str,
    leaves: list[tuple[str, "jax.Array"]],
    gradients: list[Any],
    tolerances: list[GradientTolerance],
    loss: float,
) -> None:
    """Refuse a check that proved nothing: every leaf's gradient is within its allowance.

    A leaf is blind where its largest gradient is below its ``atol``, or where the central
    difference's rounding there (``rounding_allowance`` of ``loss``, the loss's value, at that
    element's step) is more than :data:`BLIND_ROUNDING` of it: a loss much larger than its
    gradient (``1e10 + sum(w * b)``) lets a gradient twice too large pass. Refused when every
    leaf with elements is blind; the leaf with the largest gradient is named.
    """
    import numpy as np  # noqa: PLC0415

    from ._errors import ZeroGradientError  # noqa: PLC0415 - a cycle

    eps = float(np.finfo(np.float64).eps)
    found: list[tuple[float, str, float, float]] = []  # largest, where, atol, rounding
    for (path, value), gradient, tolerance in zip(leaves, gradients, tolerances, strict=True):
        magnitudes = np.abs(np.asarray(gradient, np.float64))
        if not magnitudes.size:
            continue
        at = np.unravel_index(int(np.argmax(magnitudes)), magnitudes.shape)
        largest, x = float(magnitudes[at]), float(np.asarray(value, np.float64)[at])
        step = tolerance.step * max(1.0, abs(x))  # the element's own step, as checked
        rounding = float(rounding_allowance(eps, loss, step))
        if largest >= tolerance.atol and rounding <= BLIND_ROUNDING * largest:
            return  # this leaf's check could fail: the check proved something
        where = f"{path}[{', '.join(map(str, at))}]" if at else path
        found.append((largest, where, tolerance.atol, rounding * (largest >= tolerance.atol)))
    largest, where, _, rounding = max(found)
    atol = max(leaf[2] for leaf in found)
    raise ZeroGradientError(
        what, len(found), largest=largest, atol=atol, rounding=rounding, where=where, loss=loss
    )


def widened_loss(who: str, what: str, evaluate: Callable[[], Any]) -> float:
    """``evaluate()``: the loss at the float64 copy of the leaves, as each reference evaluates it.

    Raises:
        TypeError: jax refused it (the loss ran on the leaves as given, so the widening is to
            blame): a value that does not follow the leaves' dtype (a loop's initial carry in
            float32 data) meets one that does (the carry the body returns); says so.
    """
    try:
        return float(evaluate())
    except TypeError as caught:
        raise TypeError(_widened_failure(who, what, caught)) from caught


def _widened_failure(who: str, what: str, error: TypeError) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    first = " ".join(lines[:2]).rstrip(".") or type(error).__name__  # what differs, in jax's
    whose = "the parameters'" if what == "parameters" else f"the {what}'s"
    return (
        f"{who}: the loss runs on the {what} as given but fails on the float64 copy of "
        f"{whose} values that finite differences are taken on ({first}). Something in it does "
        f"not follow {whose} dtype: a loop carry (nnx.scan, lax.scan, fori_loop, while_loop) "
        "that starts in a fixed dtype (float32 data, or an initial state made in a layer's "
        "param_dtype, as nnx.RNN's) while its body computes in float64, or a cond whose "
        "branches differ. Start the carry in the dtype of what it is computed with "
        "(h = x.astype(model.kernel.dtype)), or give the loss float64 data in a float64 "
        "session (jax_enable_x64)"
    )
