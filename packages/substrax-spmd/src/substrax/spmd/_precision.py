"""A mixed-precision policy: the dtypes parameters are stored, computed and returned in.

The parameters stay in ``param_dtype``; inside the compiled step they are cast to
``compute_dtype`` where they are used, so no second full copy is kept between steps, and the
gradient comes back through the cast in ``param_dtype``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from substrax.typing import PyTree


def _floating(name: str, value: DTypeLike) -> np.dtype[Any]:
    try:
        dtype = jnp.dtype(value)
    except TypeError as error:
        raise ValueError(f"{name} must be a dtype such as 'bfloat16', got {value!r}") from error
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating dtype such as 'bfloat16', got {dtype}")
    return dtype


def _cast_floating(tree: PyTree, dtype: np.dtype[Any]) -> PyTree:
    def cast(x: PyTree) -> PyTree:
        if isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)


@dataclass(frozen=True, kw_only=True)
class PrecisionPolicy:
    """The dtypes of a mixed-precision step: stored parameters, computation, and outputs.

    Given to :class:`TrainStep` or :class:`EvalStep` as ``precision=``. Inside the compiled
    step the floating parameters (the optimizer's ``wrt`` variables) and the floating batch
    leaves are cast to ``compute_dtype`` where they are used; the loss and any metrics are cast
    to ``output_dtype``. The stored parameters, their gradients and the optimizer state stay in
    ``param_dtype``. There is no loss scaling: use bfloat16, not float16, for compute.

    Args:
        param_dtype: The dtype the parameters are stored in; a model whose floating parameters
            have another dtype is refused by the step.
        compute_dtype: The dtype the forward and backward passes run in.
        output_dtype: The dtype of the loss, auxiliary outputs and metrics.

    Example:
        >>> import jax.numpy as jnp
        >>> from substrax.spmd import PrecisionPolicy
        >>> policy = PrecisionPolicy(compute_dtype="bfloat16")
        >>> policy.param_dtype, policy.compute_dtype, policy.output_dtype
        (dtype('float32'), dtype(bfloat16), dtype('float32'))
        >>> policy.cast_to_compute({"x": jnp.ones(2), "ids": jnp.arange(2)})["x"].dtype
        dtype(bfloat16)
    """

    param_dtype: Any = "float32"
    compute_dtype: Any = "float32"
    output_dtype: Any = "float32"

    def __post_init__(self) -> None:
        for name in ("param_dtype", "compute_dtype", "output_dtype"):
            object.__setattr__(self, name, _floating(name, getattr(self, name)))

    def cast_to_compute(self, tree: PyTree) -> PyTree:
        """Cast every floating array leaf of ``tree`` to ``compute_dtype``; others unchanged."""
        return _cast_floating(tree, self.compute_dtype)

    def cast_to_output(self, tree: PyTree) -> PyTree:
        """Cast every floating array leaf of ``tree`` to ``output_dtype``; others unchanged."""
        return _cast_floating(tree, self.output_dtype)

    def check_params(self, params: PyTree) -> None:
        """Refuse floating parameters not stored in ``param_dtype``, naming the first one.

        Raises:
            ValueError: A floating parameter of another dtype.
        """
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            dtype = getattr(leaf, "dtype", None)
            if (
                dtype is not None
                and jnp.issubdtype(dtype, jnp.floating)
                and dtype != self.param_dtype
            ):
                name = jax.tree_util.keystr(path).removesuffix(".value")
                raise ValueError(
                    f"parameter {name} is {dtype} but the precision "
                    f"policy stores parameters in {self.param_dtype}; build the model with "
                    f"param_dtype={self.param_dtype} or change the policy's param_dtype"
                )
