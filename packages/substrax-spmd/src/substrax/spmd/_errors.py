"""The errors of ``substrax.spmd``."""

from typing import TYPE_CHECKING

from substrax.support import StructuredError


if TYPE_CHECKING:
    from jax.sharding import PartitionSpec
else:
    PartitionSpec = object  # the class itself would load jax with the errors: a runtime stand-in


class _SpmdError(StructuredError, public_module="substrax.spmd"):
    """The base of every error here: each shows as ``substrax.spmd``'s, where users import it."""


class _BatchLeafError(_SpmdError):
    """A batch leaf refused: ``message``, the leaf's key path (``"['rows']['x']"``) and shape."""

    message: str
    path: str
    shape: tuple[int, ...]


class BatchPlacementError(_BatchLeafError, ValueError):
    """A batch leaf that its sharding cannot split.

    Attributes:
        message: The error's text.
        path: The leaf's key path, e.g. ``"['rows']['x']"``.
        shape: The leaf's shape.
        spec: The partition spec it was given.

    Example:
        >>> from jax.sharding import PartitionSpec
        >>> from substrax.spmd import BatchPlacementError
        >>> error = BatchPlacementError("7 rows", path="['x']", shape=(7,), spec=PartitionSpec("data"))
        >>> error.path, error.shape
        ("['x']", (7,))
    """

    spec: PartitionSpec


class UnknownReductionError(_SpmdError, ValueError):
    """A reduction name that is not mean, sum, max or min, or a name without a metric.

    Attributes:
        message: The error's text.
        name: The metric concerned.
        reduction: The reduction asked for.

    Example:
        >>> from substrax.spmd import UnknownReductionError
        >>> error = UnknownReductionError("no median", name="loss", reduction="median")
        >>> error.name, error.reduction
        ('loss', 'median')
    """

    message: str
    name: str
    reduction: object


class BatchSplitError(_BatchLeafError, ValueError):
    """A batch leaf that cannot be split into microbatches or into the steps of one call.

    Raised when a step with ``accumulate_steps=N`` gets a leaf whose leading dimension ``N``
    does not divide, or a step with ``steps_per_call=k`` gets a leaf whose leading dimension is
    not ``k``.

    Attributes:
        message: The error's text.
        path: The leaf's key path, e.g. ``"['x']"``.
        shape: The leaf's shape.
        parts: The number of microbatches or steps asked for.

    Example:
        >>> from substrax.spmd import BatchSplitError
        >>> error = BatchSplitError("10 rows in 4 microbatches", path="['x']", shape=(10,), parts=4)
        >>> error.path, error.shape, error.parts
        ("['x']", (10,), 4)
    """

    parts: int


class OptimizerMismatchError(_SpmdError, ValueError):
    """An optimizer whose state was built for another model than the one it is given with.

    Attributes:
        message: The error's text.
        path: The first optimizer-state leaf that differs, e.g. ``"[0].mu['kernel']"``.
        model_shape: The shape the model's parameters need there (None: the model has no leaf there).
        optimizer_shape: The shape the optimizer holds there (None: the optimizer has no leaf there).

    Example:
        >>> from substrax.spmd import OptimizerMismatchError
        >>> error = OptimizerMismatchError(
        ...     "built for another model", path="[0].mu['kernel']", model_shape=(4, 1), optimizer_shape=(4, 3)
        ... )
        >>> error.model_shape, error.optimizer_shape
        ((4, 1), (4, 3))
    """

    message: str
    path: str
    model_shape: tuple[int, ...] | None
    optimizer_shape: tuple[int, ...] | None


class UnknownAxisError(_SpmdError, NameError):
    """A collective asked for a mesh axis that the surrounding ``shard_map`` or ``pmap`` lacks.

    Attributes:
        message: The error's text.
        axis_name: The axis asked for.
        available: The axis names bound where the collective ran.

    Example:
        >>> from substrax.spmd import UnknownAxisError
        >>> error = UnknownAxisError("no batch axis", axis_name="batch", available=("data",))
        >>> error.axis_name, error.available
        ('batch', ('data',))
    """

    message: str
    axis_name: object
    available: tuple[str, ...]


class StateChangedError(_SpmdError, ValueError):
    """A step's state whose Variables changed under it: replaced, added, or grown in the step.

    A :class:`~substrax.spmd.TrainStep` tracks the Variable objects its model and optimizer held
    when it was built. A Variable or submodule replaced after that (``model.head =
    nnx.Linear(...)``, ``optimizer.opt_state = fresh.opt_state``) would never be read or written
    again, and a Variable that appears while the step runs (an ``nnx.Intermediate`` that
    ``sow`` leaves in the model) has no place in the step's fixed state.

    Attributes:
        message: The error's text.
        path: The Variable or node concerned, e.g. ``"model.down.kernel"``.

    Example:
        >>> from substrax.spmd import StateChangedError
        >>> error = StateChangedError("replaced", path="model.down.kernel")
        >>> error.path, isinstance(error, ValueError)
        ('model.down.kernel', True)
    """

    message: str
    path: str
