"""Errors that survive pickling, so one raised in a worker process arrives whole in its parent."""

from typing import Any, cast


class PicklableError:
    """A mixin that pickles an error by its ``args`` and attributes, never calling ``__init__``.

    Python pickles an exception as ``type(error)(*error.args)``: an ``__init__`` that takes
    keyword or structured arguments and builds its message then fails on unpickling (a
    ``ProcessPoolExecutor`` reports ``BrokenProcessPool`` instead of the error), or takes the
    message for its first argument. Put this mixin first among the bases of an error class
    (``class StepError(PicklableError, LookupError)``); its subclasses inherit it. The copy is
    made with the class's ``__new__``, its builtin base's ``__init__`` (so an ``OSError``
    keeps its ``errno``, ``strerror`` and ``filename``, an ``ImportError`` its ``msg``) and the
    original's ``args`` and attributes: same type, same ``str()``, same attributes. The class
    must not define ``__new__``.

    Example:
        >>> import pickle
        >>> from substrax.support import MissingExtraError, PicklableError
        >>> issubclass(MissingExtraError, PicklableError)
        True
        >>> error = MissingExtraError(
        ...     "WandbLogger", "wandb", distribution="substrax-tracking", extra="wandb"
        ... )
        >>> copy = pickle.loads(pickle.dumps(error))
        >>> type(copy) is MissingExtraError, copy.extra, str(copy) == str(error)
        (True, 'wandb', True)
    """

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        """The rebuild that skips ``__init__``, with the builtin base's own args and state."""
        cls = cast("type[BaseException]", type(self))
        _, args, *state = cast("tuple[Any, ...]", builtin_base(cls).__reduce__(cast("Any", self)))
        return (_rebuild_error, (cls, args), *state)


def builtin_base(cls: type[BaseException]) -> type[BaseException]:
    return next(
        base
        for base in cls.__mro__
        if base.__module__ == "builtins" and issubclass(base, BaseException)
    )


def _rebuild_error(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    error = cls.__new__(cls, *args)
    builtin_base(cls).__init__(error, *args)
    return error
