"""Refusing nnx Variables that hold a ``jax.Ref`` or are hijax values, where arrays are needed.

flax makes such Variables under ``nnx.var_defaults(ref=True)`` or ``hijax=True``. jax's
transformations, orbax and sharding take arrays, and their own errors name neither the
Variable nor the way back: ``nnx.with_vars(model, ref=False, hijax=False)``.
"""

import sys


def check_array_variables(tree: object, who: str, *, hijax: bool = True) -> None:
    """Refuse ``tree`` when one of its Variables holds a ``jax.Ref`` or is a hijax Variable.

    Told by the Variable's own ``ref`` and ``hijax`` flags, so an abstract state (from
    ``nnx.eval_shape``) is told too; a bare ``jax.Ref`` leaf is refused as well. ``hijax=False``
    lets hijax Variables pass (where ``who`` works with them). A tree without them passes after
    one walk; flax is never imported (a process that has not imported ``flax.nnx`` has none).

    Raises:
        TypeError: naming ``who``, the first such Variable's path and how to convert the model.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from substrax.support import check_array_variables
        >>> check_array_variables({"w": jnp.ones(2)}, "TrainStep")
        >>> check_array_variables({"w": jax.new_ref(jnp.ones(2))}, "TrainStep")
        Traceback (most recent call last):
        ...
        TypeError: TrainStep takes Variables that hold arrays; w holds a jax.Ref (a Variable made with ref=True): pass nnx.with_vars(model, ref=False, hijax=False), or build the model without ref=True or hijax=True
    """
    import jax  # noqa: PLC0415 - only where a tree is checked

    variable = getattr(sys.modules.get("flax.nnx"), "Variable", None)

    def is_variable(leaf: object) -> bool:
        return variable is not None and isinstance(leaf, variable)

    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_variable)[0]:
        if isinstance(leaf, jax.Ref) or (is_variable(leaf) and getattr(leaf, "ref", False)):
            kind = "a jax.Ref (a Variable made with ref=True)"
        elif hijax and is_variable(leaf) and getattr(leaf, "hijax", False):
            kind = "a hijax value (a Variable made with hijax=True)"
        else:
            continue
        name = jax.tree_util.keystr(path, simple=True, separator="/") or "the value"
        raise TypeError(
            f"{who} takes Variables that hold arrays; {name} holds {kind}: pass "
            "nnx.with_vars(model, ref=False, hijax=False), or build the model without ref=True "
            "or hijax=True"
        )
