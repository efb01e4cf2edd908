"""Typed JSON records read strictly: unknown fields refused, no coercion from strings."""

# record_type may be a generic alias (list[int]) at run time, and records hold user values:
# the isinstance checks below are the validation.
# pyright: reportUnnecessaryIsInstance=false

import functools
import json
import math
import re
import sys
from typing import TYPE_CHECKING, Any, Final, cast, is_typeddict


if TYPE_CHECKING:
    from pydantic import ConfigDict, TypeAdapter


# A plain dict (pydantic's ConfigDict is a TypedDict), so that importing this module imports no
# pydantic: it is loaded when a record is first read or dumped.
UNKNOWN_FIELDS_REFUSED: "ConfigDict" = {"extra": "forbid"}
"""Set as a record dataclass's ``__pydantic_config__`` so a misspelled key is refused."""

NON_FINITE_TEXT: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How a record writes a non-finite float (strict JSON has none), as the tracking log does."""

# A float is at most ~1.8e308: an int of 309 digits or more may be too large for one.
_LONG_INT: Final = re.compile(r"\d{309}")


@functools.cache
def type_adapter(record_type: object) -> "TypeAdapter[Any]":
    """The pydantic ``TypeAdapter`` of ``record_type``, made once."""
    from pydantic import TypeAdapter  # noqa: PLC0415 - pydantic only when a record is validated

    return TypeAdapter(cast("Any", record_type))


def _type_name(record_type: object) -> str:
    return record_type.__qualname__ if isinstance(record_type, type) else repr(record_type)


def path_step(path: str, part: object, *, attribute: bool = False) -> str:
    """``path`` one step deeper: a field's name at the top, then ``['key']``, ``[index]``, ``.field``."""
    if not path and isinstance(part, str):
        return part
    return f"{path}.{part}" if attribute else f"{path}[{part!r}]"


def where_in(path: str) -> str:
    """``path`` as a message names it (the data itself where it is ``""``)."""
    return path or "the data itself"


def describe_value(value: object) -> str:
    """``value``'s type and (the start of) its repr, for a message."""
    kind = type(value)
    return f"a {kind.__module__}.{kind.__qualname__} ({value!r:.60})"


def read_record[T](record_type: type[T], data: object) -> T:
    """Validate JSON-shaped ``data`` as ``record_type`` with strict JSON semantics.

    ``data`` goes through ``json.dumps`` and pydantic's strict JSON mode: numbers are never
    read from strings, a bool is not a number, an int is accepted for a float, tuples come from
    arrays, enums are read by value and datetimes from ISO strings. A record whose
    ``__pydantic_config__`` is ``UNKNOWN_FIELDS_REFUSED`` refuses unknown keys.

    Non-finite floats read back as ``dump_record`` writes them: where a field takes a float,
    the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` are read as those floats (the one
    exception to "no numbers from strings"); a field that also takes strings keeps the string.
    Python's ``float("nan")`` (what ``json.loads`` makes of a bare ``NaN``) is accepted too. An
    int too large for a float field (it would read as ``inf``) is refused.

    Args:
        record_type: The record's type (a dataclass, pydantic model, TypedDict (read as a
            dict), ...).
        data: The decoded JSON (e.g. ``json.loads(text)``).

    Returns:
        The validated record.

    Raises:
        pydantic.ValidationError: ``data`` does not fit (a ``ValueError``), naming each field.
        ValueError: an int in ``data`` is too large for the float field it is read into, or a
            str in it holds a lone surrogate (no JSON reader takes one), naming where.
        TypeError: ``data`` is not JSON-serialisable (naming where), or validation returned
            another type.

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
        >>> read_record(Point, {"x": "NaN"})
        Point(x=nan, tags=())
    """
    try:
        text = json.dumps(data)  # NaN and infinities as the NaN tokens pydantic's parser reads
    except (TypeError, ValueError) as error:
        reason = _non_json(data, "", set()) or str(error)
        raise TypeError(
            f"record data for {_type_name(record_type)} is not JSON: {reason}; "
            "pass decoded JSON (dicts with str keys, lists, str, int, float, bool, None), "
            "e.g. json.loads(text)"
        ) from error
    adapter = type_adapter(record_type)
    from pydantic import ValidationError  # noqa: PLC0415

    try:
        record = _validate(adapter, text)
    except ValidationError as error:  # an older pydantic refuses a long int for a float itself
        if any(d["type"] == "json_invalid" for d in error.errors()) and (
            reason := _non_json(data, "", set())
        ):  # a str pydantic's JSON parser refuses (a lone surrogate): name where it is
            raise ValueError(f"record data for {_type_name(record_type)}: {reason}") from None
        for detail in error.errors(include_url=False):
            given = detail.get("input")
            if detail["type"] == "float_type" and _too_large(given):
                path = functools.reduce(path_step, detail["loc"], "")
                raise _overflow(record_type, path, given) from None
        raise
    if _LONG_INT.search(text):
        # where the record's type holds a float, pydantic dumps the inf it made of a long int
        dumped = adapter.dump_python(record, mode="json", warnings=False)
        _refuse_overflow(record_type, json.loads(text), dumped, "")
    if (  # a TypedDict validates to a dict, and refuses isinstance
        isinstance(record_type, type)
        and not is_typeddict(record_type)
        and not isinstance(record, record_type)
    ):
        raise TypeError(
            f"validating as {record_type.__name__} returned {type(record).__name__}, not the type"
        )
    return cast("T", record)


