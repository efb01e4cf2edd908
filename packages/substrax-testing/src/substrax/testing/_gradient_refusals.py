"""What a gradient check refuses, before and after its comparison.

A gradient it cannot check (not finite), or one whose check proves nothing: zero everywhere, or
under the absolute tolerance everywhere. Importing this module imports no jax.
"""

from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    import jax


__all__ = ["refuse_blind", "refuse_gradient"]


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


def refuse_blind(what: str, gradients: list[Any], atols: list[float]) -> None:
    """Refuse a check every leaf of whose gradient is below its ``atol``: it proved nothing."""
    import numpy as np  # noqa: PLC0415

    from ._errors import ZeroGradientError  # noqa: PLC0415 - a cycle

    largest = [float(np.max(np.abs(np.asarray(g, np.float64)))) for g in gradients if np.size(g)]
    sized = [atol for g, atol in zip(gradients, atols, strict=True) if np.size(g)]
    if all(value < atol for value, atol in zip(largest, sized, strict=True)):
        raise ZeroGradientError(what, len(largest), largest=max(largest), atol=max(sized))
