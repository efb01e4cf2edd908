"""Typed JSON records read strictly: unknown fields refused, no coercion from strings."""

# record_type may be a generic alias (list[int]) at run time, not only a class.
# pyright: reportUnnecessaryIsInstance=false

import dataclasses
import functools
import json
from typing import TYPE_CHECKING, Any, cast


if TYPE_CHECKING:
    from pydantic import ConfigDict, TypeAdapter


# A plain dict (pydantic's ConfigDict is a TypedDict), so that importing this module imports no
# pydantic: it is loaded when a record is first read or dumped.
UNKNOWN_FIELDS_REFUSED: "ConfigDict" = {"extra": "forbid"}
"""Set as a record dataclass's ``__pydantic_config__`` so a misspelled key is refused."""


@functools.cache
def _adapter(record_type: object) -> "TypeAdapter[Any]":
    from pydantic import TypeAdapter  # noqa: PLC0415 - pydantic only when a record is validated

    return TypeAdapter(cast("Any", record_type))


def read_record[T](record_type: type[T], data: object) -> T:
    """Validate JSON-shaped ``data`` as ``record_type`` with strict JSON semantics.

    ``data`` goes through ``json.dumps`` and pydantic's strict JSON mode: numbers are never
    read from strings, a bool is not a number, an int is accepted for a float, tuples come from
    arrays, enums are read by value and datetimes from ISO strings. A record whose
    ``__pydantic_config__`` is ``UNKNOWN_FIELDS_REFUSED`` refuses unknown keys.

    Args:
        record_type: The record's type (a dataclass, pydantic model, TypedDict, ...).
        data: The decoded JSON (e.g. ``json.loads(text)``).

    Returns:
        The validated record.

    Raises:
        pydantic.ValidationError: ``data`` does not fit (a ``ValueError``).
        TypeError: ``data`` is not JSON-serialisable, or validation returned another type.

    Example:
        >>> from dataclasses import dataclass
        >>> from substrax.records import UNKNOWN_FIELDS_REFUSED, read_record
        >>> @dataclass(frozen=True)
        ... class Point:
        ...     __pydantic_config__ = UNKNOWN_FIELDS_REFUSED
        ...     x: float
        ...     tags: tuple[str, ...] = ()
        >>> read_record(Point, {"x": 1, "tags": ["a"]})
        Point(x=1.0, tags=('a',))
    """
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(f"record data for {record_type!r} is not JSON: {error}") from error
    record = _adapter(record_type).validate_json(text, strict=True)
    if isinstance(record_type, type) and not isinstance(record, record_type):
        raise TypeError(
            f"validating as {record_type.__name__} returned {type(record).__name__}, not the type"
        )
    return cast("T", record)


def dump_record(record: object) -> dict[str, Any]:
    """Dump a dataclass (or pydantic model) record as JSON-ready data.

    Args:
        record: A dataclass instance or pydantic model instance.

    Returns:
        A dict of JSON values (paths and datetimes as strings, enums by value).

    Raises:
        TypeError: ``record`` is not a dataclass or pydantic model instance.

    Example:
        >>> from dataclasses import dataclass
        >>> from substrax.records import dump_record
        >>> @dataclass
        ... class Point:
        ...     x: float
        >>> dump_record(Point(x=1.5))
        {'x': 1.5}
    """
    from pydantic import BaseModel  # noqa: PLC0415 - pydantic only when a record is dumped

    if isinstance(record, BaseModel):
        return record.model_dump(mode="json")
    if not dataclasses.is_dataclass(record) or isinstance(record, type):
        raise TypeError(f"dump_record takes a dataclass instance, got {type(record).__name__}")
    return _adapter(type(record)).dump_python(record, mode="json")