def _non_json(value: object, path: str, open_ids: set[int]) -> str:
    """Where ``value`` stops being JSON, and why (``""`` if it is JSON)."""
    if isinstance(value, str):
        return lone_surrogate(value, path)
    if value is None or isinstance(value, int | float):
        return ""
    if not isinstance(value, list | tuple | dict):
        hint = "; convert it with .item()" if hasattr(value, "item") else ""
        return f"{where_in(path)} is {describe_value(value)}{hint}"
    if id(value) in open_ids:
        return f"{where_in(path)} contains itself"
    if isinstance(value, dict):
        children = list(cast("dict[object, object]", value).items())
    else:
        children = list(enumerate(cast("list[object] | tuple[object, ...]", value)))
    open_ids.add(id(value))
    found = ""
    for key, item in children:
        if isinstance(value, dict) and not (key is None or isinstance(key, str | int | float)):
            found = f"{where_in(path)} has the key {describe_value(key)}; JSON keys are strings"
        elif isinstance(key, str) and (bad_key := lone_surrogate(key, f"the key {key!r}")):
            found = f"{where_in(path)}: {bad_key}"
        else:
            found = _non_json(item, path_step(path, key), open_ids)
        if found:
            break
    open_ids.discard(id(value))
    return found


def lone_surrogate(text: str, path: str) -> str:
    """Why ``text`` (at ``path``) is no Unicode text JSON can hold, or ``""`` if it is."""
    if text.isascii():
        return ""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (
            f"{where_in(path)} holds the lone surrogate {text[error.start]!r}, which is no "
            "Unicode character (UTF-8 and JSON readers refuse it); store real text"
        )
    return ""


def _validate(adapter: "TypeAdapter[Any]", text: str) -> object:
    """Validate ``text``, reading ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` where a float is due."""
    from pydantic import ValidationError  # noqa: PLC0415

    holder: list[Any] | None = None  # the data, parsed once a non-finite string needs replacing
    while True:
        try:
            return adapter.validate_json(text, strict=True)
        except ValidationError as error:
            holder = [json.loads(text)] if holder is None else holder
            replaced = False
            for detail in error.errors(include_url=False):
                given = detail.get("input")
                loc = (0, *detail["loc"])
                if detail["type"] != "float_type":
                    continue
                if isinstance(given, str) and given in NON_FINITE_TEXT:
                    replaced |= _replace(holder, loc, given, NON_FINITE_TEXT[given])
                elif (
                    isinstance(given, int) and not isinstance(given, bool) and not _too_large(given)
                ):
                    # an older pydantic-core refuses a JSON int past 64 bits for a float
                    replaced |= _replace(holder, loc, given, float(given))
            if not replaced:
                raise
            text = json.dumps(holder[0])


def _replace(holder: list[Any], loc: tuple[int | str, ...], given: object, value: float) -> bool:
    """Put ``value`` for ``given`` where ``loc`` leads in ``holder``; False if it leads elsewhere."""
    parent: Any = None
    key: int | str = 0
    node: Any = holder
    for part in loc:  # a part naming no key of ``node`` is a union member's tag: not a step
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            parent, key, node = node, part, cast("dict[str, Any]", node)[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            parent, key, node = node, part, cast("list[Any]", node)[part]
    if parent is None or node != given:
        return False
    parent[key] = value
    return True


def _too_large(value: object) -> bool:
    """Whether ``value`` is an int past the largest float."""
    return (
        isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max
    )


def _overflow(record_type: object, path: str, data: int) -> ValueError:
    """The refusal of an int at ``path`` too large for the float field it is read into."""
    digits = int(data.bit_length() * math.log10(2)) + 1
    return ValueError(
        f"record data for {_type_name(record_type)}: {where_in(path)} is an int of about "
        f"{digits} digits, too large for a float (it would read as "
        f"{'-' if data < 0 else ''}inf); store a number within ±1.8e308"
    )


def _refuse_overflow(record_type: object, data: object, dumped: object, path: str) -> None:
    """Refuse an int of ``data`` that the record holds as an infinite float."""
    if isinstance(data, int) and not isinstance(data, bool):
        if isinstance(dumped, float) and math.isinf(dumped):
            raise _overflow(record_type, path, data)
    elif isinstance(data, dict) and isinstance(dumped, dict):
        dumped_items = cast("dict[object, object]", dumped)
        for key, item in cast("dict[object, object]", data).items():
            if key in dumped_items:
                _refuse_overflow(record_type, item, dumped_items[key], path_step(path, key))
    elif isinstance(data, list) and isinstance(dumped, list):
        pairs = zip(cast("list[object]", data), cast("list[object]", dumped), strict=False)
        for index, (item, dumped_item) in enumerate(pairs):
            _refuse_overflow(record_type, item, dumped_item, path_step(path, index))
