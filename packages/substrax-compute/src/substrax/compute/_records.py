"""Strict reading of the JSON records compute writes for itself (run handles, manifests).

These records are written and read by the same release, so a few type checks replace pydantic:
``substrax-compute status`` reads them and must stay quick to start. Unknown and missing
fields, and values of the wrong type, are refused with :class:`RecordFormatError`.
"""

import re
from collections.abc import Mapping
from typing import Any, cast

from ._run_errors import RecordFormatError


type Kind = type | tuple[type, ...]

COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A name that is one path component: a job, task, extra, mount or backend name."""


def _matches(value: object, kind: Kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    if float in kinds and isinstance(value, int):
        return True
    return isinstance(value, kinds)


def _name(kind: Kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("null" if k is type(None) else k.__name__ for k in kinds)


def read_fields(
    data: object,
    *,
    source: object,
    required: Mapping[str, Kind],
    optional: Mapping[str, Kind] | None = None,
) -> dict[str, Any]:
    """``data`` as a dict, refused unless it has exactly these fields with values of these types.

    A bool is never taken for an int; an int is taken for a float.

    Raises:
        RecordFormatError: ``data`` is not an object, a field is unknown or missing, or a value
            has the wrong type.

    Example:
        >>> from substrax.compute._records import read_fields
        >>> read_fields({"job": "j", "node": 0}, source="m.json", required={"job": str},
        ...             optional={"node": int})
        {'job': 'j', 'node': 0}
        >>> read_fields({"job": 1}, source="m.json", required={"job": str})
        Traceback (most recent call last):
        ...
        substrax.compute.RecordFormatError: m.json: field 'job' is int 1, not str; it was not written by this substrax-compute release
    """
    if not isinstance(data, dict):
        raise RecordFormatError(source, f"holds {type(data).__name__}, not an object")
    record = cast("dict[str, Any]", data)
    kinds = {**required, **(optional or {})}
    unknown = sorted(set(record) - set(kinds))
    if unknown:
        raise RecordFormatError(source, f"unknown field(s) {', '.join(map(repr, unknown))}")
    missing = sorted(set(required) - set(record))
    if missing:
        raise RecordFormatError(source, f"missing field(s) {', '.join(map(repr, missing))}")
    for key, value in record.items():
        if not _matches(value, kinds[key]):
            raise RecordFormatError(
                source,
                f"field {key!r} is {type(value).__name__} {value!r}, not {_name(kinds[key])}",
            )
    return record


def strings(value: object, *, source: object, field: str) -> tuple[str, ...]:
    """A JSON list of strings as a tuple.

    Raises:
        RecordFormatError: ``value`` is not a list of strings.

    Example:
        >>> from substrax.compute._records import strings
        >>> strings(["a", "b"], source="m.json", field="argv")
        ('a', 'b')
    """
    if not isinstance(value, list | tuple) or not all(
        isinstance(item, str) for item in cast("list[object]", value)
    ):
        raise RecordFormatError(source, f"field {field!r} is {value!r}, not a list of strings")
    return tuple(cast("list[str]", value))


def string_map(value: object, *, source: object, field: str) -> dict[str, str]:
    """A JSON object of strings as a dict.

    Raises:
        RecordFormatError: ``value`` is not an object whose values are strings.

    Example:
        >>> from substrax.compute._records import string_map
        >>> string_map({"pid": "1"}, source="h.json", field="details")
        {'pid': '1'}
    """
    if not isinstance(value, dict) or not all(
        isinstance(item, str) for item in cast("dict[str, object]", value).values()
    ):
        raise RecordFormatError(source, f"field {field!r} is {value!r}, not an object of strings")
    return dict(cast("dict[str, str]", value))


type JsonValue = str | int | float | bool | list["JsonValue"] | dict[str, "JsonValue"] | None
"""A value JSON can hold (backend settings, a job's runtime fields), without pydantic's type."""
