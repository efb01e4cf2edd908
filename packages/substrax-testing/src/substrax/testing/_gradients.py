"""Check an nnx model's gradients against central finite differences, with per-dtype tolerances.

The gradients jax computes for the model as given (its own dtype) are compared, element by
element on a sample of each leaf, with central differences of the loss computed on a float64
copy (inside ``jax.enable_x64(True)``, which is thread-local). Reverse mode (``jax.grad``) and
forward mode (``jax.jvp``) are both checked by default. A failure names the worst leaf, by path,
with its element, both values and the errors. Importing this module imports no jax or flax.
"""

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from substrax.support import check_float, check_int, require
from substrax.typing import PyTree


if TYPE_CHECKING:
    import jax
    import numpy as np
    from flax import nnx


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GradientTolerance:
    """How a leaf of one dtype is checked.

    An element passes when ``|analytic - numeric| <= atol + rtol * |numeric|``.

    Attributes:
        step: The central-difference step, relative to ``max(1, |x|)``.
        rtol: The relative tolerance.
        atol: The absolute tolerance.

    Example:
        >>> from substrax.testing import GRADIENT_TOLERANCES, GradientTolerance
        >>> GRADIENT_TOLERANCES["float32"].rtol
        0.002
        >>> GradientTolerance(step=1e-3, rtol=1e-2, atol=1e-4).atol
        0.0001
    """

    step: float
    rtol: float
    atol: float

    def __post_init__(self) -> None:
        check_float("step", self.step, minimum=0.0, exclusive_minimum=True)
        check_float("rtol", self.rtol, minimum=0.0)
        check_float("atol", self.atol, minimum=0.0)


GRADIENT_TOLERANCES: Final[Mapping[str, GradientTolerance]] = MappingProxyType(
    {
        "float64": GradientTolerance(step=1e-6, rtol=1e-6, atol=1e-9),
        "float32": GradientTolerance(step=1e-3, rtol=2e-3, atol=1e-5),
        "float16": GradientTolerance(step=1e-2, rtol=1e-2, atol=1e-3),
        "bfloat16": GradientTolerance(step=1e-2, rtol=5e-2, atol=1e-2),
    }
)
"""The default tolerance of each floating dtype, by name: the analytic gradient in that dtype
against a float64 reference. Pass ``tolerance=`` for another dtype or a looser check."""

