"""Errors declared by their fields and a message template, the way every part writes them."""

import dataclasses
from typing import Any, ClassVar, cast, dataclass_transform

from ._pickling import PicklableError, builtin_base


@dataclass_transform(eq_default=False, field_specifiers=(dataclasses.field,))
class StructuredError(PicklableError):
    """An error whose annotated fields are its attributes and whose message is built from them.

    A subclass lists its fields as class annotations and its message as ``template``, a
    ``str.format`` pattern over the fields (``{step}``, ``{name!r}``); a message that needs more
    than a pattern overrides ``_message``. The constructor is generated from the fields, in
    order (``kw_only=True`` in the class statement makes them keyword-only), so the class body
    holds no assignments to repeat. A list given for a field is kept as a tuple, so the error
    never shows a caller's later edits. Put a builtin exception after it among the bases, as
    with ``PicklableError``, which it extends: instances pickle with their fields, and a
    package's private base can give them their public module (``public_module=``).

    Example:
        >>> from substrax.support import StructuredError
        >>> class StepMissingError(StructuredError, LookupError, kw_only=True):
        ...     template = "step {step} is not in {directory}; saved steps: {steps}"
        ...     step: int
        ...     directory: str
        ...     steps: tuple[int, ...] = ()
        >>> error = StepMissingError(step=3, directory="/runs/a", steps=(1, 2))
        >>> str(error), error.step
        ('step 3 is not in /runs/a; saved steps: (1, 2)', 3)
    """

    __slots__ = ()
    template: ClassVar[str] = "{message}"
    """The message pattern, formatted with the fields (overridden by ``_message`` if needed)."""

    def __init_subclass__(cls, *, kw_only: bool = False, public_module: str | None = None) -> None:
        super().__init_subclass__(public_module=public_module)
        # a plain dataclass: the fields become __init__'s parameters; eq and repr stay the
        # exception's own (identity, ``Name('message')``)
        dataclasses.dataclass(cls, eq=False, repr=False, kw_only=kw_only)

    def __post_init__(self) -> None:
        fields = self._fields()
        for name, value in fields.items():
            if isinstance(value, list):  # never share (and show later edits of) a caller's list
                fields[name] = tuple(cast("list[object]", value))
                setattr(self, name, fields[name])
        error = cast("BaseException", self)
        builtin_base(type(error)).__init__(error, self._message())
        for name, value in fields.items():  # the builtin resets its own (ImportError.name, ...)
            setattr(self, name, value)

    def __str__(self) -> str:
        """The message as written, a ``KeyError``'s too (whose own ``str()`` quotes it)."""
        args = cast("BaseException", self).args
        return str(args[0]) if len(args) == 1 else super().__str__()

    def _fields(self) -> dict[str, Any]:
        return {
            field.name: getattr(self, field.name) for field in dataclasses.fields(cast("Any", self))
        }

    def _message(self) -> str:
        """The error's text: ``template`` formatted with the fields."""
        return self.template.format_map(self._fields())
