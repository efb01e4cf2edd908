"""Per-row weights a batch holds under a key: the ``mask=`` of ``EvalStep`` and ``TrainStep``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp

from substrax.typing import PyTree


def row_weights(batch: PyTree, key: str, owner: str, *, items: bool = False) -> jax.Array:
    """The per-row weights ``batch`` holds under ``key``, as float32.

    With ``items``, a mask of the items of each row (``(rows, tokens)``) weighs a row by the
    sum of its own: the tokens it counts.

    Raises:
        ValueError: The batch is no mapping with ``key``, or its weights are not one a row
            (nor, with ``items``, a row's items); the message names ``owner`` and the key.

    Example:
        >>> import numpy as np
        >>> from substrax.spmd._row_weights import row_weights
        >>> row_weights({"x": np.ones((3, 2)), "m": np.array([1, 1, 0])}, "m", "EvalStep")
        Array([1., 1., 0.], dtype=float32)
    """
    if not isinstance(batch, Mapping) or key not in batch:
        keys = sorted(map(str, batch)) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(
            f"{owner}(mask={key!r}): the batch has no {key!r} key (it has {keys}); give "
            "every batch its per-row weights under that key (1 for a row, 0 for padding)"
        )
    weights = jnp.asarray(cast("Mapping[str, Any]", batch)[key])
    if items and weights.ndim > 1:  # a row weighs what it counts
        weights = jnp.sum(weights.reshape(weights.shape[0], -1).astype(jnp.float32), axis=1)
    if weights.ndim != 1:
        shapes = "(rows,), or (rows, ...) of the items the loss counts" if items else "(rows,)"
        raise ValueError(
            f"{owner}(mask={key!r}): the mask has shape {weights.shape}; give one weight a row "
            f"(shape {shapes})"
        )
    return weights.astype(jnp.float32)


def check_mask_key(owner: str, mask: object) -> None:
    """Refuse a ``mask`` that is neither None nor a key (a non-empty string).

    Raises:
        TypeError: ``mask`` is another object; the message names ``owner``.
    """
    if mask is not None and not (isinstance(mask, str) and mask):
        msg = f"{owner}(mask={mask!r}): mask must be the batch's key of per-row weights (a str)"
        raise TypeError(msg)
