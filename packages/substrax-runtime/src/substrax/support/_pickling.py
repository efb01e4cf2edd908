"""Errors that survive pickling, so one raised in a worker process arrives whole in its parent."""

from typing import Any, ClassVar, cast


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

    A package's errors show the name users import them by (``substrax.compute.RunStoreError``,
    not ``substrax.compute._errors.RunStoreError``) in tracebacks, docs and pickles: either a
    class sets ``__module__`` in its body, or the package declares its errors under one private
    base, ``class _ComputeError(StructuredError, public_module="substrax.compute")``, and every
    public class below that base takes the public module (the base, and any class whose name
    starts with ``_``, keeps its own).

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
    _public_module: ClassVar[str | None] = None

    def __init_subclass__(cls, *, public_module: str | None = None) -> None:
        super().__init_subclass__()
        if public_module is not None:
            cls._public_module = public_module
        elif cls._public_module is not None and not cls.__name__.startswith("_"):
            cls.__module__ = cls._public_module  # a private class is no name of the package

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
