"""The errors of ``substrax.optim``."""

from substrax.support import PicklableError


class OptimizerConfigError(PicklableError, ValueError):
    """An optimizer configuration that cannot be built.

    Attributes:
        field: The offending field.
        value: Its value.

    Example:
        >>> from substrax.optim import OptimizerConfigError
        >>> error = OptimizerConfigError("momentum is for sgd", field="momentum", value=0.9)
        >>> error.field, error.value
        ('momentum', 0.9)
    """

    __module__ = "substrax.optim"

    def __init__(self, message: str, *, field: str, value: object) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class LineSearchStateError(PicklableError, ValueError):
    """An optimizer or model that a line-search update cannot run on reliably.

    Attributes:
        paths: The offending leaves' key paths (weak types), or dtypes (mixed parameters).

    Example:
        >>> from substrax.optim import LineSearchStateError
        >>> LineSearchStateError("weakly typed leaves", paths=("['count']",)).paths
        ("['count']",)
    """

    __module__ = "substrax.optim"

    def __init__(self, message: str, *, paths: tuple[str, ...]) -> None:
        super().__init__(message)
        self.paths = paths


class LearningRateNotFoundError(PicklableError, LookupError):
    """An optimizer whose state holds no injected learning rate to read.

    Example:
        >>> from substrax.optim import LearningRateNotFoundError
        >>> str(LearningRateNotFoundError())[:44]
        'the optimizer state holds no injected learni'
    """

    __module__ = "substrax.optim"

    def __init__(self) -> None:
        super().__init__(
            "the optimizer state holds no injected learning_rate; wrap the optimizer in "
            "optax.inject_hyperparams (create_transformation does)"
        )
