"""The errors of ``substrax.optim``."""

from substrax.support import StructuredError


class _OptimError(StructuredError, public_module="substrax.optim"):
    """The base of every error here: each shows as ``substrax.optim``'s, where users import it."""


class OptimizerConfigError(_OptimError, ValueError):
    """An optimizer configuration that cannot be built.

    Attributes:
        message: The error's text.
        field: The offending field.
        value: Its value.

    Example:
        >>> from substrax.optim import OptimizerConfigError
        >>> error = OptimizerConfigError("momentum is for sgd", field="momentum", value=0.9)
        >>> error.field, error.value
        ('momentum', 0.9)
    """

    message: str
    field: str
    value: object


class LineSearchStateError(_OptimError, ValueError):
    """An optimizer or model that a line-search update cannot run on reliably.

    Attributes:
        message: The error's text.
        paths: The offending leaves' key paths (weak types), or dtypes (mixed parameters).

    Example:
        >>> from substrax.optim import LineSearchStateError
        >>> LineSearchStateError("weakly typed leaves", paths=("['count']",)).paths
        ("['count']",)
    """

    message: str
    paths: tuple[str, ...]


class LearningRateNotFoundError(_OptimError, LookupError, ValueError):
    """An optimizer whose state holds no injected learning rate to read.

    Also a ``ValueError``, the error 0.1.22's ``current_learning_rate`` raised.

    Attributes:
        where: The state that holds none.

    Example:
        >>> from substrax.optim import LearningRateNotFoundError
        >>> str(LearningRateNotFoundError())[:44]
        'the optimizer state holds no injected learni'
    """

    template = (
        "{where} holds no injected learning_rate; wrap the optimizer in "
        "optax.inject_hyperparams (create_transformation does)"
    )
    where: str = "the optimizer state"