MODES: Final = ("rev", "fwd")
_TINY = 1e-300  # an allowance of 0 (rtol = atol = 0) makes any error infinitely bad


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LeafGradientCheck:
    """The worst element of one leaf (for one mode) in a gradient check.

    Attributes:
        path: The leaf's path (``"layers/0/kernel"``; ``"input"`` for the input).
        mode: ``"rev"`` (``jax.grad``) or ``"fwd"`` (``jax.jvp``).
        dtype: The leaf's dtype name.
        index: The worst element's index in the leaf.
        analytic: jax's derivative there.
        numeric: The central difference there (float64).
        max_abs_error: The largest ``|analytic - numeric|`` over the checked elements.
        max_rel_error: The largest relative error over them.
        checked: How many elements were checked.
        failing: How many were out of tolerance.

    Example:
        >>> from substrax.testing import LeafGradientCheck
        >>> leaf = LeafGradientCheck(
        ...     path="kernel", mode="rev", dtype="float32", index=(0, 1), analytic=1.0,
        ...     numeric=1.5, max_abs_error=0.5, max_rel_error=1 / 3, checked=4, failing=1,
        ... )
        >>> leaf.describe()
        'kernel[0, 1] (rev, float32): analytic 1, numeric 1.5; max abs error 0.5, max rel error 0.333; 1 of 4 checked elements out of tolerance'
    """

    path: str
    mode: str
    dtype: str
    index: tuple[int, ...]
    analytic: float
    numeric: float
    max_abs_error: float
    max_rel_error: float
    checked: int
    failing: int

    def describe(self) -> str:
        """One line: where, both values, the errors and how many elements failed.

        Returns:
            The line.
        """
        where = f"[{', '.join(map(str, self.index))}]" if self.index else ""
        return (
            f"{self.path}{where} ({self.mode}, {self.dtype}): analytic {self.analytic:.6g}, "
            f"numeric {self.numeric:.6g}; max abs error {self.max_abs_error:.3g}, max rel error "
            f"{self.max_rel_error:.3g}; {self.failing} of {self.checked} checked elements out of "
            "tolerance"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Leaf:
    path: str
    value: "jax.Array"


def _flax(who: str) -> Any:  # noqa: ANN401 - flax.nnx, untyped here
    return require("flax.nnx", who=who, distribution="substrax-runtime", extra="nnx")


def _leaves(tree: object, who: str) -> list[_Leaf]:
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    leaves: list[_Leaf] = []
    for entries, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        path = entries
        if len(path) > 1 and isinstance(path[-1], jax.tree_util.GetAttrKey):
            path = path[:-1]  # an nnx Variable's own ``value`` entry
        name = jax.tree_util.keystr(path, simple=True, separator="/") or "input"
        array = jnp.asarray(value)
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise TypeError(
                f"{who} differentiates floating arrays only; {name} is {array.dtype} (check "
                "parameters with a wrt filter that leaves it out, or an input that is floats)"
            )
        leaves.append(_Leaf(name, array))
    return leaves


def _tolerance(dtype: str, chosen: GradientTolerance | None) -> GradientTolerance:
    if chosen is not None:
        return chosen
    try:
        return GRADIENT_TOLERANCES[dtype]
    except KeyError:
        known = ", ".join(GRADIENT_TOLERANCES)
        raise ValueError(
            f"no default gradient tolerance for {dtype} (known: {known}); pass tolerance="
        ) from None


def _check_modes(modes: Sequence[str]) -> tuple[str, ...]:
    chosen = tuple(modes)
    unknown = [mode for mode in chosen if mode not in MODES]
    if unknown or not chosen:
        raise ValueError(f"modes must be some of {MODES}, not {chosen!r}")
    return chosen


def _sample(size: int, samples: int, seed: int, position: int) -> "np.ndarray":
    import numpy as np  # noqa: PLC0415

    if size <= samples:
        return np.arange(size)
    generator = np.random.default_rng([seed, position])
    return np.sort(generator.choice(size, samples, replace=False))


def _numeric(
    function: Callable[[PyTree, PyTree], PyTree],
    aux: PyTree,
    *,
    rebuild: Callable[[list["jax.Array"]], PyTree],
    leaves: Sequence[_Leaf],
    picked: Sequence["np.ndarray"],
    tolerances: Sequence[GradientTolerance],
) -> list["np.ndarray"]:
    """Central differences of ``function`` on a float64 copy, at each picked element.

    One compiled call per leaf evaluates every moved copy of it (``jax.vmap`` over them).
    """
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    numeric: list[np.ndarray] = []
    with jax.enable_x64(True):
        wide = [np.asarray(leaf.value, dtype=np.float64) for leaf in leaves]
        for position, indices in enumerate(picked):
            base = wide[position]
            x = base.ravel()[indices]
            steps = tolerances[position].step * np.maximum(1.0, np.abs(x))
            moved = np.repeat(base.reshape(1, -1), 2 * len(indices), axis=0)
            rows = np.arange(len(indices))
            moved[rows, indices] += steps
            moved[rows + len(indices), indices] -= steps
            losses = np.asarray(
                _at_leaf(function, rebuild, position)(moved.reshape(-1, *base.shape), wide, aux),
                dtype=np.float64,
            )
            numeric.append((losses[: len(indices)] - losses[len(indices) :]) / (2 * steps))
    return numeric


def _at_leaf(
    function: Callable[[PyTree, PyTree], PyTree],
    rebuild: Callable[[list["jax.Array"]], PyTree],
    position: int,
) -> Callable[..., "jax.Array"]:
    """``function`` with one leaf replaced, vmapped over a stack of that leaf's values."""
    import jax  # noqa: PLC0415

    def evaluate(leaf: "jax.Array", values: list["jax.Array"], aux: PyTree) -> PyTree:
        return function(rebuild([*values[:position], leaf, *values[position + 1 :]]), aux)

    return jax.jit(jax.vmap(evaluate, in_axes=(0, None, None)))


def _forward(
    function: Callable[[PyTree, PyTree], PyTree],
    tree: PyTree,
    aux: PyTree,
    *,
    leaves: Sequence[_Leaf],
    position: int,
    indices: "np.ndarray",
) -> "np.ndarray":
    """``jax.jvp`` along each picked element's unit vector of one leaf, in one vmapped call."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    treedef = jax.tree.structure(tree)
    leaf = leaves[position]
    zeros = [jnp.zeros_like(other.value) for other in leaves]

    def along(unit: "jax.Array", values: PyTree, aux: PyTree) -> PyTree:
        tangents = [*zeros[:position], unit, *zeros[position + 1 :]]
        tangent = jax.tree.unflatten(treedef, tangents)
        return jax.jvp(lambda v: function(v, aux), (values,), (tangent,))[1]

    units = np.zeros((len(indices), leaf.value.size), dtype=leaf.value.dtype)
    units[np.arange(len(indices)), indices] = 1
    stacked = jnp.asarray(units.reshape(-1, *leaf.value.shape))
    derivatives = jax.jit(jax.vmap(along, in_axes=(0, None, None)))(stacked, tree, aux)
    return np.asarray(derivatives, dtype=np.float64)


def _check(
    function: Callable[[PyTree, PyTree], PyTree],
    tree: PyTree,
    aux: PyTree,
    *,
    who: str,
    what: str,
    modes: Sequence[str],
    samples: int,
    seed: int,
    tolerance: GradientTolerance | None,
    allow_zero: bool,
) -> PyTree:
    """Check ``function(tree, aux)``'s gradient in ``tree``; return it (in its dtypes).

    ``aux`` (the rest of the model's state) is passed into every jitted call rather than
    closed over, so nnx variables merged from it (an RNG count) belong to that trace.
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from ._errors import GradientMismatchError, ZeroGradientError  # noqa: PLC0415 - a cycle

    chosen_modes = _check_modes(modes)
    count = check_int("samples", samples, minimum=1)
    leaves = _leaves(tree, who)
    tolerances = [_tolerance(leaf.value.dtype.name, tolerance) for leaf in leaves]
    output = jax.eval_shape(function, tree, aux)
    if getattr(output, "shape", None) != ():
        raise TypeError(f"{who}: the loss must return a scalar, not {output}")

    gradient = jax.jit(jax.grad(function))(tree, aux)
    flat_gradient = jax.tree.leaves(gradient)
    if not allow_zero and all(not bool(jnp.any(g != 0)) for g in flat_gradient):
        raise ZeroGradientError(what, len(flat_gradient))

    picked = [
        _sample(leaf.value.size, count, seed, position) for position, leaf in enumerate(leaves)
    ]
    numeric = _numeric(
        function,
        aux,
        rebuild=partial(jax.tree.unflatten, jax.tree.structure(tree)),
        leaves=leaves,
        picked=picked,
        tolerances=tolerances,
    )
    results: list[tuple[float, LeafGradientCheck]] = []
    for mode in chosen_modes:
        for position, leaf in enumerate(leaves):
            indices = picked[position]
            if mode == "rev":
                analytic = np.asarray(flat_gradient[position], dtype=np.float64).ravel()[indices]
            else:
                analytic = _forward(
                    function, tree, aux, leaves=leaves, position=position, indices=indices
                )
            results.append(
                _compare(
                    leaf,
                    mode=mode,
                    indices=indices,
                    analytic=analytic,
                    numeric=numeric[position],
                    tolerance=tolerances[position],
                )
            )
    if any(check.failing for _, check in results):
        _, worst = max(results, key=lambda scored: scored[0])
        raise GradientMismatchError(worst, tuple(check for _, check in results))
    return gradient


def _compare(
    leaf: _Leaf,
    *,
    mode: str,
    indices: "np.ndarray",
    analytic: "np.ndarray",
    numeric: "np.ndarray",
    tolerance: GradientTolerance,
) -> tuple[float, LeafGradientCheck]:
    """The leaf's worst element (by error over its allowance, NaN worst) and its summary."""
    import numpy as np  # noqa: PLC0415

    error = np.abs(analytic - numeric)
    relative = error / np.maximum(np.abs(numeric), np.finfo(np.float64).tiny)
    allowed = tolerance.atol + tolerance.rtol * np.abs(numeric)
    bad = ~(error <= allowed)  # NaN is out of tolerance
    score = np.where(np.isfinite(error), error / np.maximum(allowed, _TINY), np.inf)
    worst = int(np.argmax(score))
    index = np.unravel_index(int(indices[worst]), leaf.value.shape)
    return float(score[worst]), LeafGradientCheck(
        path=leaf.path,
        mode=mode,
        dtype=leaf.value.dtype.name,
        index=tuple(int(i) for i in index),
        analytic=float(analytic[worst]),
        numeric=float(numeric[worst]),
        max_abs_error=float(np.nanmax(error)) if np.isfinite(error).any() else math.inf,
        max_rel_error=float(np.nanmax(relative)) if np.isfinite(relative).any() else math.inf,
        checked=len(indices),
        failing=int(bad.sum()),
    )


def check_parameter_gradients(
    module: "nnx.Module",
    loss: "Callable[[nnx.Module], jax.Array]",
    *,
    wrt: "nnx.filterlib.Filter | None" = None,
    modes: Sequence[str] = MODES,
    samples: int = 16,
    seed: int = 0,
    tolerance: GradientTolerance | None = None,
    allow_zero: bool = False,
) -> "nnx.State[Any, Any]":
    """Check ``loss(module)``'s gradients with respect to the parameters by finite differences.

    Each parameter leaf's gradient, computed by jax in the leaf's own dtype, is compared on
    ``samples`` elements (all of a smaller leaf, the same ones for a given ``seed``) with a
    central difference of the loss on a float64 copy of the parameters. The tolerance is the
    leaf dtype's in :data:`GRADIENT_TOLERANCES` unless ``tolerance`` is given. The module is
    not changed: each evaluation runs on a copy merged from its state, so batch statistics
    and RNG counts are not updated.

    The reference is only as precise as the loss's arithmetic: a layer that computes in a
    lower dtype than its parameters (nnx's ``dtype=``) limits it, so check such a model with
    its compute dtype left to the parameters'. Under x64, random draws differ from float32's:
    make stochastic layers deterministic (``nnx.Dropout(..., deterministic=True)``) for the
    check.

    Args:
        module: The nnx model.
        loss: ``loss(model) -> scalar``; the data it needs is closed over.
        wrt: The nnx filter of the variables to check (default ``nnx.Param``).
        modes: ``"rev"`` (``jax.grad``), ``"fwd"`` (``jax.jvp``) or both.
        samples: Elements checked per leaf.
        seed: Picks the elements of leaves larger than ``samples``.
        tolerance: One tolerance for every leaf, instead of the per-dtype defaults.
        allow_zero: Accept a gradient that is zero everywhere.

    Returns:
        The gradients (an ``nnx.State`` shaped like the checked variables).

    Raises:
        GradientMismatchError: An element is out of tolerance; names the worst leaf.
        ZeroGradientError: Every gradient is zero and ``allow_zero`` is False.
        TypeError: The loss is not a scalar, or a checked variable is not floating.
        ValueError: An unknown mode, or a dtype with no default tolerance.
        MissingExtraError: flax is not installed (the ``nnx`` extra).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from substrax.testing import check_parameter_gradients
        >>> model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        >>> x = jnp.arange(6.0).reshape(2, 3)
        >>> grads = check_parameter_gradients(model, lambda m: jnp.tanh(m(x)).sum())
        >>> grads["kernel"].get_value().shape
        (3, 2)
    """
    nnx = _flax("check_parameter_gradients")
    graphdef, params, rest = nnx.split(module, nnx.Param if wrt is None else wrt, ...)

    def function(values: PyTree, others: PyTree) -> PyTree:
        return loss(nnx.merge(graphdef, values, others, copy=True))

    return _check(
        function,
        params,
        rest,
        who="check_parameter_gradients",
        what="parameters",
        modes=modes,
        samples=samples,
        seed=seed,
        tolerance=tolerance,
        allow_zero=allow_zero,
    )


def check_input_gradients(
    module: "nnx.Module",
    loss: "Callable[[nnx.Module, jax.Array], jax.Array]",
    value: "jax.Array",
    *,
    modes: Sequence[str] = MODES,
    samples: int = 16,
    seed: int = 0,
    tolerance: GradientTolerance | None = None,
    allow_zero: bool = False,
) -> "jax.Array":
    """Check ``loss(module, value)``'s gradient with respect to ``value`` by finite differences.

    The same check as :func:`check_parameter_gradients`, with the input as the one leaf
    (named ``"input"``): jax's gradient in the input's dtype against central differences on
    a float64 copy, on ``samples`` elements.

    Args:
        module: The nnx model (not changed).
        loss: ``loss(model, value) -> scalar``.
        value: The floating input to differentiate at.
        modes: ``"rev"`` (``jax.grad``), ``"fwd"`` (``jax.jvp``) or both.
        samples: Elements checked.
        seed: Picks the elements when ``value`` has more than ``samples``.
        tolerance: Instead of the default for ``value``'s dtype.
        allow_zero: Accept a gradient that is zero everywhere.

    Returns:
        The gradient, shaped like ``value``.

    Raises:
        GradientMismatchError: An element is out of tolerance.
        ZeroGradientError: The gradient is zero everywhere and ``allow_zero`` is False.
        TypeError: The loss is not a scalar, or ``value`` is not floating.
        ValueError: An unknown mode, or a dtype with no default tolerance.
        MissingExtraError: flax is not installed (the ``nnx`` extra).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from substrax.testing import check_input_gradients
        >>> model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
        >>> grad = check_input_gradients(model, lambda m, x: (m(x) ** 2).mean(), jnp.ones((4, 3)))
        >>> grad.shape
        (4, 3)
    """
    nnx = _flax("check_input_gradients")
    graphdef, state = nnx.split(module)

    def function(values: PyTree, others: PyTree) -> PyTree:
        return loss(nnx.merge(graphdef, others, copy=True), values)

    return _check(
        function,
        value,
        state,
        who="check_input_gradients",
        what="input",
        modes=modes,
        samples=samples,
        seed=seed,
        tolerance=tolerance,
        allow_zero=allow_zero,
    )
