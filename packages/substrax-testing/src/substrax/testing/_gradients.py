"""Check an nnx model's gradients against finite differences, one leaf at a time.

The loss becomes a function of a sample of one leaf's elements: its value is computed on a float64
copy (in ``jax.enable_x64(True)``, thread-local), its derivative (a custom rule) is jax's on the
leaves as given (``jax.jvp`` for ``"fwd"``, ``jax.grad`` for ``"rev"``) at the point checked, and
``jax.test_util.check_grads`` checks it along a random direction. In ``"rev"`` each sampled
element is also compared with its own central difference (``_gradient_elements``), since the
direction's sum can hide a small element that is wrong; in ``"fwd"`` only a failed direction is.
A :class:`GradientMismatchError` names the worst leaf, mode and element, caused by
``check_grads``' error where it failed. Importing this imports no jax.
"""

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from substrax.support import check_int, require
from substrax.typing import PyTree

from ._gradient_elements import Result, check_modes, finer_steps, localize, raise_worst, retried
from ._gradient_records import (
    GradientTolerance,
    LeafGradientCheck,
    rounding_allowance,
    tolerance_for,
)
from ._gradient_refusals import refuse_blind, refuse_gradient, widened_loss


if TYPE_CHECKING:
    import jax
    import numpy as np
    from flax import nnx


MODES: Final = ("rev", "fwd")
_TINY = 1e-300  # check_grads reads a zero tolerance as "use numpy's default"


def _flax(who: str) -> Any:  # noqa: ANN401 - flax.nnx, untyped here
    return require("flax.nnx", who=who, distribution="substrax-runtime", extra="nnx")


def _check_module(nnx: Any, module: object, who: str) -> None:  # noqa: ANN401 - flax.nnx
    if not isinstance(module, nnx.Module):
        raise TypeError(
            f"{who} checks an nnx.Module's gradients, not {module!r} ({type(module).__name__}); "
            "hold the parameters of a plain function as nnx.Param attributes of an nnx.Module "
            "and pass that module"
        )


def _read_refs(tree: PyTree) -> PyTree:
    """``tree`` with each ``jax.Ref`` read: an nnx Variable made with ``ref=True`` holds one.

    jax differentiates arrays, not references, and ``nnx.merge`` rebuilds the module from the
    arrays; the module's own references are left as they were.
    """
    import jax  # noqa: PLC0415

    return jax.tree.map(lambda leaf: leaf[...] if isinstance(leaf, jax.Ref) else leaf, tree)


