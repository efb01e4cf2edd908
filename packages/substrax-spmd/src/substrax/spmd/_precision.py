"""A mixed-precision policy: the dtypes parameters are stored, computed and returned in.

The parameters stay in ``param_dtype``; inside the compiled step they are cast to
``compute_dtype`` where they are used, so no second full copy is kept between steps, and the
gradient comes back through the cast in ``param_dtype``. Casting the parameters is not enough:
flax's layers carry their own computation ``dtype`` (an ``nnx.Embed`` built with float32
parameters keeps ``dtype=float32`` and promotes every activation after it back to float32), so
the step also sets that ``dtype`` on the model it builds inside the trace, as flax's per-layer
``dtype=`` would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
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


def _floating_or_none(value: object) -> bool:
    if value is None:
        return True
    try:
        return bool(jnp.issubdtype(jnp.dtype(cast("Any", value)), jnp.floating))
    except TypeError:
        return False


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
    step the floating parameters (the optimizer's ``wrt`` variables) are cast to
    ``compute_dtype`` where they are used, and every layer of the model built there computes in
    it (:meth:`set_compute_dtype`), so the activations of ``nnx.Linear``, ``nnx.Embed``,
    ``nnx.Conv``, the norms and attention come out in ``compute_dtype``; the loss and any
    metrics are cast to ``output_dtype``. The batch is passed as given (a layer casts its input;
    a float target keeps its precision): a module of your own that multiplies a float32 input
    by a raw parameter computes in float32 (jax's promotion) unless it casts the input. The stored parameters, their gradients and the
    optimizer state stay in ``param_dtype``. Every layer whose ``dtype`` is None or floating is
    switched, one built with ``dtype=jnp.float32`` on purpose too.

    What stays in float32, as in MaxText and Levanter: flax's norms compute their mean and
    variance in float32 (their output is ``compute_dtype``), and gradient accumulation sums in
    float32. The loss's softmax is the loss function's: cast the logits to float32 before the
    cross-entropy (``logits.astype(jnp.float32)``), as both do. There is no loss scaling, so float16
    (for compute or storage) is refused: use bfloat16.

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
        if jnp.float16 in (self.compute_dtype, self.param_dtype):
            name = "compute_dtype" if self.compute_dtype == jnp.float16 else "param_dtype"
            raise ValueError(
                f"{name}=float16 needs loss scaling, which PrecisionPolicy does not do: "
                "gradients and optimizer moments under float16's smallest normal (6e-5) flush "
                f"to zero. Use {name}='bfloat16' (float32's range), or keep float32"
            )

    def set_compute_dtype(self, module: nnx.Module) -> None:
        """Make every layer of ``module`` compute in ``compute_dtype``, as flax's ``dtype=`` does.

        Each submodule (``module`` included) whose ``dtype`` attribute is None or a floating
        dtype gets ``compute_dtype``; other attributes, and the parameters themselves, are
        untouched. The steps call it on the model they build inside the compiled function, never
        on yours; call it yourself in a hand-written step, on a model merged inside the trace.

        Example:
            >>> from flax import nnx
            >>> from substrax.spmd import PrecisionPolicy
            >>> embed = nnx.Embed(10, 4, rngs=nnx.Rngs(0))
            >>> embed.dtype
            dtype('float32')
            >>> PrecisionPolicy(compute_dtype="bfloat16").set_compute_dtype(embed)
            >>> embed.dtype, embed.embedding.dtype
            (dtype(bfloat16), dtype('float32'))
        """
        for _, layer in nnx.iter_modules(module):
            if "dtype" in vars(layer) and _floating_or_none(vars(layer)["dtype"]):
                setattr(layer, "dtype", self.compute_dtype)  # noqa: B010  (a layer's own attribute)

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