def _leaves(tree: object, who: str) -> list[tuple[str, "jax.Array"]]:
    """Each leaf's path (``"input"`` for a bare array) and value; refuses a non-floating one."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    leaves: list[tuple[str, jax.Array]] = []
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if len(path) > 1 and isinstance(path[-1], jax.tree_util.GetAttrKey):
            path = path[:-1]  # an nnx Variable's own ``value`` entry  # noqa: PLW2901
        name = jax.tree_util.keystr(path, simple=True, separator="/") or "input"
        array = jnp.asarray(value)
        if not jnp.issubdtype(array.dtype, jnp.floating):
            fix = "a wrt filter that leaves it out" if path else "x.astype(jnp.float32), say"
            raise TypeError(
                f"{who} differentiates floating arrays only; {name} is {array.dtype}: pass {fix}"
            )
        leaves.append((name, array))
    return leaves


def _floating(value: object) -> bool:
    import jax.numpy as jnp  # noqa: PLC0415

    return isinstance(value, jnp.ndarray) and jnp.issubdtype(value.dtype, jnp.floating)


def _placed(
    values: "np.ndarray | jax.Array",
    dtype: "type[Any] | np.dtype[Any]",
    indices: "np.ndarray",
    shape: tuple[int, ...],
) -> "np.ndarray | jax.Array":
    """``values`` (as ``dtype``) at the flat ``indices`` of zeros shaped ``shape``.

    numpy places numpy values (the check's own, each call): the same cast and sums as jax's,
    with no op dispatched, nor compiled for each new shape. jax places a jax array or tracer.
    """
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    if not isinstance(values, np.ndarray):
        return (
            jnp.zeros(math.prod(shape), dtype).at[indices].set(values.astype(dtype)).reshape(shape)
        )
    placed = np.zeros(math.prod(shape), dtype)
    placed[indices] = values.astype(dtype)
    return placed.reshape(shape)


def _check_leaf(
    reference: Callable[["np.ndarray"], "jax.Array"],
    along: Callable[["jax.Array"], "jax.Array"],
    gradient: "np.ndarray",
    start: "np.ndarray",
    leaf: tuple[str, str, str, GradientTolerance, tuple["np.ndarray", tuple[int, ...]]],
) -> tuple[float, LeafGradientCheck, bool, AssertionError | None]:
    """``check_grads`` on ``reference`` at ``start`` (a step per element), with jax's derivative.

    That is ``along(t)`` (fwd) or ``gradient`` (rev); ``leaf``: path, dtype, mode, tolerance,
    and the sampled elements' flat indices and the leaf's shape. In rev, and after a failure,
    each element is compared on its own. Returns the worst element's error over its allowance,
    the summary, whether the leaf failed and ``check_grads``' error (None where it passed).
    """
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.test_util import check_grads  # noqa: PLC0415

    path, dtype, mode, tolerance, where = leaf
    scale = np.maximum(1.0, np.abs(start))  # each element's step: tolerance.step * scale

    def moved(d: "jax.Array") -> "jax.Array":  # check_grads' step in d is the step in x / scale
        return reference(start + scale * d)

    if mode == "fwd":
        checked = jax.custom_jvp(moved)
        checked.defjvp(lambda d, t: (moved(*d), along(t[0] * scale)))
    else:
        checked = jax.custom_vjp(moved)
        checked.defvjp(lambda d: (moved(d), None), lambda _, c: (c * gradient * scale,))
    # the direction's difference is rounded too (times check_grads' random cotangent, ~N(0, 1))
    level = np.asarray(reference(start))
    rounding = 4 * float(
        rounding_allowance(float(np.finfo(level.dtype).eps), level, tolerance.step)
    )
    atol, rtol = tolerance.atol + rounding or _TINY, tolerance.rtol or _TINY  # 0: numpy's default
    error = None
    try:
        check_grads(checked, (np.zeros_like(start),), 1, (mode,), atol, rtol, tolerance.step)
    except AssertionError as caught:
        error = caught
    except TypeError as caught:  # jax.jvp refuses a custom_vjp function
        if mode == "fwd" and "custom_vjp" in str(caught):
            hint = f"{path}: forward mode cannot differentiate a custom_vjp; pass modes=('rev',)"
            raise TypeError(hint) from caught
        raise
    unknown = dict.fromkeys(("analytic", "numeric", "max_abs_error", "max_rel_error"), math.nan)
    summary = LeafGradientCheck(
        path=path, mode=mode, dtype=dtype, index=(), checked=start.size, failing=0, **unknown
    )
    summary = dataclasses.replace(summary, tolerance=tolerance)
    if error is None and mode == "fwd":  # one jvp per element: compared only after a failure
        return 0.0, summary, False, None
    # rev: jax's gradient is at hand, so each element is compared with its own difference
    steps = tolerance.step * scale
    score, found = localize(summary, reference, (gradient, along), start, eps=steps, where=where)
    if error is None and not found.failing:
        errors = {"max_abs_error": found.max_abs_error, "max_rel_error": found.max_rel_error}
        return 0.0, dataclasses.replace(summary, **errors), False, None
    return score, found, True, error


def _check(
    function: Callable[[PyTree, PyTree], PyTree],
    tree: PyTree,
    aux: PyTree,
    names: tuple[str, str, str],
    options: tuple[Sequence[str], int, int, GradientTolerance | None, bool],
) -> PyTree:
    """Check ``function(tree, aux)``'s gradient in ``tree``, leaf by leaf; return it.

    ``names``: the caller, what it differentiates, what to say when ``tree`` has no elements;
    ``options``: its keywords, in order. Leaves with no elements are skipped.
    """
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    (who, what, empty), (modes, samples, seed, tolerance, allow_zero) = names, options
    chosen = () if isinstance(modes, str) else tuple(modes)
    if not chosen or any(mode not in MODES for mode in chosen):
        raise ValueError(f"modes must be a non-empty sequence of some of {MODES}, not {modes!r}")
    check_int("samples", samples, minimum=1)
    check_int("seed", seed, minimum=0)
    leaves = _leaves(tree, who)
    if not any(value.size for _, value in leaves):
        raise ValueError(f"{who}: {empty}")
    tolerances = [tolerance_for(value.dtype.name, tolerance) for _, value in leaves]
    if getattr(output := jax.eval_shape(function, tree, aux), "shape", None) != ():
        raise TypeError(f"{who}: the loss must return a scalar, not {output}")
    value, gradient = jax.jit(jax.value_and_grad(function))(tree, aux)
    if not math.isfinite(float(value)):  # check_grads takes nan for nan as equal
        raise ValueError(f"{who}: the loss is {float(value)}; finite differences need it finite")
    flat_gradient = jax.tree.leaves(gradient)
    refuse_gradient((who, what), leaves, flat_gradient, allow_zero)

    flat, treedef = [value for _, value in leaves], jax.tree.structure(tree)
    tree = treedef.unflatten(flat)  # arrays, as ``jax.jvp`` wants them (not numpy or floats)
    loss = jax.jit(lambda values, others: function(values, others).astype(jnp.float64))

    def leaf_check(position: int, mode: str, finer: GradientTolerance | None) -> Result:
        """One leaf's check (at ``finer``'s step if given); leaves are never indexed."""
        (path, value), size = leaves[position], leaves[position][1].size
        indices = np.arange(size)  # or ``samples`` of them, picked by ``seed``
        if size > samples:
            picked = np.random.default_rng([seed, position]).choice(indices, samples, False)
            indices = np.sort(picked)
        start = wide[position].ravel()[indices]

        def reference(values: "np.ndarray") -> "jax.Array":
            moved = wide[position] + _placed(values - start, np.float64, indices, value.shape)
            return loss(treedef.unflatten([*wide[:position], moved, *wide[position + 1 :]]), rest)

        def along(t: "jax.Array") -> "jax.Array":
            tangents: list[Any] = [  # numpy's zeros for numpy's tangent, as _placed places it
                np.zeros(v.shape, v.dtype) if isinstance(t, np.ndarray) else jnp.zeros_like(v)
                for v in flat
            ]
            tangents[position] = _placed(t, value.dtype, indices, value.shape)
            return jax.jvp(lambda v: loss(v, aux), (tree,), (treedef.unflatten(tangents),))[1]

        grad = np.asarray(flat_gradient[position], dtype=np.float64).ravel()[indices]
        about = (
            path,
            value.dtype.name,
            mode,
            finer or tolerances[position],
            (indices, value.shape),
        )
        return _check_leaf(reference, along, grad, start, about)

    # float64 meets float32 data a loss closes over (a strict promotion refuses it); the other
    # state (batch statistics) is widened too: a float64 update written into float32 warns
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        wide = [np.asarray(value, dtype=np.float64) for value in flat]
        rest = jax.tree.map(lambda x: x.astype(np.float64) if _floating(x) else x, aux)
        level = widened_loss(who, what, lambda: loss(treedef.unflatten(wide), rest))
        positions = [position for position, value in enumerate(flat) if value.size]
        finer = finer_steps(  # a tolerance= is used as given: no retry
            None if tolerance is not None else tolerances,
            level,
            lambda: jax.eval_shape(function, treedef.unflatten(wide), rest).dtype,
        )
        results, note = check_modes(retried(leaf_check, finer), chosen, positions, who)
        if any(result[2] for result in results):  # is the reference the loss? (not raised yet)
            raise_worst(who, results, (function, (treedef.unflatten(wide), rest), value), note)
    if not allow_zero:  # passed: but a gradient within its allowance everywhere passes anyhow
        refuse_blind(what, leaves, flat_gradient, tolerances, level)
    return gradient


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

    Each parameter leaf is checked on its own, on ``samples`` of its elements (``seed`` picks
    them; one with none is skipped), against central differences of the loss on a float64 copy
    (each element's step ``step * max(1, |x|)``), within the dtype's
    :data:`GRADIENT_TOLERANCES` or ``tolerance``: ``|analytic - numeric| <= atol + rtol *
    |numeric|``, plus the difference's own rounding (``10 * eps * |loss| / step``). In
    ``"rev"`` mode every sampled element of jax's gradient (in the leaf's dtype) must meet it
    against its own difference, and ``jax.test_util.check_grads`` must pass along a random
    direction of them; in ``"fwd"`` mode ``check_grads`` checks ``jax.jvp`` along a random
    direction (the elements are compared one by one only to report a failure). The module is
    not changed (batch statistics and RNG counts neither). A leaf that fails with its dtype's
    default step (float32's ``1e-3`` can cross a ReLU's kink) is checked again at float64's,
    ``1e-6`` (:func:`~substrax.testing._gradient_elements.finer_step`), where the loss is float64
    under the reference and no ``tolerance=`` was given. The reference is only as precise as
    the loss: leave a layer's compute ``dtype=`` to its parameters', and make dropout
    deterministic (x64 draws differ).

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
        GradientMismatchError: A leaf is out of tolerance; names the worst leaf and mode.
        ZeroGradientError: Every gradient is zero and ``allow_zero`` is False.
        TypeError: ``module`` is not an ``nnx.Module``, the loss is not a scalar, a checked
            leaf not floating, a bad ``tolerance``.
        ValueError: Unknown modes, ``samples < 1``, ``seed < 0``, a dtype with no default, a
            ``wrt`` that selects no elements, a non-finite loss or gradient, or a failed check
            whose float64 reference is not the loss or not float64, its rounding enough to
            explain the failure (named, with the worst leaf; more is a mismatch, noted).
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
    _check_module(nnx, module, "check_parameter_gradients")
    graphdef, params, rest = nnx.split(module, nnx.Param if wrt is None else wrt, ...)
    params, rest = _read_refs(params), _read_refs(rest)

    def function(values: PyTree, others: PyTree) -> PyTree:
        return loss(nnx.merge(graphdef, values, others, copy=True))

    options = (modes, samples, seed, tolerance, allow_zero)
    label = "nnx.Param (the default)" if wrt is None else getattr(wrt, "__name__", repr(wrt))
    empty = (
        f"wrt={label} selects no variable with elements in {type(module).__name__}, so nothing "
        "would be checked; pass a wrt filter that selects the parameters to check"
    )
    names = ("check_parameter_gradients", "parameters", empty)
    return _check(function, params, rest, names, options)


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

    The check of :func:`check_parameter_gradients`, on the input as the one leaf (``"input"``).

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
        GradientMismatchError: The input is out of tolerance in a mode.
        ZeroGradientError: The gradient is zero everywhere and ``allow_zero`` is False.
        TypeError, ValueError, MissingExtraError: As :func:`check_parameter_gradients`.

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
    _check_module(nnx, module, "check_input_gradients")
    graphdef, state = nnx.split(module)
    state, value = _read_refs(state), _read_refs(value)

    def function(values: PyTree, others: PyTree) -> PyTree:
        return loss(nnx.merge(graphdef, others, copy=True), values)

    options = (modes, samples, seed, tolerance, allow_zero)
    empty = "the input has no elements, so nothing would be checked; pass one with some"
    return _check(function, value, state, ("check_input_gradients", "input", empty), options)
